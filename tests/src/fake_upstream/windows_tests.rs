//! Unit tests of the fake upstream's usage windows, over HTTP: the headers on every answer and
//! their counting, the real 429s on an exhausted window (which `poolgate_core::classify` reads
//! as an exhausted window), the reset after the window's length, and nothing at all when unset.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use poolgate_core::classify::classify;
use poolgate_core::outcome::OutcomeClass;
use poolgate_core::windows::{Scope, Thresholds, WindowStatus, assess, read_windows};
use serde_json::{Value, json};

use super::{
    FakeUpstream, ModelFamily, ModelWindow, Scripted, Window, WindowBudgets, WindowUnit,
    fake_chatgpt_token,
};

struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn number(&self, name: &str) -> f64 {
        self.header(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name}: a number, got {:?}", self.header(name)))
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    fn rate_limit_headers(&self) -> Vec<String> {
        self.headers
            .keys()
            .map(|k| k.as_str().to_owned())
            .filter(|k| {
                k.starts_with("anthropic-ratelimit")
                    || k.starts_with("x-codex")
                    || k.starts_with("x-ratelimit")
                    || k == "retry-after"
            })
            .collect()
    }
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.expect("the fake answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.bytes().await.expect("a whole body").to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

fn http() -> reqwest::Client {
    // reqwest is built without a bundled TLS provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

async fn messages(fake: &FakeUpstream, credential: &str, body: &Value) -> Answer {
    send(
        http()
            .post(format!("{}/v1/messages", fake.base_url))
            .header("x-api-key", credential)
            .json(body),
    )
    .await
}

async fn chat(fake: &FakeUpstream, credential: &str) -> Answer {
    send(
        http()
            .post(format!("{}/v1/chat/completions", fake.base_url))
            .bearer_auth(credential)
            .json(&json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]})),
    )
    .await
}

async fn codex(fake: &FakeUpstream, token: &str, account: &str) -> Answer {
    send(
        http()
            .post(format!("{}/backend-api/codex/responses", fake.base_url))
            .bearer_auth(token)
            .header("chatgpt-account-id", account)
            .header("openai-beta", "responses=experimental")
            .header("originator", "codex_cli_rs")
            .header("session_id", "s-1")
            .json(&json!({"model": "gpt-5", "instructions": "x", "input": [], "store": false, "stream": true})),
    )
    .await
}

