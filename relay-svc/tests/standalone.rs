//! The relay end to end in standalone mode, against the project's fake upstream: failover,
//! "busy is not broken", client errors passed through, waiting, user limits, streaming
//! (failover before the first byte, errors after it, keep-alives, disconnects), stickiness.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use poolgate_operator::AdminEndpoint;
use poolgate_select::engine::SelectorSettings;
use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::{FakeUpstream, Scripted};
use relay_svc::metrics::Metrics;
use relay_svc::proxy::{Relay, RelaySettings};
use relay_svc::standalone::{Standalone, StandaloneFile};
use serde_json::{Value, json};

const KEY: &str = "pgk-test-key-0001";
const LIMITED_KEY: &str = "pgk-test-key-0002";

struct Harness {
    upstream: FakeUpstream,
    base: String,
    http: reqwest::Client,
    relay: Arc<Relay>,
    /// The engines behind the relay: their health and usage ledger, read by the tests that wait
    /// for a request's bookkeeping to end before they check what it did not change.
    engines: Standalone,
}

/// A standalone relay over `yaml` on the fake upstream `upstream`, served on a free port, its
/// engines kept.
async fn serve(upstream: FakeUpstream, yaml: &str, settings: RelaySettings) -> Harness {
    let file = StandaloneFile::parse(yaml).expect("the pool's file parses");
    let metrics = Metrics::new();
    let engines = relay_svc::standalone::build(
        &file,
        None,
        SelectorSettings::default(),
        Default::default(),
        &metrics,
    )
    .expect("the engines start");
    let relay = Arc::new(
        Relay::new(
            engines.selection.clone(),
            engines.leases.clone(),
            settings,
            metrics,
        )
        .expect("the relay builds"),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(relay_svc::server::serve(
        relay.clone(),
        listener,
        None,
        std::future::pending(),
        Duration::from_secs(1),
    ));
    Harness {
        upstream,
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
        relay,
        engines,
    }
}

/// `accounts`: (name, platform, concurrency, extra yaml).
async fn start(accounts: &[(&str, &str, i32, &str)], settings: RelaySettings) -> Harness {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let mut yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: alice, group: default}}\n  - {{key: {LIMITED_KEY}, user: bob, group: default, user_rpm: 2}}\naccounts:\n"
    );
    for (name, platform, concurrency, extra) in accounts {
        yaml.push_str(&format!(
            "  - {{name: {name}, platform: {platform}, base_url: \"{}\", credential: cred-{name}, concurrency: {concurrency}{extra}}}\n",
            upstream.base_url
        ));
    }
    yaml.push_str("prices:\n  claude-x: {input: 3, output: 15}\n  gpt-x: {input: 2, output: 8}\n");
    serve(upstream, &yaml, settings).await
}

fn fast() -> RelaySettings {
    RelaySettings {
        max_wait: Duration::from_secs(3),
        ping_after: Duration::from_millis(300),
        ping_every: Duration::from_millis(100),
        conflict_delay: Duration::from_millis(20),
        ..RelaySettings::default()
    }
}

