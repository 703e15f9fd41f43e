//! One behaviour suite, two modes: every case runs against a standalone relay (everything in
//! this process, accounts from YAML) and against a distributed one (selector and admission over
//! gRPC, Postgres and Redis), on the same fake upstream. What a client sees must not depend on
//! how the relay is deployed: selection order, busy ≠ broken, failover, stickiness, `/v1/models`,
//! usage windows read from every answer.

use crate::common;

use std::time::Duration;

use poolgate_core::account::Platform;
use poolgate_testkit::fake_upstream::{
    FakeUpstream, Scripted, WARNING_AT, Window, WindowBudgets, WindowUnit,
};
use relay_svc::proxy::RelaySettings;
use serde_json::{Value, json};

/// One account of a test pool: credential `cred-<name>`, group `default`.
#[derive(Clone)]
struct Spec {
    name: &'static str,
    platform: Platform,
    concurrency: i32,
    priority: i32,
    mapping: Option<(&'static str, &'static str)>,
    /// Allowed models (empty: any).
    models: &'static [&'static str],
}

fn anthropic(name: &'static str, priority: i32) -> Spec {
    Spec {
        name,
        platform: Platform::Anthropic,
        concurrency: 8,
        priority,
        mapping: None,
        models: &[],
    }
}

/// A relay in front of a pool of `Spec`s, whichever way it is deployed.
struct Pool {
    upstream: FakeUpstream,
    base: String,
    key: String,
    http: reqwest::Client,
    /// What keeps the deployment running (servers, databases).
    _running: Box<dyn std::any::Any + Send>,
}

fn settings() -> RelaySettings {
    RelaySettings {
        max_wait: Duration::from_secs(3),
        conflict_delay: Duration::from_millis(20),
        ..RelaySettings::default()
    }
}

async fn standalone(specs: &[Spec]) -> Pool {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let key = "pgk-behaviour-key-0001";
    let mut yaml =
        format!("api_keys:\n  - {{key: {key}, user: alice, group: default}}\naccounts:\n");
    for spec in specs {
        let mut mapping = spec
            .mapping
            .map(|(from, to)| format!(", model_mapping: {{{from}: {to}}}"))
            .unwrap_or_default();
        if !spec.models.is_empty() {
            mapping.push_str(&format!(", models: [{}]", spec.models.join(", ")));
        }
        yaml.push_str(&format!(
            "  - {{name: {}, platform: {}, base_url: \"{}\", credential: cred-{}, concurrency: {}, priority: {}{mapping}}}\n",
            spec.name,
            spec.platform.as_str(),
            upstream.base_url,
            spec.name,
            spec.concurrency,
            spec.priority,
        ));
    }
    let (relay, addr) = common::standalone(&yaml, settings(), Default::default())
        .await
        .expect("standalone relay starts");
    Pool {
        upstream,
        base: format!("http://{addr}"),
        key: key.to_owned(),
        http: reqwest::Client::new(),
        _running: Box::new(relay),
    }
}

async fn distributed(specs: &[Spec]) -> Pool {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let backends = common::backends().await.expect("backends start");
    for spec in specs {
        let mut account = common::account(
            spec.name,
            &upstream.base_url,
            spec.concurrency,
            spec.priority,
        );
        account.platform = spec.platform;
        if let Some((from, to)) = spec.mapping {
            account.model_mapping.insert(from.into(), to.into());
        }
        account.allowed_models = spec.models.iter().map(|m| m.to_string()).collect();
        backends
            .store
            .upsert_account(&account)
            .await
            .expect("account");
    }
    let (_, key) = backends
        .store
        .create_api_key("behaviour", "alice", "default", 0)
        .await
        .expect("key");
    let (selector, selector_addr) = common::selector(&backends).await.expect("selector starts");
    let (admission, admission_addr) = common::admission(&backends.redis.url(), Default::default())
        .await
        .expect("admission starts");
    let addr = common::relay(
        vec![format!("http://{selector_addr}")],
        vec![format!("http://{admission_addr}")],
        settings(),
    )
    .await
    .expect("relay starts");
    Pool {
        upstream,
        base: format!("http://{addr}"),
        key: key.expose().to_owned(),
        http: reqwest::Client::new(),
        _running: Box::new((backends, selector, admission)),
    }
}