fn client(stream: bool) -> Value {
    json!({"model": "claude-x", "max_tokens": 8, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

fn probe() -> Value {
    json!({"model": "claude-haiku-4-5", "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]})
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs_f64()
}

fn now_ms() -> i64 {
    (now_s() * 1000.0) as i64
}

fn budgets(five_hour: Option<Window>, weekly: Option<Window>) -> WindowBudgets {
    WindowBudgets {
        five_hour,
        weekly,
        ..WindowBudgets::default()
    }
}

fn minutes(n: u64) -> Duration {
    Duration::from_secs(60 * n)
}

#[tokio::test]
async fn a_credential_without_windows_gets_no_rate_limit_headers_and_no_refusals() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    // Another credential's windows, exhausted, change nothing for this one.
    fake.set_windows(
        "windowed",
        WindowBudgets {
            per_minute: Some(Window::new(minutes(1), 0)),
            ..budgets(Some(Window::new(minutes(5), 0)), None)
        },
    );
    for _ in 0..5 {
        for answer in [
            messages(&fake, "plain", &client(false)).await,
            messages(&fake, "plain", &client(true)).await,
            messages(&fake, "plain", &probe()).await,
            chat(&fake, "plain").await,
        ] {
            assert_eq!(answer.status, 200);
            assert_eq!(answer.rate_limit_headers(), Vec::<String>::new());
        }
    }
    let token = fake_chatgpt_token("acct-1");
    let answer = codex(&fake, &token, "acct-1").await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.rate_limit_headers(), Vec::<String>::new());
    assert_eq!(
        messages(&fake, "windowed", &client(false)).await.status,
        429
    );
    fake.clear_windows("windowed");
    let answer = messages(&fake, "windowed", &client(false)).await;
    assert_eq!(answer.status, 200, "cleared");
    assert_eq!(answer.rate_limit_headers(), Vec::<String>::new());
}

#[tokio::test]
async fn anthropic_answers_carry_the_unified_headers_and_count_what_is_served() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    fake.set_windows(
        "k",
        budgets(
            Some(Window::new(minutes(5), 5)),
            Some(Window::new(minutes(70), 10)),
        ),
    );
    let started = now_s();
    let first = messages(&fake, "k", &client(false)).await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first.number("anthropic-ratelimit-unified-5h-utilization"),
        0.2
    );
    assert_eq!(
        first.number("anthropic-ratelimit-unified-7d-utilization"),
        0.1
    );
    assert_eq!(
        first.header("anthropic-ratelimit-unified-status"),
        Some("allowed")
    );
    assert_eq!(
        first.header("anthropic-ratelimit-unified-5h-status"),
        Some("allowed")
    );
    assert_eq!(
        first.header("anthropic-ratelimit-unified-7d-status"),
        Some("allowed")
    );
    assert_eq!(
        first.header("anthropic-ratelimit-unified-representative-claim"),
        Some("five_hour")
    );
    let reset_5h = first.number("anthropic-ratelimit-unified-5h-reset");
    assert!(
        (started + 300.0..=started + 302.0).contains(&reset_5h),
        "fixed from first use, in epoch seconds: {reset_5h} (started {started})"
    );
    let reset_7d = first.number("anthropic-ratelimit-unified-7d-reset");
    assert!((started + 4_200.0..=started + 4_202.0).contains(&reset_7d));
    assert_eq!(first.number("anthropic-ratelimit-unified-reset"), reset_5h);
    assert_eq!(first.header("anthropic-ratelimit-requests-limit"), None);

    let streamed = messages(&fake, "k", &client(true)).await;
    assert_eq!(streamed.status, 200);
    assert!(String::from_utf8_lossy(&streamed.body).contains("message_stop"));
    assert_eq!(
        streamed.number("anthropic-ratelimit-unified-5h-utilization"),
        0.4
    );
    let probed = messages(&fake, "k", &probe()).await;
    assert_eq!(
        probed.number("anthropic-ratelimit-unified-5h-utilization"),
        0.6,
        "the probe's answer counts and carries the headers"
    );
    fake.script_clients(
        "k",
        [Scripted::Fail {
            status: 500,
            headers: vec![],
            body: "{}".into(),
        }],
    );
    let failed = messages(&fake, "k", &client(false)).await;
    assert_eq!(failed.status, 500);
    assert_eq!(
        failed.number("anthropic-ratelimit-unified-5h-utilization"),
        0.6,
        "an error answer carries the headers and counts nothing"
    );
    assert_eq!(
        failed.number("anthropic-ratelimit-unified-5h-reset"),
        reset_5h,
        "the window does not move"
    );
    let fourth = messages(&fake, "k", &client(false)).await;
    assert_eq!(
        fourth.number("anthropic-ratelimit-unified-5h-utilization"),
        0.8
    );
    assert_eq!(
        fourth.header("anthropic-ratelimit-unified-5h-status"),
        Some("allowed_warning"),
        "from 80 %"
    );
    assert_eq!(
        fourth.header("anthropic-ratelimit-unified-status"),
        Some("allowed_warning")
    );
    assert_eq!(
        fourth.header("anthropic-ratelimit-unified-7d-status"),
        Some("allowed")
    );
}

#[tokio::test]
async fn an_exhausted_anthropic_window_is_refused_with_the_claims_reset_and_classifies_as_exhausted()
 {
    let fake = FakeUpstream::start().await.expect("fake starts");
    fake.set_windows(
        "k",
        budgets(
            Some(Window::new(minutes(5), 10)),
            Some(Window::new(minutes(60), 2)),
        ),
    );
    for _ in 0..2 {
        assert_eq!(messages(&fake, "k", &client(false)).await.status, 200);
    }
    let refused = messages(&fake, "k", &client(true)).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.json()["error"]["type"],
        json!("rate_limit_error"),
        "{}",
        refused.json()
    );
    assert_eq!(
        refused.header("anthropic-ratelimit-unified-status"),
        Some("rejected")
    );
    assert_eq!(
        refused.header("anthropic-ratelimit-unified-7d-status"),
        Some("rejected")
    );
    assert_eq!(
        refused.header("anthropic-ratelimit-unified-5h-status"),
        Some("allowed")
    );
    assert_eq!(
        refused.header("anthropic-ratelimit-unified-representative-claim"),
        Some("seven_day"),
        "the binding window"
    );
    let reset = refused.number("anthropic-ratelimit-unified-7d-reset");
    assert_eq!(refused.number("anthropic-ratelimit-unified-reset"), reset);
    let retry_after = refused.number("retry-after");
    assert!((3_599.0..=3_601.0).contains(&retry_after), "{retry_after}");

    let now = now_ms();
    let classified = classify(429, &refused.headers, &refused.body, now, 0);
    assert_eq!(classified.class, OutcomeClass::WindowExhausted);
    assert_eq!(classified.reset_at_ms, Some(reset as i64 * 1000));
    assert_eq!(
        fake.stats("k").total,
        3,
        "the refused request reached the fake"
    );
    // The probe is refused alike: the account really is out.
    assert_eq!(messages(&fake, "k", &probe()).await.status, 429);
}