fn message(stream: bool) -> Value {
    json!({"model": "claude-x", "max_tokens": 16, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

fn fail(status: u16, body: &str) -> Scripted {
    Scripted::Fail {
        status,
        headers: vec![],
        body: body.to_owned(),
    }
}

impl Harness {
    async fn post(&self, path: &str, key: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.base))
            .header("x-api-key", key)
            .header("anthropic-version", "2023-06-01")
            .json(body)
            .send()
            .await
            .expect("relay answers")
    }

    async fn messages(&self, body: &Value) -> (u16, Value) {
        let response = self.post("/v1/messages", KEY, body).await;
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// The sum of the series of metric `name` (as the relay's registry renders it, the
    /// in-process selector's and admission's included) whose labels include all of `having`.
    fn metric(&self, name: &str, having: &[(&str, &str)]) -> f64 {
        self.relay
            .metrics
            .render()
            .lines()
            .filter(|line| {
                line.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                    && having
                        .iter()
                        .all(|(label, value)| line.contains(&format!("{label}=\"{value}\"")))
            })
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }

    /// Confirmations the in-process selector started, or decided against, for `suspect`.
    fn confirmations(&self, suspect: &str, result: &str) -> f64 {
        self.metric(
            "selector_confirmations_total",
            &[("suspect", suspect), ("result", result)],
        )
    }

    /// Waits until the usage ledger holds `requests` records: the last step of each request's
    /// bookkeeping (after its lease's release and any outcome report), so whatever a request
    /// would change has been changed by then.
    async fn wait_for_usage(&self, requests: u64) {
        let recorded = || async {
            let now = poolgate_core::now_ms();
            self.engines
                .operator
                .usage(now - 3_600_000, now + 3_600_000, None)
                .await
                .expect("usage readable")
                .keys
                .iter()
                .map(|key| key.requests)
                .sum::<u64>()
        };
        let waited = eventually(Duration::from_secs(5), || async {
            (recorded().await >= requests).then_some(())
        })
        .await;
        assert!(
            waited.is_ok(),
            "{requests} usage records, found {}",
            recorded().await
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_account_fails_over_to_a_sibling_and_stays_selectable() {
    let h = start(
        &[
            ("a", "anthropic", 4, ", priority: 0"),
            ("b", "anthropic", 4, ", priority: 1"),
        ],
        fast(),
    )
    .await;
    h.upstream.script(
        "cred-a",
        [fail(
            429,
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
        )],
    );
    let (status, body) = h.messages(&message(false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(h.upstream.stats("cred-a").total, 1);
    assert_eq!(h.upstream.stats("cred-b").total, 1, "served by the sibling");
    // Soft block only: `a` is ordered last in its tier but still eligible; with `b` failing
    // too, the request comes back to... nothing hard-blocked here, so both stay in plans.
    h.upstream.script(
        "cred-b",
        [fail(
            529,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#,
        )],
    );
    let (status, _) = h.messages(&message(false)).await;
    assert_eq!(
        status, 200,
        "a busy account is never excluded: the request still gets served"
    );
    let failovers = h
        .relay
        .metrics
        .failovers
        .with_label_values(&["429", "failover"])
        .get();
    assert_eq!(failovers, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_failover_budget_returns_the_last_upstream_error_as_it_came() {
    let h = start(
        &[
            ("a", "anthropic", 4, ""),
            ("b", "anthropic", 4, ""),
            ("c", "anthropic", 4, ""),
            ("d", "anthropic", 4, ""),
        ],
        fast(),
    )
    .await;
    for name in ["a", "b", "c", "d"] {
        h.upstream.script(
            &format!("cred-{name}"),
            [fail(
                500,
                &format!(
                    r#"{{"type":"error","error":{{"type":"api_error","message":"boom {name}"}}}}"#
                ),
            )],
        );
    }
    let (status, body) = h.messages(&message(false)).await;
    assert_eq!(status, 500);
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("boom ")),
        "{body}"
    );
    // Client requests only: each 500 is then confirmed by a probe of its own (another model).
    let calls = h
        .upstream
        .seen_models()
        .iter()
        .filter(|m| *m == "claude-x")
        .count();
    assert_eq!(calls, 3, "the budget is 3 upstream failures");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_error_is_returned_as_is_and_does_not_fail_over() {
    let h = start(
        &[("a", "anthropic", 4, ""), ("b", "anthropic", 4, "")],
        fast(),
    )
    .await;
    let error = r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: required"}}"#;
    h.upstream.script("cred-a", [fail(400, error)]);
    h.upstream.script("cred-b", [fail(400, error)]);
    let (status, body) = h.messages(&message(false)).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["message"], "max_tokens: required");
    let calls = h.upstream.stats("cred-a").total + h.upstream.stats("cred-b").total;
    assert_eq!(calls, 1, "not the account's fault: no failover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_billing_answer_retires_the_account_only_after_the_probe_confirms_it() {
    let h = start(
        &[
            ("a", "anthropic", 4, ", priority: 0"),
            ("b", "anthropic", 4, ", priority: 1"),
        ],
        fast(),
    )
    .await;
    // Really out of credit: the client's request and the probe both get the billing answer.
    h.upstream.set_out_of_credit("cred-a", true);
    let (status, _) = h.messages(&message(false)).await;
    assert_eq!(status, 200, "failed over to b");
    eventually(Duration::from_secs(5), || async {
        (h.upstream.stats("cred-a").total == 2).then_some(())
    })
    .await
    .expect("the probe asked again");
    for _ in 0..5 {
        let (status, _) = h.messages(&message(false)).await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        h.upstream.stats("cred-a").total,
        2,
        "retired after the probe: never selected again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_billing_answer_the_probe_does_not_confirm_keeps_the_account() {
    let h = start(
        &[
            ("a", "anthropic", 4, ", priority: 0"),
            ("b", "anthropic", 4, ", priority: 1"),
        ],
        fast(),
    )
    .await;
    // One billing answer, then the account answers normally (the probe gets a 200).
    h.upstream.script(
        "cred-a",
        [fail(
            402,
            r#"{"type":"error","error":{"type":"billing_error","message":"billing"}}"#,
        )],
    );
    let (status, _) = h.messages(&message(false)).await;
    assert_eq!(status, 200, "failed over to b");
    // The probe runs in the background (the client's answer does not wait for it).
    eventually(Duration::from_secs(5), || async {
        (h.upstream.stats("cred-a").total == 2).then_some(())
    })
    .await
    .expect("the probe asked again");
    // Once the probe (a 200) is in, `a` (priority 0) serves again (a new conversation each
    // time: the first one is bound to `b` now).
    eventually(Duration::from_secs(5), || async {
        let before = h.upstream.stats("cred-a").total;
        let fresh = json!({"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": format!("hi {}", fastrand::u64(..))}]});
        let (status, _) = h.messages(&fresh).await;
        (status == 200 && h.upstream.stats("cred-a").total > before).then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("a serves again: not retired, not blocked; a saw {:?}", h.upstream.stats("cred-a")));
    assert!(
        h.upstream.stats("cred-a").total >= 3,
        "request, probe, request"
    );
}

fn fresh_message() -> Value {
    json!({"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": format!("hi {}", fastrand::u64(..))}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_the_probe_does_not_confirm_changes_nothing_and_repeats_probe_nothing_for_a_while() {
    let h = start(
        &[
            ("a", "anthropic", 4, ", priority: 0"),
            ("b", "anthropic", 4, ", priority: 1"),
        ],
        fast(),
    )
    .await;
    let boom = || {
        fail(
            500,
            r#"{"type":"error","error":{"type":"api_error","message":"boom"}}"#,
        )
    };
    let probes = |h: &Harness| {
        h.upstream
            .seen_models()
            .iter()
            .filter(|m| *m == "claude-haiku-4-5")
            .count()
    };
    // One 500 (say a request the upstream chokes on): the probe gets a 200, `a` stays.
    h.upstream.script("cred-a", [boom()]);
    let (status, _) = h.messages(&fresh_message()).await;
    assert_eq!(status, 200, "failed over to b");
    eventually(Duration::from_secs(5), || async {
        let before = h.upstream.stats("cred-a").total;
        let (status, _) = h.messages(&fresh_message()).await;
        (status == 200 && h.upstream.stats("cred-a").total > before).then_some(())
    })
    .await
    .expect("a serves again after an unconfirmed 500");
    assert_eq!(probes(&h), 1);
    // The same again at once (a client repeating the request): no probe, no block this time.
    h.upstream.script("cred-a", [boom()]);
    let (status, _) = h.messages(&fresh_message()).await;
    assert_eq!(status, 200, "failed over to b");
    // The selector's answer to that report: quiet, nothing started. Only a started
    // confirmation sends a probe, so none can come later.
    // Bounded generously: on a loaded CI machine the report took longer than 5 s once.
    eventually(Duration::from_secs(15), || async {
        (h.confirmations("broken", "already_running") == 1.0).then_some(())
    })
    .await
    .expect("the repeated 500 was reported and found the account quiet");
    assert_eq!(
        h.confirmations("broken", "started"),
        1.0,
        "no second confirmation"
    );
    assert_eq!(probes(&h), 1, "quiet after an unconfirmed probe");
    assert!(
        h.engines
            .operator
            .blocks()
            .await
            .expect("blocks")
            .is_empty(),
        "no block"
    );
    let before = h.upstream.stats("cred-a").total;
    let (status, _) = h.messages(&fresh_message()).await;
    assert_eq!(status, 200);
    assert_eq!(
        h.upstream.stats("cred-a").total,
        before + 1,
        "a still first"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_the_probe_confirms_blocks_the_account() {
    let h = start(
        &[
            ("a", "anthropic", 4, ", priority: 0"),
            ("b", "anthropic", 4, ", priority: 1"),
        ],
        fast(),
    )
    .await;
    let boom = || {
        fail(
            500,
            r#"{"type":"error","error":{"type":"api_error","message":"boom"}}"#,
        )
    };
    // `a` really fails: the request, and the probe after it.
    h.upstream.script("cred-a", (0..20).map(|_| boom()));
    let (status, _) = h.messages(&fresh_message()).await;
    assert_eq!(status, 200, "failed over to b");
    eventually(Duration::from_secs(5), || async {
        let probes = h
            .upstream
            .seen_models()
            .iter()
            .filter(|m| *m == "claude-haiku-4-5")
            .count();
        (probes == 1).then_some(())
    })
    .await
    .expect("the probe ran");
    // The probe's verdict is written after its answer: wait for the block itself.
    eventually(Duration::from_secs(5), || async {
        let blocks = h.engines.operator.blocks().await.ok()?;
        blocks
            .iter()
            .any(|b| b.account_name == "a" && b.kind == "hard")
            .then_some(())
    })
    .await
    .expect("the confirmed 5xx hard-blocks a");
    let before = h.upstream.stats("cred-a").total;
    for _ in 0..4 {
        let (status, _) = h.messages(&fresh_message()).await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        h.upstream.stats("cred-a").total,
        before,
        "confirmed broken: hard-blocked, not asked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_never_changes_account_health() {
    let h = start(
        &[
            ("a", "anthropic", 4, ", priority: 0"),
            ("b", "anthropic", 4, ", priority: 1"),
        ],
        fast(),
    )
    .await;
    h.upstream.script(
        "cred-a",
        [
            fail(
                500,
                r#"{"type":"error","error":{"type":"api_error","message":"boom"}}"#,
            ),
            fail(
                402,
                r#"{"type":"error","error":{"type":"billing_error","message":"no"}}"#,
            ),
        ],
    );
    // Each request: `a` answers with a failure that would start a confirmation on a Messages
    // request (a 5xx, then a billing answer), and fails over to `b`, which counts the tokens.
    for _ in 0..2 {
        let response = h
            .post("/v1/messages/count_tokens", KEY, &message(false))
            .await;
        assert_eq!(response.status().as_u16(), 200, "served by b");
        let body: Value = response.json().await.expect("json");
        assert!(
            body["input_tokens"].as_u64().is_some_and(|n| n > 0),
            "the upstream's count: {body}"
        );
    }
    assert_eq!(
        (
            h.upstream.count_tokens_calls("cred-a"),
            h.upstream.count_tokens_calls("cred-b")
        ),
        (2, 2),
        "a failed both, b served both"
    );
    // The usage record is the last step of a request's bookkeeping: once both are in, any report
    // the relay would have made for these requests has been made.
    h.wait_for_usage(2).await;
    assert_eq!(
        h.metric("selector_outcomes_total", &[]),
        0.0,
        "no outcome reported, neither a's failures nor b's successes"
    );
    assert_eq!(
        h.metric("selector_confirmations_total", &[]),
        0.0,
        "no confirmation started"
    );
    assert!(
        !h.upstream
            .seen_models()
            .iter()
            .any(|m| m == "claude-haiku-4-5"),
        "no confirmation probe"
    );
    assert!(
        h.engines
            .operator
            .blocks()
            .await
            .expect("blocks")
            .is_empty(),
        "no block on either account"
    );
    for account in h
        .engines
        .operator
        .accounts(None)
        .await
        .expect("accounts readable")
    {
        assert_eq!(account.status, "active", "{}", account.name);
    }
    let (a, b) = (
        h.upstream.stats("cred-a").total,
        h.upstream.stats("cred-b").total,
    );
    let (status, _) = h.messages(&fresh_message()).await;
    assert_eq!(status, 200);
    assert_eq!(
        (
            h.upstream.stats("cred-a").total,
            h.upstream.stats("cred-b").total
        ),
        (a + 1, b),
        "a (priority 0) still serves first, and its scripted failures went to count_tokens"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crafted_model_names_and_messages_change_no_account() {
    let h = start(
        &[
            ("a", "anthropic", 4, ", priority: 0"),
            ("b", "anthropic", 4, ", priority: 1"),
        ],
        fast(),
    )
    .await;
    h.upstream.set_known_models(&["claude-x"]);
    for crafted in [
        "insufficient_quota",
        "billing_error",
        "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
        "exceeded your current quota",
    ] {
        let (status, body) = h
            .messages(&json!({"model": crafted, "max_tokens": 16, "messages": [{"role": "user", "content": crafted}]}))
            .await;
        assert_eq!(status, 404, "the upstream's answer, as it came: {body}");
        assert_eq!(body["error"]["type"], "not_found_error");
    }
    assert_eq!(
        h.upstream.stats("cred-b").total,
        0,
        "a 404 fails over only to an account that maps the model differently"
    );
    // Every account still serves.
    h.upstream.reset_stats();
    for _ in 0..4 {
        let (status, _) = h.messages(&message(false)).await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        h.upstream.stats("cred-a").total,
        4,
        "a untouched, still first"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_is_retried_on_the_same_account() {
    let h = start(
        &[
            ("a", "anthropic", 4, ""),
            ("b", "anthropic", 4, ", priority: 5"),
        ],
        fast(),
    )
    .await;
    h.upstream
        .script("cred-a", [fail(409, "{}"), fail(409, "{}")]);
    let (status, _) = h.messages(&message(false)).await;
    assert_eq!(status, 200);
    assert_eq!(
        h.upstream.stats("cred-a").total,
        3,
        "two conflicts, then success on the same account"
    );
    assert_eq!(h.upstream.stats("cred-b").total, 0);
    assert_eq!(h.relay.metrics.same_account_retries.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_clients_never_exceed_an_account_limit_and_all_get_served() {
    let mut settings = fast();
    settings.max_wait = Duration::from_secs(20);
    let h = Arc::new(
        start(
            &[("a", "anthropic", 2, ""), ("b", "anthropic", 2, "")],
            settings,
        )
        .await,
    );
    h.upstream.set_delay(Duration::from_millis(20));
    let requests: Vec<_> = (0..100)
        .map(|n| {
            let h = h.clone();
            tokio::spawn(async move { h.messages(&message(n % 3 == 0)).await.0 })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.expect("task"), 200);
    }
    for credential in ["cred-a", "cred-b"] {
        let stats = h.upstream.stats(credential);
        assert!(
            stats.peak <= 2,
            "{credential} peaked at {} concurrent requests, limit 2",
            stats.peak
        );
        assert!(stats.total > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_own_limit_is_a_429_with_retry_after_in_its_format() {
    let h = start(&[("a", "openai", 4, "")], fast()).await;
    let chat = json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]});
    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..3 {
        let response = h
            .http
            .post(format!("{}/v1/chat/completions", h.base))
            .bearer_auth(LIMITED_KEY)
            .json(&chat)
            .send()
            .await
            .expect("answer");
        statuses.push(response.status().as_u16());
        last = Some(response);
    }
    assert_eq!(statuses, vec![200, 200, 429]);
    let response = last.expect("response");
    assert!(response.headers().get("retry-after").is_some());
    assert!(response.headers().get("x-request-id").is_some());
    let body: Value = response.json().await.expect("json");
    assert_eq!(
        body["error"]["type"], "rate_limit_error",
        "OpenAI error format: {body}"
    );
}

/// Waits until the upstream holds a request on `a` (its only slot taken).
async fn holder_in_flight(h: &Harness) {
    eventually(Duration::from_secs(5), || async {
        (h.upstream.stats("cred-a").current == 1).then_some(())
    })
    .await
    .expect("the first request holds a's slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_answers_503_with_retry_after_when_the_wait_runs_out() {
    let mut settings = fast();
    settings.max_wait = Duration::from_millis(300);
    let h = Arc::new(start(&[("a", "anthropic", 1, "")], settings).await);
    h.upstream.set_delay(Duration::from_millis(1_500));
    let holder = {
        let h = h.clone();
        tokio::spawn(async move { h.messages(&message(false)).await.0 })
    };
    holder_in_flight(&h).await;
    let response = h.post("/v1/messages", KEY, &message(false)).await;
    assert_eq!(response.status().as_u16(), 503);
    assert!(response.headers().get("retry-after").is_some());
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["type"], "error", "Anthropic error format: {body}");
    assert_eq!(body["error"]["type"], "overloaded_error");
    assert_eq!(holder.await.expect("task"), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_fails_over_before_its_first_byte_and_reports_usage() {
    let h = start(
        &[
            ("a", "anthropic", 4, ", priority: 0"),
            ("b", "anthropic", 4, ", priority: 1"),
        ],
        fast(),
    )
    .await;
    h.upstream.script(
        "cred-a",
        [fail(
            529,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#,
        )],
    );
    let response = h.post("/v1/messages", KEY, &message(true)).await;
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.expect("stream");
    assert!(
        text.contains("message_start") && text.contains("message_stop"),
        "{text}"
    );
    assert!(
        !text.contains("overloaded"),
        "the 529 never reached the client"
    );
    eventually(Duration::from_secs(2), || async {
        (h.relay.metrics.spend_micros.get() > 0).then_some(())
    })
    .await
    .expect("usage read from the stream priced the request");
}

/// An upstream that starts a stream, sends one event, and drops the connection: a raw socket,
/// so the break is exact.
async fn breaking_upstream() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let event = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3}}}\n\n";
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                let chunk = format!("{:x}\r\n{event}\r\n", event.len());
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(chunk.as_bytes()).await;
                let _ = socket.flush().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                // Dropped without the terminating chunk: the stream breaks mid-way.
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_breaks_after_its_first_byte_ends_with_an_error_event() {
    let h = start(&[("b", "anthropic", 4, ", priority: 5")], fast()).await;
    let breaking = breaking_upstream().await;
    // A second relay whose first account is the breaking upstream.
    let yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: alice}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{breaking}\", credential: cred-a, concurrency: 4}}\n  - {{name: b, platform: anthropic, base_url: \"{}\", credential: cred-b, concurrency: 4, priority: 5}}\n",
        h.upstream.base_url
    );
    let (_relay, addr) = common::standalone(&yaml, fast(), Default::default())
        .await
        .expect("standalone relay starts");
    let response = h
        .http
        .post(format!("http://{addr}/v1/messages"))
        .header("x-api-key", KEY)
        .json(&message(true))
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.unwrap_or_default();
    assert!(text.contains("message_start"), "{text}");
    assert!(
        text.contains("event: error"),
        "an error event in the Anthropic format: {text}"
    );
    assert_eq!(
        h.upstream.stats("cred-b").total,
        0,
        "no failover after the first byte"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_streaming_client_gets_keep_alives_then_its_stream() {
    let h = Arc::new(start(&[("a", "anthropic", 1, "")], fast()).await);
    // Only the holder is slow: the streaming client waits for the slot, not for the upstream.
    h.upstream
        .script("cred-a", [Scripted::Delay(Duration::from_millis(900))]);
    let holder = {
        let h = h.clone();
        tokio::spawn(async move { h.messages(&message(false)).await.0 })
    };
    holder_in_flight(&h).await;
    let response = h.post("/v1/messages", KEY, &message(true)).await;
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.expect("stream");
    assert!(text.starts_with(": keep-alive"), "{text}");
    assert!(text.contains("message_stop"), "{text}");
    assert_eq!(holder.await.expect("task"), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_frees_its_slot_at_once() {
    let h = start(&[("a", "anthropic", 1, "")], fast()).await;
    h.upstream.set_chunk_delay(Duration::from_millis(500));
    let response = h.post("/v1/messages", KEY, &message(true)).await;
    let mut body = response.bytes_stream();
    let first = body.next().await.expect("first chunk").expect("bytes");
    assert!(!first.is_empty());
    assert_eq!(h.upstream.stats("cred-a").current, 1);
    drop(body);
    let dropped_at = Instant::now();
    eventually(Duration::from_secs(2), || async {
        (h.upstream.stats("cred-a").current == 0).then_some(())
    })
    .await
    .expect("the upstream call was cancelled");
    // The slot is free: with concurrency 1 a new request is served at once.
    h.upstream.set_chunk_delay(Duration::ZERO);
    let (status, _) = h.messages(&message(false)).await;
    assert_eq!(status, 200);
    assert!(dropped_at.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_conversation_of_several_turns_stays_on_one_account() {
    let h = start(
        &[
            ("a", "openai", 8, ""),
            ("b", "openai", 8, ""),
            ("c", "openai", 8, ""),
        ],
        fast(),
    )
    .await;
    // As Codex sends it: the session in the `session-id` header, a different input every turn
    // (and, on the first turn of a fork, no `prompt_cache_key`).
    for turn in 0..9 {
        let response = h
            .http
            .post(format!("{}/v1/responses", h.base))
            .header("authorization", format!("Bearer {KEY}"))
            .header("session-id", "019a2f3e-codex-conversation")
            .header("originator", "codex_exec")
            .json(&json!({"model": "gpt-x", "stream": true, "input": [{"role": "user", "content": format!("turn {turn}")}]}))
            .send()
            .await
            .expect("relay answers");
        assert_eq!(response.status().as_u16(), 200);
        let text = response.text().await.expect("stream");
        assert!(text.contains("response.completed"), "{text}");
    }
    let totals: Vec<u64> = ["a", "b", "c"]
        .iter()
        .map(|n| h.upstream.stats(&format!("cred-{n}")).total)
        .collect();
    assert!(totals.contains(&9), "every turn on one account: {totals:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_chat_stream_is_charged_like_the_same_answer_unstreamed() {
    let h = start(&[("o", "openai", 8, "")], fast()).await;
    let chat = |stream: bool, options: Option<Value>| {
        let mut body = json!({"model": "gpt-x", "stream": stream, "messages": [{"role": "user", "content": format!("hi {}", fastrand::u64(..))}]});
        if let Some(options) = options {
            body["stream_options"] = options;
        }
        let http = h.http.clone();
        let url = format!("{}/v1/chat/completions", h.base);
        async move {
            let response = http
                .post(url)
                .bearer_auth(KEY)
                .json(&body)
                .send()
                .await
                .expect("relay answers");
            assert_eq!(response.status().as_u16(), 200);
            response.text().await.expect("body")
        }
    };
    let spent = || h.relay.metrics.spend_micros.get();
    chat(false, None).await;
    let unstreamed = eventually(Duration::from_secs(3), || async {
        (spent() > 0).then(spent)
    })
    .await
    .expect("non-streaming spend recorded");
    assert_eq!(
        unstreamed, 76,
        "10 in at $2/M and 7 out at $8/M, in micro-USD"
    );
    // The client did not ask for usage: the relay asks, accounts it, and strips it.
    let text = chat(true, None).await;
    assert!(
        !text.contains("usage"),
        "the client gets the stream it asked for: {text}"
    );
    assert!(
        text.contains("Hello") && text.trim_end().ends_with("data: [DONE]"),
        "{text}"
    );
    eventually(Duration::from_secs(3), || async {
        (spent() == 2 * unstreamed).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "streamed spend equals unstreamed: {} vs {unstreamed}",
            spent() - unstreamed
        )
    });
    // A client that asks for usage gets it as the upstream sent it.
    let text = chat(true, Some(json!({"include_usage": true}))).await;
    assert!(text.contains("\"prompt_tokens\":10"), "{text}");
    let asked = h
        .upstream
        .seen_requests()
        .iter()
        .filter(|r| r.body.pointer("/stream_options/include_usage") == Some(&json!(true)))
        .count();
    assert_eq!(asked, 2, "usage asked upstream for both streams");
    // A model with no price here nor in the catalogue, and no family: charged the platform's
    // highest catalogue price (docs/DESIGN.md §6, "Prices"), never $0, and counted.
    let before = spent();
    let response = h
        .http
        .post(format!("{}/v1/chat/completions", h.base))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-unpriced", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("relay answers");
    assert_eq!(response.status().as_u16(), 200);
    let fallback = || {
        h.relay
            .metrics
            .unpriced_usage
            .with_label_values(&["fallback"])
            .get()
    };
    eventually(Duration::from_secs(3), || async {
        (fallback() == 1).then_some(())
    })
    .await
    .expect("counted as priced by the fallback");
    // The spend is counted after the lease's release, a moment after the fallback count.
    eventually(Duration::from_secs(3), || async {
        (spent() - before == 1_560).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "10 in at $30/M and 7 out at $180/M (gpt-5.5-pro's, openai's highest), in micro-USD: {}",
            spent() - before
        )
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_stick_and_models_map_and_credentials_are_replaced() {
    let h = start(
        &[
            (
                "a",
                "anthropic",
                8,
                ", model_mapping: {claude-x: claude-upstream}",
            ),
            (
                "b",
                "anthropic",
                8,
                ", model_mapping: {claude-x: claude-upstream}",
            ),
        ],
        fast(),
    )
    .await;
    let mut body = message(false);
    body["metadata"] = json!({"user_id": "user_1_account_2_session_abc"});
    for _ in 0..10 {
        let (status, _) = h.messages(&body).await;
        assert_eq!(status, 200);
    }
    let (a, b) = (
        h.upstream.stats("cred-a").total,
        h.upstream.stats("cred-b").total,
    );
    assert!(a == 10 || b == 10, "one session, one account: a={a} b={b}");
    assert!(
        h.upstream
            .seen_models()
            .iter()
            .all(|m| m == "claude-upstream")
    );
    let models: Value = h
        .http
        .get(format!("{}/v1/models", h.base))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("json");
    assert_eq!(models["data"][0]["id"], "claude-x", "{models}");
    for headers in h.upstream.seen_headers() {
        assert_ne!(
            headers.get("x-api-key").and_then(|v| v.to_str().ok()),
            Some(KEY),
            "the client key never goes upstream"
        );
        assert_eq!(
            headers
                .get("anthropic-version")
                .and_then(|v| v.to_str().ok()),
            Some("2023-06-01")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_response_id_goes_to_the_account_that_produced_it() {
    let h = start(&[("a", "openai", 8, ""), ("b", "openai", 8, "")], fast()).await;
    let first = h
        .http
        .post(format!("{}/v1/responses", h.base))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-x", "input": "hello"}))
        .send()
        .await
        .expect("answer");
    let first: Value = first.json().await.expect("json");
    let id = first["id"].as_str().expect("response id").to_owned();
    let served_by = if h.upstream.stats("cred-a").total == 1 {
        "cred-a"
    } else {
        "cred-b"
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    for n in 0..6 {
        let response = h
            .http
            .post(format!("{}/v1/responses", h.base))
            .bearer_auth(KEY)
            .json(&json!({"model": "gpt-x", "input": format!("turn {n}"), "previous_response_id": id}))
            .send()
            .await
            .expect("answer");
        assert_eq!(response.status().as_u16(), 200);
    }
    assert_eq!(
        h.upstream.stats(served_by).total,
        7,
        "every follow-up went to the producing account"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_a_4xx_in_the_clients_format() {
    let h = start(&[("a", "anthropic", 4, "")], fast()).await;
    let response = h
        .http
        .post(format!("{}/v1/messages", h.base))
        .header("x-api-key", KEY)
        .body("{not json")
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status().as_u16(), 400);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let (status, body) = h.messages(&json!({"messages": []})).await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("model"))
    );
    let response = h
        .http
        .post(format!("{}/v1/chat/completions", h.base))
        .json(&json!({"model": "x"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status().as_u16(), 401);
    let body: Value = response.json().await.expect("json");
    assert!(
        body["error"]["message"].is_string() && body.get("type").is_none(),
        "OpenAI format: {body}"
    );
    let response = h
        .http
        .get(format!("{}/v1/messages", h.base))
        .header("x-api-key", KEY)
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status().as_u16(), 405);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let huge = json!({"model": "claude-x", "messages": [{"role": "user", "content": "x".repeat(40 << 20)}]});
    let response = h.post("/v1/messages", KEY, &huge).await;
    assert_eq!(response.status().as_u16(), 413);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["type"], "error", "Anthropic format: {body}");
    assert_eq!(
        h.upstream.stats("cred-a").total,
        0,
        "nothing reached upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_429_and_529_on_every_account_leaves_all_of_them_selectable() {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let names = ["a", "b", "c"];
    let mut yaml = format!("api_keys:\n  - {{key: {KEY}, user: alice}}\naccounts:\n");
    for name in names {
        yaml.push_str(&format!("  - {{name: {name}, platform: anthropic, base_url: \"{}\", api_key: cred-{name}, concurrency: 4}}\n", upstream.base_url));
        let burst: Vec<Scripted> = (0..6)
            .map(|n| {
                fail(
                    if n % 2 == 0 { 429 } else { 529 },
                    r#"{"type":"error","error":{"type":"rate_limit_error","message":"busy"}}"#,
                )
            })
            .collect();
        upstream.script(&format!("cred-{name}"), burst);
    }
    let blocks = poolgate_core::outcome::RuntimeBlockSettings {
        busy_429: Duration::from_millis(200),
        busy_529: Duration::from_millis(300),
        ..Default::default()
    };
    let (_relay, addr) = common::standalone(&yaml, fast(), blocks)
        .await
        .expect("standalone relay starts");
    let http = reqwest::Client::new();
    // The burst: 18 scripted refusals spread over the requests; busy answers only soft-block.
    let mut statuses = Vec::new();
    for _ in 0..12 {
        let response = http
            .post(format!("http://{addr}/v1/messages"))
            .header("x-api-key", KEY)
            .json(&message(false))
            .send()
            .await
            .expect("answer");
        statuses.push(response.status().as_u16());
    }
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429 || *s == 529),
        "{statuses:?}"
    );
    // Drain whatever is left of the scripts, then let the soft blocks end.
    for _ in 0..20 {
        let _ = http
            .post(format!("http://{addr}/v1/messages"))
            .header("x-api-key", KEY)
            .json(&message(false))
            .send()
            .await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    upstream.reset_stats();
    for n in 0..30 {
        // Distinct conversations: no session stickiness, so the weighted choice spreads them.
        let body = json!({"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": format!("conversation {n}")}]});
        let response = http
            .post(format!("http://{addr}/v1/messages"))
            .header("x-api-key", KEY)
            .json(&body)
            .send()
            .await
            .expect("answer");
        assert_eq!(
            response.status().as_u16(),
            200,
            "every account is healthy again"
        );
    }
    for name in names {
        assert!(
            upstream.stats(&format!("cred-{name}")).total > 0,
            "{name} is selectable again (none retired or excluded)"
        );
    }
}

/// What Claude Code 2.1.332 opens `system` with (captured against a recording server; the three
/// hex digits follow the first user message).
const BILLING_BLOCK: &str =
    "x-anthropic-billing-header: cc_version=2.1.332.1c9; cc_entrypoint=sdk-cli;";

/// A subscription account (`sub`, tried first) and, when `with_api_key`, an API-key account of
/// the same group (`key`); `group` is extra yaml for the group `default`.
async fn subscription_pool(with_api_key: bool, group: &str) -> Harness {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    upstream.set_claude_code_only("tok-sub");
    let mut yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: alice, group: default}}\naccounts:\n  - {{name: sub, platform: anthropic, base_url: \"{}\", oauth: {{access_token: tok-sub}}, concurrency: 4, priority: 0}}\n",
        upstream.base_url
    );
    if with_api_key {
        yaml.push_str(&format!(
            "  - {{name: key, platform: anthropic, base_url: \"{}\", credential: cred-key, concurrency: 4, priority: 1}}\n",
            upstream.base_url
        ));
    }
    yaml.push_str(group);
    serve(upstream, &yaml, fast()).await
}

impl Harness {
    /// Posts `body` as these exact bytes, with `headers`.
    async fn raw_messages(&self, body: &[u8], headers: &[(&str, &str)]) -> (u16, Value) {
        let mut request = self
            .http
            .post(format!("{}/v1/messages?beta=true", self.base))
            .header("x-api-key", KEY)
            .header("content-type", "application/json")
            .body(body.to_vec());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("relay answers");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// The client requests (not the probe's) the upstream saw with `credential`.
    fn seen_with(&self, credential: &str) -> Vec<poolgate_testkit::fake_upstream::SeenRequest> {
        self.upstream
            .seen_requests()
            .into_iter()
            .filter(|r| !r.probe && r.credential() == credential)
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_codes_request_reaches_a_subscription_account_byte_for_byte() {
    let h = subscription_pool(false, "").await;
    // Claude Code's shape, written with the spacing, member order and escapes of no serializer
    // the relay would use: the upstream must get exactly these bytes.
    let body = format!(
        "{{\"model\":\"claude-sonnet-4-5\", \"messages\":[{{\"role\":\"user\",\"content\":\"Say hello.\"}},{{\"role\":\"system\",\"content\":\"# Environment \\u00e9\"}}],\n \"system\":[{{\"type\":\"text\",\"text\":\"{BILLING_BLOCK}\"}},{{\"type\":\"text\",\"text\":\"You are a Claude agent, built on Anthropic's Claude Agent SDK.\",\"cache_control\":{{\"type\":\"ephemeral\"}}}}],\"metadata\":{{\"user_id\":\"{{\\\"device_id\\\":\\\"d\\\",\\\"session_id\\\":\\\"s\\\"}}\"}},\"max_tokens\":128000 ,\"stream\":false}}"
    );
    let (status, answer) = h
        .raw_messages(
            body.as_bytes(),
            &[
                (
                    "anthropic-beta",
                    "claude-code-20250219,interleaved-thinking-2025-05-14",
                ),
                ("anthropic-version", "2023-06-01"),
                ("user-agent", "claude-cli/2.1.332 (external, sdk-cli)"),
                ("x-app", "cli"),
            ],
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let seen = h.seen_with("tok-sub");
    let last = seen.last().expect("the subscription account was asked");
    assert_eq!(
        String::from_utf8_lossy(&last.raw),
        body,
        "the body goes upstream as the client sent it"
    );
    assert_eq!(
        last.headers
            .get_all("anthropic-beta")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>(),
        ["claude-code-20250219,interleaved-thinking-2025-05-14,oauth-2025-04-20"],
        "the client's betas, and the OAuth beta it lacked, once"
    );
    assert_eq!(
        last.headers.get("user-agent").and_then(|v| v.to_str().ok()),
        Some("claude-cli/2.1.332 (external, sdk-cli)")
    );
    assert_eq!(last.query.as_deref(), Some("beta=true"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_mapping_changes_the_models_bytes_and_nothing_else() {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: alice, group: default}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{}\", credential: cred-a, concurrency: 4, model_mapping: {{claude-x: claude-mapped}}}}\n",
        upstream.base_url
    );
    let h = serve(upstream, &yaml, fast()).await;
    let body = "{ \"max_tokens\" : 16,\"model\" :\"claude-x\",\"messages\":[{\"role\":\"user\",\"content\":\"a \\\"model\\\": \\\"claude-x\\\"\"}],\"x\":{\"model\":\"claude-x\"} }";
    let (status, answer) = h.raw_messages(body.as_bytes(), &[]).await;
    assert_eq!(status, 200, "{answer}");
    let seen = h.seen_with("cred-a");
    let last = seen.last().expect("a request");
    assert_eq!(
        String::from_utf8_lossy(&last.raw),
        body.replacen("\"claude-x\",", "\"claude-mapped\",", 1),
        "the top-level model's value changes, no other byte"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clients_request_on_a_subscription_is_not_dressed_up_and_the_groups_api_key_serves_it()
 {
    let h = subscription_pool(true, "").await;
    for round in 0..3 {
        // An SDK's request: no billing block, a system prompt of its own, a non-Haiku model.
        let body = format!(
            "{{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":16,\"system\":\"Be brief.\",\"messages\":[{{\"role\":\"user\",\"content\":\"round {round}\"}}]}}"
        );
        let (status, answer) = h
            .raw_messages(body.as_bytes(), &[("anthropic-version", "2023-06-01")])
            .await;
        assert_eq!(
            status, 200,
            "round {round}: the API-key account serves it: {answer}"
        );
        let refused = h.seen_with("tok-sub");
        let last = refused
            .last()
            .expect("the subscription account was tried first");
        assert_eq!(
            String::from_utf8_lossy(&last.raw),
            body,
            "round {round}: not dressed up as Claude Code"
        );
        let betas = last
            .headers
            .get("anthropic-beta")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert_eq!(betas, "oauth-2025-04-20", "no client's beta added");
        assert_eq!(
            String::from_utf8_lossy(&h.seen_with("cred-key").last().expect("served").raw),
            body
        );
    }
    assert_eq!(
        h.seen_with("tok-sub").len(),
        3,
        "no block kept the subscription out: each request tried it (nothing was damaged)"
    );
    assert!(
        h.engines
            .operator
            .blocks()
            .await
            .expect("blocks")
            .is_empty(),
        "a third-party refusal blocks nothing"
    );
    assert_eq!(
        h.upstream.token_requests().len(),
        0,
        "and refreshes nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_only_subscriptions_another_clients_request_gets_the_upstreams_refusal() {
    use poolgate_testkit::fake_upstream::{THIRD_PARTY_MESSAGE, ThirdPartyAnswer};
    let h = subscription_pool(false, "").await;
    for (answer, message) in [
        (ThirdPartyAnswer::ExtraUsage, THIRD_PARTY_MESSAGE),
        (ThirdPartyAnswer::BareError, "Error"),
    ] {
        h.upstream.set_third_party_answer(answer);
        let mut body = fresh_message();
        body["model"] = json!("claude-opus-4-5");
        let (status, refusal) = h.messages(&body).await;
        assert_eq!(status, 400, "{refusal}");
        assert_eq!(refusal["type"], "error");
        assert_eq!(refusal["error"]["type"], "invalid_request_error");
        assert_eq!(refusal["error"]["message"], message);
    }
    // A Haiku model is served on the subscription without Claude Code's block.
    let mut haiku = fresh_message();
    haiku["model"] = json!("claude-haiku-4-5");
    let (status, answer) = h.messages(&haiku).await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        h.engines
            .operator
            .blocks()
            .await
            .expect("blocks")
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_can_keep_its_subscriptions_for_the_platforms_own_cli() {
    let h = subscription_pool(true, "groups:\n  default: {subscriptions_cli_only: true}\n").await;
    let sdk = "{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":16,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    for _ in 0..3 {
        let (status, answer) = h.raw_messages(sdk.as_bytes(), &[]).await;
        assert_eq!(status, 200, "{answer}");
    }
    assert!(
        h.seen_with("tok-sub").is_empty(),
        "no other client's request reaches the subscription"
    );
    assert_eq!(h.seen_with("cred-key").len(), 3);
    let claude_code = format!(
        "{{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":16,\"system\":[{{\"type\":\"text\",\"text\":\"{BILLING_BLOCK}\"}}],\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}"
    );
    let (status, answer) = h
        .raw_messages(
            claude_code.as_bytes(),
            &[("user-agent", "claude-cli/2.1.332 (external, sdk-cli)")],
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        h.seen_with("tok-sub").len(),
        1,
        "Claude Code's goes to the subscription"
    );
    // Without an API-key account, another client hears why.
    let h = subscription_pool(
        false,
        "groups:\n  default: {subscriptions_cli_only: true}\n",
    )
    .await;
    let (status, refusal) = h.raw_messages(sdk.as_bytes(), &[]).await;
    assert_eq!(status, 403, "{refusal}");
    assert_eq!(refusal["error"]["type"], "permission_error");
    assert!(h.seen_with("tok-sub").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_try_on_the_responses_api_gets_426_where_the_socket_is_off_and_a_plain_get_405()
{
    let off = RelaySettings {
        sockets: relay_svc::http::socket::SocketSettings {
            enabled: false,
            ..Default::default()
        },
        ..fast()
    };
    let h = start(&[("o", "openai", 2, "")], off).await;
    let upgrade = h
        .http
        .get(format!("{}/v1/responses", h.base))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .bearer_auth(KEY)
        .send()
        .await
        .expect("answer");
    assert_eq!(upgrade.status().as_u16(), 426);
    let body: Value = upgrade.json().await.expect("json error");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let plain = h
        .http
        .get(format!("{}/v1/responses", h.base))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("answer");
    assert_eq!(plain.status().as_u16(), 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chatgpt_subscription_account_serves_the_responses_api_through_the_codex_backend() {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let token = poolgate_testkit::fake_upstream::fake_chatgpt_token("acct-123");
    let yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: alice, group: default}}\naccounts:\n  - {{name: chatgpt, platform: openai, base_url: \"{}/backend-api\", chatgpt_oauth: {{access_token: \"{token}\"}}, concurrency: 4}}\n",
        upstream.base_url
    );
    let h = serve(upstream, &yaml, fast()).await;
    let post = |path: &str, body: Value| {
        h.http
            .post(format!("{}{path}", h.base))
            .bearer_auth(KEY)
            .json(&body)
            .send()
    };
    // A client that does not stream gets the backend's stream folded into one response.
    let response = post(
        "/v1/responses",
        json!({"model": "gpt-5", "input": "hi", "instructions": "Be brief."}),
    )
    .await
    .expect("relay answers");
    assert_eq!(response.status().as_u16(), 200);
    assert!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.contains("json"))
    );
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["status"], "completed", "{body}");
    assert!(
        body["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("resp_"))
    );
    // A streaming client gets the stream.
    let text = post(
        "/v1/responses",
        json!({"model": "gpt-5", "input": "hi", "stream": true}),
    )
    .await
    .expect("relay answers")
    .text()
    .await
    .expect("stream");
    assert!(text.contains("response.completed"), "{text}");
    let seen = h.upstream.seen_requests();
    assert_eq!(seen.len(), 2);
    for request in &seen {
        assert_eq!(request.path, "/backend-api/codex/responses");
        let header = |name: &str| request.headers.get(name).and_then(|v| v.to_str().ok());
        assert_eq!(header("chatgpt-account-id"), Some("acct-123"));
        assert_eq!(header("openai-beta"), None, "Codex sends the backend none");
        assert_eq!(
            header("originator"),
            None,
            "no client is named for the client"
        );
        assert!(
            header("session-id").is_some(),
            "the relay's session hash, the client naming none"
        );
        assert_eq!(request.body["store"], false);
        assert_eq!(request.body["stream"], true);
    }
    // Chat completions: these accounts cannot serve them.
    let response = post(
        "/v1/chat/completions",
        json!({"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await
    .expect("relay answers");
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(h.upstream.seen_requests().len(), 2, "never sent upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_process_admission_counts_on_the_relays_metrics() {
    let h = start(&[("a", "anthropic", 4, "")], fast()).await;
    let (status, body) = h.messages(&message(false)).await;
    assert_eq!(status, 200, "{body}");
    let text = h.relay.metrics.render();
    let granted = text
        .lines()
        .find(|l| l.starts_with("admission_decisions_total{") && l.contains("granted"))
        .unwrap_or_else(|| panic!("admission decisions on the relay's /metrics:\n{text}"));
    let count: f64 = granted
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    assert!(count >= 1.0, "{granted}");
}