fn message() -> Value {
    json!({"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
}

fn fail(status: u16, error_type: &str) -> Scripted {
    Scripted::Fail {
        status,
        headers: vec![],
        body: format!(r#"{{"type":"error","error":{{"type":"{error_type}","message":"m"}}}}"#),
    }
}

impl Pool {
    async fn messages(&self, body: &Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}/v1/messages", self.base))
            .header("x-api-key", &self.key)
            .header("anthropic-version", "2023-06-01")
            .json(body)
            .send()
            .await
            .expect("relay answers");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn models(&self) -> Vec<String> {
        let answer: Value = self
            .http
            .get(format!("{}/v1/models", self.base))
            .header("x-api-key", &self.key)
            .header("anthropic-version", "2023-06-01")
            .send()
            .await
            .expect("models")
            .json()
            .await
            .expect("json");
        let mut ids: Vec<String> = answer["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["id"].as_str().map(str::to_owned))
            .collect();
        ids.sort();
        ids
    }

    fn served(&self, name: &str) -> u64 {
        self.upstream.stats(&format!("cred-{name}")).total
    }
}

async fn the_lower_priority_tier_serves_first(pool: Pool) {
    for _ in 0..6 {
        let (status, body) = pool.messages(&message()).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(pool.served("first"), 6, "every request to the first tier");
    assert_eq!(pool.served("second"), 0);
}

async fn a_busy_account_fails_over_and_stays_selectable(pool: Pool) {
    pool.upstream
        .script("cred-first", [fail(429, "rate_limit_error")]);
    let (status, body) = pool.messages(&message()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(pool.served("first"), 1);
    assert_eq!(pool.served("second"), 1, "the sibling served it");
    // Busy is not broken: with the sibling busy too, the soft-blocked account still serves.
    pool.upstream
        .script("cred-second", [fail(529, "overloaded_error")]);
    pool.upstream.reset_stats();
    for _ in 0..3 {
        let (status, body) = pool.messages(&message()).await;
        assert_eq!(status, 200, "{body}");
    }
    assert!(
        pool.served("first") >= 1,
        "the busy account stayed selectable"
    );
}

async fn an_unauthorized_account_is_left_for_its_sibling(pool: Pool) {
    pool.upstream.script(
        "cred-first",
        [
            fail(401, "authentication_error"),
            fail(401, "authentication_error"),
        ],
    );
    let (status, body) = pool.messages(&message()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(pool.served("second"), 1, "failed over");
    // The client's 401 blocks nothing by itself: the selector's probe is refused too (the
    // second scripted 401), and only then is the account blocked.
    let probed = tokio::time::timeout(Duration::from_secs(10), async {
        while pool.upstream.probe_count("cred-first") == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(probed.is_ok(), "the selector probed the refused key");
    // The verdict is written right after the probe's answer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    pool.upstream.reset_stats();
    for _ in 0..4 {
        let (status, _) = pool.messages(&message()).await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        pool.served("first"),
        0,
        "a hard-blocked account gets no requests"
    );
    assert_eq!(pool.served("second"), 4);
}

async fn a_session_stays_on_one_account(pool: Pool) {
    let mut body = message();
    body["metadata"] = json!({"user_id": "user_1_account_2_session_behaviour"});
    for _ in 0..8 {
        let (status, _) = pool.messages(&body).await;
        assert_eq!(status, 200);
    }
    let (a, b) = (pool.served("first"), pool.served("second"));
    assert!(a == 8 || b == 8, "one session, one account: {a} and {b}");
}

async fn models_list_what_the_group_serves(pool: Pool) {
    assert_eq!(
        pool.models().await,
        vec!["claude-x".to_owned(), "claude-y".to_owned()]
    );
    let (status, _) = pool
        .messages(&json!({"model": "claude-y", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        pool.served("second"),
        1,
        "only the second account allows claude-y"
    );
    assert!(
        pool.upstream
            .seen_models()
            .iter()
            .all(|m| m == "claude-upstream-x" || m == "claude-upstream-y"),
        "mapped upstream: {:?}",
        pool.upstream.seen_models()
    );
}

/// The weekly window of the nearly used account, in requests: its answers say
/// `allowed_warning` from the `WARNED`th on, and it refuses past `NEARLY_USED`.
const NEARLY_USED: u64 = 40;
const WARNED: u64 = 32;

fn weekly(capacity: u64) -> WindowBudgets {
    WindowBudgets {
        unit: WindowUnit::Requests,
        weekly: Some(Window::new(Duration::from_secs(7 * 24 * 3600), capacity)),
        ..WindowBudgets::default()
    }
}

/// A request in a conversation of its own (its own first turn: no binding to follow).
fn conversation(model: &str, turn: &str) -> Value {
    json!({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": turn}]})
}

async fn new_sessions_go_to_the_account_whose_window_has_room(pool: Pool) {
    assert!(WARNED as f64 / NEARLY_USED as f64 >= WARNING_AT);
    pool.upstream.set_windows("cred-first", weekly(NEARLY_USED));
    pool.upstream.set_windows("cred-second", weekly(10_000));
    // Only `first` serves `claude-warm` and only `second` `claude-fresh`: each account answers
    // with its headers, whatever the selection's order.
    for _ in 0..WARNED {
        let (status, body) = pool.messages(&conversation("claude-warm", "warm up")).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = pool.messages(&conversation("claude-fresh", "fresh")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((pool.served("first"), pool.served("second")), (WARNED, 1));
    // The readings reach the selection off the latency path (a flush, then the selector's
    // cache): wait, bounded, until ten new conversations in a row go to the account with room.
    // Each one that still reaches the nearly used account is followed by a pause, so the wait
    // spends at most a few of its last requests, not a round of ten each time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut in_a_row = 0;
    for turn in 0.. {
        if in_a_row == 10 {
            break;
        }
        let before = pool.served("second");
        let (status, body) = pool
            .messages(&conversation("claude-x", &format!("conversation {turn}")))
            .await;
        assert_eq!(status, 200, "{body}");
        if pool.served("second") > before {
            in_a_row += 1;
            continue;
        }
        in_a_row = 0;
        assert!(
            tokio::time::Instant::now() < deadline,
            "new sessions still reach the nearly used account ({} served)",
            pool.served("first")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Ordered away before the upstream had to refuse, not failed over after a refusal.
    assert!(
        pool.served("first") < NEARLY_USED,
        "the nearly used account ran out: {}",
        pool.served("first")
    );
}

fn windowed() -> Vec<Spec> {
    vec![
        Spec {
            models: &["claude-x", "claude-warm"],
            ..anthropic("first", 0)
        },
        Spec {
            models: &["claude-x", "claude-fresh"],
            ..anthropic("second", 0)
        },
    ]
}

fn tiered() -> Vec<Spec> {
    vec![anthropic("first", 0), anthropic("second", 1)]
}

fn equal() -> Vec<Spec> {
    vec![anthropic("first", 0), anthropic("second", 0)]
}

fn mapped() -> Vec<Spec> {
    vec![
        Spec {
            mapping: Some(("claude-x", "claude-upstream-x")),
            models: &["claude-x"],
            ..anthropic("first", 0)
        },
        Spec {
            mapping: Some(("claude-y", "claude-upstream-y")),
            models: &["claude-y"],
            ..anthropic("second", 0)
        },
    ]
}

macro_rules! behaviour_suite {
    ($mode:ident) => {
        mod $mode {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_lower_priority_tier_serves_first() {
                super::the_lower_priority_tier_serves_first(super::$mode(&tiered()).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_busy_account_fails_over_and_stays_selectable() {
                super::a_busy_account_fails_over_and_stays_selectable(
                    super::$mode(&tiered()).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_unauthorized_account_is_left_for_its_sibling() {
                super::an_unauthorized_account_is_left_for_its_sibling(
                    super::$mode(&tiered()).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_session_stays_on_one_account() {
                super::a_session_stays_on_one_account(super::$mode(&equal()).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn new_sessions_go_to_the_account_whose_window_has_room() {
                super::new_sessions_go_to_the_account_whose_window_has_room(
                    super::$mode(&windowed()).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn models_list_what_the_group_serves() {
                super::models_list_what_the_group_serves(super::$mode(&mapped()).await).await;
            }
        }
    };
}

behaviour_suite!(standalone);
behaviour_suite!(distributed);