#[tokio::test]
async fn an_exhausted_chatgpt_window_is_refused_with_usage_limit_reached() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let token = fake_chatgpt_token("acct-1");
    fake.set_windows(
        &token,
        budgets(
            Some(Window::new(minutes(5), 2)),
            Some(Window::new(minutes(120), 8)),
        ),
    );
    let first = codex(&fake, &token, "acct-1").await;
    assert_eq!(first.status, 200);
    assert_eq!(first.number("x-codex-primary-used-percent"), 50.0);
    assert_eq!(first.number("x-codex-secondary-used-percent"), 12.5);
    assert_eq!(first.number("x-codex-primary-window-minutes"), 5.0);
    assert_eq!(first.number("x-codex-secondary-window-minutes"), 120.0);
    let after = first.number("x-codex-primary-reset-after-seconds");
    assert!((299.0..=300.0).contains(&after), "{after}");
    let at = first.number("x-codex-primary-reset-at");
    assert!((now_s() + 298.0..=now_s() + 301.0).contains(&at), "{at}");
    assert!(first.header("anthropic-ratelimit-unified-status").is_none());

    let bad = send(
        http()
            .post(format!("{}/backend-api/codex/responses", fake.base_url))
            .bearer_auth(&token)
            .json(&json!({})),
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        bad.number("x-codex-primary-used-percent"),
        50.0,
        "the backend's 400 carries the headers, counting nothing"
    );

    assert_eq!(codex(&fake, &token, "acct-1").await.status, 200);
    let refused = codex(&fake, &token, "acct-1").await;
    assert_eq!(refused.status, 429);
    let body = refused.json();
    assert_eq!(
        body["error"]["type"],
        json!("usage_limit_reached"),
        "{body}"
    );
    assert_eq!(body["error"]["resets_at"], json!(at as i64));
    assert!(
        body["error"]["resets_in_seconds"].as_i64().is_some(),
        "{body}"
    );
    assert_eq!(refused.number("x-codex-primary-used-percent"), 100.0);
    assert_eq!(refused.number("x-codex-secondary-used-percent"), 25.0);

    let now = now_ms();
    let classified = classify(429, &refused.headers, &refused.body, now, 0);
    assert_eq!(classified.class, OutcomeClass::WindowExhausted);
    let reset = classified.reset_at_ms.expect("a reset");
    assert!(
        (reset - at as i64 * 1000).abs() <= 2_000,
        "{reset} against {at}"
    );
    // The body alone says so too (no headers).
    let classified = classify(429, &HeaderMap::new(), &refused.body, now, 0);
    assert_eq!(classified.class, OutcomeClass::WindowExhausted);
    assert_eq!(classified.reset_at_ms, Some(at as i64 * 1000));
}

#[tokio::test]
async fn a_window_resets_after_its_length() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    fake.set_windows(
        "k",
        budgets(Some(Window::new(Duration::from_secs(1), 2)), None),
    );
    let first = messages(&fake, "k", &client(false)).await;
    assert_eq!(first.status, 200);
    let reset = first.number("anthropic-ratelimit-unified-5h-reset");
    assert_eq!(messages(&fake, "k", &client(false)).await.status, 200);
    let refused = messages(&fake, "k", &client(false)).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.number("anthropic-ratelimit-unified-5h-reset"),
        reset
    );

    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let served = loop {
        let answer = messages(&fake, "k", &client(false)).await;
        if answer.status == 200 {
            break answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still refused after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        now_s() + 1.0 >= reset,
        "served again only once the window ended"
    );
    assert_eq!(
        served.number("anthropic-ratelimit-unified-5h-utilization"),
        0.5,
        "a new window, this request its first use"
    );
    assert!(served.number("anthropic-ratelimit-unified-5h-reset") > reset);
}

#[tokio::test]
async fn an_anchored_weekly_window_resets_on_its_schedule() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    // Whole ms, as the fake keeps it.
    let anchor = UNIX_EPOCH + Duration::from_millis((now_ms() - 10_300) as u64);
    fake.set_windows(
        "k",
        WindowBudgets {
            weekly_anchor: Some(anchor),
            ..budgets(None, Some(Window::new(Duration::from_secs(4), 1)))
        },
    );
    let anchor_s = anchor
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs_f64();
    let first = messages(&fake, "k", &client(false)).await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first.number("anthropic-ratelimit-unified-7d-reset"),
        (anchor_s + 12.0).ceil(),
        "the period the schedule puts now in, not one from first use"
    );
    assert_eq!(
        first.header("anthropic-ratelimit-unified-representative-claim"),
        Some("seven_day")
    );
    assert!(
        first
            .header("anthropic-ratelimit-unified-5h-reset")
            .is_none()
    );
}

#[tokio::test]
async fn a_token_budget_counts_the_answers_tokens() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    fake.set_windows(
        "k",
        WindowBudgets {
            unit: WindowUnit::Tokens,
            ..budgets(Some(Window::new(minutes(5), 20)), None)
        },
    );
    let first = messages(&fake, "k", &client(false)).await;
    let usage = &first.json()["usage"];
    let tokens =
        usage["input_tokens"].as_u64().unwrap_or(0) + usage["output_tokens"].as_u64().unwrap_or(0);
    assert_eq!(
        first.number("anthropic-ratelimit-unified-5h-utilization"),
        tokens as f64 / 20.0
    );
    let second = messages(&fake, "k", &client(false)).await;
    assert_eq!(second.status, 200, "under the budget when it started");
    assert_eq!(
        second.number("anthropic-ratelimit-unified-5h-utilization"),
        1.0
    );
    assert_eq!(messages(&fake, "k", &client(false)).await.status, 429);
}

#[tokio::test]
async fn a_per_minute_limit_reports_and_refuses_as_busy_not_exhausted() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let per_minute = WindowBudgets {
        per_minute: Some(Window::new(minutes(1), 2)),
        ..WindowBudgets::default()
    };
    fake.set_windows("a", per_minute.clone());
    fake.set_windows("o", per_minute);
    let first = messages(&fake, "a", &client(false)).await;
    assert_eq!(
        first.header("anthropic-ratelimit-requests-limit"),
        Some("2")
    );
    assert_eq!(
        first.header("anthropic-ratelimit-requests-remaining"),
        Some("1")
    );
    let reset = first
        .header("anthropic-ratelimit-requests-reset")
        .expect("an RFC 3339 reset");
    assert!(reset.ends_with('Z') && reset.len() == 20, "{reset}");
    assert!(first.header("anthropic-ratelimit-unified-status").is_none());
    let second = messages(&fake, "a", &client(false)).await;
    assert_eq!(
        second.header("anthropic-ratelimit-requests-remaining"),
        Some("0")
    );
    let refused = messages(&fake, "a", &client(false)).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["error"]["type"], json!("rate_limit_error"));
    assert!(refused.number("retry-after") >= 1.0);
    let classified = classify(429, &refused.headers, &refused.body, now_ms(), 0);
    assert_eq!(classified.class, OutcomeClass::Busy);

    let first = chat(&fake, "o").await;
    assert_eq!(first.header("x-ratelimit-limit-requests"), Some("2"));
    assert_eq!(first.header("x-ratelimit-remaining-requests"), Some("1"));
    let reset = first.header("x-ratelimit-reset-requests").expect("a reset");
    assert!(reset.ends_with('s'), "a Go duration: {reset}");
    assert!(first.header("x-codex-primary-used-percent").is_none());
    chat(&fake, "o").await;
    let refused = chat(&fake, "o").await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.json()["error"]["code"],
        json!("rate_limit_exceeded")
    );
    let classified = classify(429, &refused.headers, &refused.body, now_ms(), 0);
    assert_eq!(classified.class, OutcomeClass::Busy);
}

#[tokio::test]
async fn the_control_api_sets_and_clears_windows() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let control = |body: Value| {
        http()
            .post(format!("{}/_mock/windows", fake.base_url))
            .json(&body)
    };
    let set = send(control(
        json!({"credential": "k", "five_hour": {"seconds": 60, "capacity": 1}}),
    ))
    .await;
    assert_eq!(set.status, 200);
    assert_eq!(set.json(), json!({"windows": true}));
    assert_eq!(messages(&fake, "k", &client(false)).await.status, 200);
    assert_eq!(messages(&fake, "k", &client(false)).await.status, 429);
    let bad = send(control(
        json!({"credential": "k", "weekly": {"seconds": -1, "capacity": 1}}),
    ))
    .await;
    assert_eq!(bad.status, 400);
    assert!(String::from_utf8_lossy(&bad.body).starts_with("weekly.seconds"));
    assert_eq!(
        messages(&fake, "k", &client(false)).await.status,
        429,
        "a bad request changes nothing"
    );
    let cleared = send(control(json!({"credential": "k"}))).await;
    assert_eq!(cleared.json(), json!({"windows": false}));
    let answer = messages(&fake, "k", &client(false)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.rate_limit_headers(), Vec::<String>::new());
}

fn with_model_limit(family: ModelFamily, capacity: u64) -> WindowBudgets {
    WindowBudgets {
        models: vec![ModelWindow {
            family,
            window: Window::new(minutes(7 * 24 * 60), capacity),
        }],
        ..budgets(
            Some(Window::new(minutes(300), 100)),
            Some(Window::new(minutes(7 * 24 * 60), 1_000)),
        )
    }
}

fn model(name: &str) -> Value {
    json!({"model": name, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn a_used_up_opus_limit_refuses_opus_only_with_the_scoped_claim() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    fake.set_windows("k", with_model_limit(ModelFamily::Opus, 2));
    let opus = model("claude-opus-4-5-20251101");
    for _ in 0..2 {
        let served = messages(&fake, "k", &opus).await;
        assert_eq!(served.status, 200);
        // Opus has no header family of its own: only the account's.
        assert!(
            served
                .rate_limit_headers()
                .iter()
                .all(|h| !h.contains("opus")),
            "{:?}",
            served.rate_limit_headers()
        );
    }
    let refused = messages(&fake, "k", &opus).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("anthropic-ratelimit-unified-status"),
        Some("rejected")
    );
    assert_eq!(
        refused.header("anthropic-ratelimit-unified-representative-claim"),
        Some("seven_day_opus")
    );
    assert_eq!(
        refused.header("anthropic-ratelimit-unified-5h-status"),
        Some("allowed")
    );
    assert_eq!(
        refused.header("anthropic-ratelimit-unified-7d-status"),
        Some("allowed")
    );
    let reset = refused.number("anthropic-ratelimit-unified-reset");
    assert!(
        (now_s() + 7.0 * 86_400.0 - 5.0..=now_s() + 7.0 * 86_400.0 + 1.0).contains(&reset),
        "the Opus limit's own reset: {reset}"
    );
    let classified = classify(429, &refused.headers, &refused.body, now_ms(), 60_000);
    assert!(classified.is_model_limit(), "{classified:?}");
    let readings = read_windows(&refused.headers, now_ms());
    let assessment = assess(&readings, now_ms(), Thresholds::default());
    assert!(
        assessment
            .blocked_for_model("claude-opus-4-5-20251101")
            .is_some()
    );
    assert_eq!(assessment.exhausted_until_ms, None);
    // Every other model is served, and counts nowhere in the Opus limit.
    for _ in 0..3 {
        assert_eq!(
            messages(&fake, "k", &model("claude-sonnet-4-5-20250929"))
                .await
                .status,
            200
        );
    }
    assert_eq!(messages(&fake, "k", &opus).await.status, 429);
}

#[tokio::test]
async fn fable_answers_carry_the_7d_oi_bucket_and_a_used_up_one_refuses_fable_only() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    fake.set_windows("k", with_model_limit(ModelFamily::Fable, 2));
    let fable = model("claude-fable-5-1");
    let first = messages(&fake, "k", &fable).await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first.number("anthropic-ratelimit-unified-7d_oi-utilization"),
        0.5
    );
    assert_eq!(
        first.header("anthropic-ratelimit-unified-7d_oi-status"),
        Some("allowed")
    );
    let sonnet = messages(&fake, "k", &model("claude-sonnet-4-6")).await;
    assert_eq!(
        sonnet.header("anthropic-ratelimit-unified-7d_oi-status"),
        None,
        "the bucket shows on Fable answers only"
    );
    assert_eq!(messages(&fake, "k", &fable).await.status, 200);
    let refused = messages(&fake, "k", &fable).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("anthropic-ratelimit-unified-7d_oi-status"),
        Some("rejected")
    );
    assert_eq!(
        refused.header("anthropic-ratelimit-unified-representative-claim"),
        Some("seven_day_overage_included")
    );
    let classified = classify(429, &refused.headers, &refused.body, now_ms(), 60_000);
    assert!(classified.is_model_limit(), "{classified:?}");
    let readings = read_windows(&refused.headers, now_ms());
    assert!(readings.iter().any(|r| r.scope == Scope::Models("fable".into())
        && r.status == WindowStatus::Rejected));
    assert_eq!(
        messages(&fake, "k", &model("claude-opus-4-6")).await.status,
        200
    );
}

#[tokio::test]
async fn a_used_up_codex_named_limit_refuses_its_models_with_the_active_limit() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let family = ModelFamily::Codex {
        header: "bengalfox".into(),
        name: "GPT-5.3-Codex-Spark".into(),
    };
    fake.set_windows("k", with_model_limit(family, 1));
    let spark = || {
        http()
            .post(format!("{}/v1/chat/completions", fake.base_url))
            .bearer_auth("k")
            .json(&json!({"model": "gpt-5.3-codex-spark", "messages": [{"role": "user", "content": "hi"}]}))
    };
    let served = send(spark()).await;
    assert_eq!(served.status, 200);
    assert_eq!(
        served.number("x-codex-bengalfox-primary-used-percent"),
        100.0
    );
    assert_eq!(
        served.header("x-codex-bengalfox-limit-name"),
        Some("GPT-5.3-Codex-Spark")
    );
    let refused = send(spark()).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("x-codex-active-limit"),
        Some("codex_bengalfox")
    );
    assert_eq!(
        refused.json()["error"]["type"],
        json!("usage_limit_reached")
    );
    assert!(refused.number("x-codex-primary-used-percent") < 100.0);
    let classified = classify(429, &refused.headers, &refused.body, now_ms(), 60_000);
    assert!(classified.is_model_limit(), "{classified:?}");
    let readings = read_windows(&refused.headers, now_ms());
    assert!(
        readings
            .iter()
            .any(|r| r.scope == Scope::Models("gpt-5.3-codex-spark".into()))
    );
    // Another model (`chat` asks for `gpt-x`) is served.
    assert_eq!(chat(&fake, "k").await.status, 200);
}

#[test]
fn model_limits_parse_from_the_control_form_and_a_bad_one_is_named() {
    let budgets = super::windows::parse_budgets(&json!({"models": [
        {"family": "opus", "capacity": 3},
        {"family": "codex", "header": "bengalfox", "name": "GPT-5.3-Codex-Spark", "seconds": 60, "capacity": 1}
    ]}))
    .expect("parses");
    assert_eq!(
        budgets.models,
        vec![
            ModelWindow {
                family: ModelFamily::Opus,
                window: Window::new(minutes(7 * 24 * 60), 3),
            },
            ModelWindow {
                family: ModelFamily::Codex {
                    header: "bengalfox".into(),
                    name: "GPT-5.3-Codex-Spark".into(),
                },
                window: Window::new(minutes(1), 1),
            },
        ]
    );
    let error =
        super::windows::parse_budgets(&json!({"models": [{"family": "haiku", "capacity": 1}]}))
            .expect_err("unknown family");
    assert!(error.starts_with("models[0].family"), "{error}");
    let error =
        super::windows::parse_budgets(&json!({"models": [{"family": "codex", "capacity": 1}]}))
            .expect_err("no header");
    assert!(error.starts_with("models[0].header"), "{error}");
}
