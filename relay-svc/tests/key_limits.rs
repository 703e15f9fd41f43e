//! A client key's own limits (docs/DESIGN.md §4, "Client key limits"; §6), in both modes: a key
//! at its concurrency waits for its slot like for an account, then gets 429; past its TPM the
//! next request gets 429 with `Retry-After`; past a spend budget the next gets 402 with
//! `x-should-retry: false` and the time the budget resets, and the official SDKs do not retry
//! it. A refused request reaches no upstream and leaves the pool to every other key. The keys
//! are made as an operator makes them: the standalone YAML, the selector's admin API.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use poolgate_core::account::{Platform, Price};
use poolgate_operator::grpc::SelectorAdmin;
use poolgate_proto::selector::v1 as spb;
use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::{FakeUpstream, Scripted};
use relay_svc::proxy::{Relay, RelaySettings};
use serde_json::{Value, json};

/// The pool's client keys, one per kind of limit.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Key {
    /// No limits: the pool stays open to it whatever the others meet.
    Open,
    /// One request in flight at a time.
    Single,
    /// 10 tokens a minute (every answer of the fake upstream has 17).
    Tpm,
    /// $1 a day (every answer costs $1.70 at the pool's prices).
    Daily,
    /// $1 in total.
    Total,
}

const KEYS: [Key; 5] = [Key::Open, Key::Single, Key::Tpm, Key::Daily, Key::Total];

impl Key {
    fn user(self) -> &'static str {
        match self {
            Key::Open => "alice",
            Key::Single => "bob",
            Key::Tpm => "carol",
            Key::Daily => "dave",
            Key::Total => "erin",
        }
    }
}

/// The fake upstream's answers: 10 input and 7 output tokens each.
const TOKENS_PER_ANSWER: u64 = 17;
/// USD per million tokens, input and output alike: an answer costs $1.70.
const PRICE_PER_MTOK: f64 = 100_000.0;
const COST_PER_ANSWER: f64 = TOKENS_PER_ANSWER as f64 * PRICE_PER_MTOK / 1e6;
/// How long a request may wait for capacity, its key's slot included.
const MAX_WAIT: Duration = Duration::from_secs(2);

/// A relay over the pool, deployed one way or the other.
struct Pool {
    upstream: FakeUpstream,
    base: String,
    http: reqwest::Client,
    relay: Arc<Relay>,
    keys: Vec<(Key, String)>,
    /// What keeps the deployment running (servers, databases).
    _running: Box<dyn std::any::Any + Send>,
}

fn settings() -> RelaySettings {
    RelaySettings {
        max_wait: MAX_WAIT,
        ..RelaySettings::default()
    }
}

async fn standalone() -> Pool {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let keys: Vec<(Key, String)> = KEYS
        .iter()
        .map(|key| (*key, format!("pgk-{}-key-0001", key.user())))
        .collect();
    let mut yaml = String::from("api_keys:\n");
    for (key, secret) in &keys {
        let limits = match key {
            Key::Open => "",
            Key::Single => ", concurrency: 1",
            Key::Tpm => ", tpm: 10",
            Key::Daily => ", budget_usd: {day: 1}",
            Key::Total => ", budget_usd: {total: 1}",
        };
        yaml.push_str(&format!(
            "  - {{key: {secret}, user: {}, group: default{limits}}}\n",
            key.user()
        ));
    }
    yaml.push_str(&format!(
        "accounts:\n  - {{name: claude, platform: anthropic, base_url: \"{0}\", credential: cred-claude, concurrency: 8}}\n  - {{name: gpt, platform: openai, base_url: \"{0}\", credential: cred-gpt, concurrency: 8}}\n",
        upstream.base_url
    ));
    yaml.push_str(&format!(
        "prices:\n  claude-x: {{input: {PRICE_PER_MTOK}, output: {PRICE_PER_MTOK}}}\n  gpt-x: {{input: {PRICE_PER_MTOK}, output: {PRICE_PER_MTOK}}}\n"
    ));
    let (relay, addr) = common::standalone(&yaml, settings(), Default::default())
        .await
        .expect("standalone relay starts");
    Pool {
        upstream,
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
        relay,
        keys,
        _running: Box::new(()),
    }
}

async fn distributed() -> Pool {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let backends = common::backends().await.expect("backends start");
    for (name, platform) in [("claude", Platform::Anthropic), ("gpt", Platform::OpenAi)] {
        let mut account = common::account(name, &upstream.base_url, 8, 0);
        account.platform = platform;
        backends
            .store
            .upsert_account(&account)
            .await
            .expect("account");
    }
    for model in ["claude-x", "gpt-x"] {
        let price = Price {
            input_per_mtok: PRICE_PER_MTOK,
            output_per_mtok: PRICE_PER_MTOK,
            ..Price::default()
        };
        backends.store.set_price(model, price).await.expect("price");
    }
    let (selector, selector_addr) = common::selector(&backends).await.expect("selector starts");
    let (admission, admission_addr) = common::admission(&backends.redis.url(), Default::default())
        .await
        .expect("admission starts");
    let (relay, addr) = common::relay_with_handle(
        vec![format!("http://{selector_addr}")],
        vec![format!("http://{admission_addr}")],
        settings(),
    )
    .await
    .expect("relay starts");
    // The keys, as an operator makes them: through the selector's admin API.
    let mut admin = SelectorAdmin::connect(
        &format!("http://{selector_addr}"),
        "admin",
        Some(common::SERVICE_TOKEN),
    )
    .await
    .expect("the admin API answers")
    .client();
    let mut keys = Vec::new();
    for key in KEYS {
        let mut request = spb::CreateApiKeyRequest {
            user: key.user().into(),
            group: "default".into(),
            name: format!("{key:?}"),
            ..Default::default()
        };
        match key {
            Key::Open => {}
            Key::Single => request.key_concurrency_limit = 1,
            Key::Tpm => request.key_tpm_limit = 10,
            Key::Daily => request.key_budget_day_usd = 1.0,
            Key::Total => request.key_budget_total_usd = 1.0,
        }
        let created = admin
            .create_api_key(request)
            .await
            .expect("the key is created")
            .into_inner();
        keys.push((key, created.api_key));
    }
    Pool {
        upstream,
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
        relay,
        keys,
        _running: Box::new((backends, selector, admission)),
    }
}

/// An answer as the client got it.
struct Answered {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answered {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn error_type(&self) -> &str {
        self.body["error"]["type"].as_str().unwrap_or_default()
    }

    fn message(&self) -> &str {
        self.body["error"]["message"].as_str().unwrap_or_default()
    }
}

impl Pool {
    fn secret(&self, key: Key) -> &str {
        self.keys
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, secret)| secret.as_str())
            .expect("every key is in the pool")
    }

    /// A Messages request (or, `openai`, a chat completion) with `key`.
    async fn send(&self, key: Key, openai: bool) -> Answered {
        let request = if openai {
            self.http
                .post(format!("{}/v1/chat/completions", self.base))
                .bearer_auth(self.secret(key))
                .json(&json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}))
        } else {
            self.http
                .post(format!("{}/v1/messages", self.base))
                .header("x-api-key", self.secret(key))
                .header("anthropic-version", "2023-06-01")
                .json(&json!({"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}))
        };
        let response = request.send().await.expect("the relay answers");
        Answered {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.json().await.unwrap_or(Value::Null),
        }
    }

    /// The key's self-service view.
    async fn view(&self, key: Key) -> Value {
        let response = self
            .http
            .get(format!("{}/v1/poolgate/key", self.base))
            .bearer_auth(self.secret(key))
            .send()
            .await
            .expect("the relay answers");
        assert_eq!(response.status(), 200);
        response.json().await.expect("JSON")
    }

    /// Waits until the key's usage shows `requests` served. The usage record is queued after
    /// the lease's release (which charged the key), so admission has counted them by then.
    async fn served(&self, key: Key, requests: i64) -> Value {
        eventually(Duration::from_secs(15), || async {
            let view = self.view(key).await;
            (view["usage"]["total"]["requests"] == requests).then_some(view)
        })
        .await
        .unwrap_or_else(|error| panic!("{key:?}: {requests} requests in the usage: {error}"))
    }

    fn upstream_requests(&self) -> usize {
        self.upstream.seen_requests().len()
    }

    /// `relay_key_refusals_total{reason}`.
    fn refusals(&self, reason: &str) -> u64 {
        self.relay
            .metrics
            .key_refusals
            .with_label_values(&[reason])
            .get()
    }
}

async fn a_key_at_its_concurrency_waits_for_its_slot_then_gets_429(pool: Pool) {
    // The first request holds the key's only slot for longer than a request may wait.
    pool.upstream
        .script_clients("cred-claude", [Scripted::Delay(MAX_WAIT * 3)]);
    let (first, (second, waited, open)) = tokio::join!(pool.send(Key::Single, false), async {
        eventually(Duration::from_secs(5), || async {
            (pool.upstream_requests() == 1).then_some(())
        })
        .await
        .expect("the first request reached the upstream");
        let started = Instant::now();
        let second = pool.send(Key::Single, false).await;
        let waited = started.elapsed();
        // The account is not blocked: another key is served at once meanwhile.
        let open = pool.send(Key::Open, false).await;
        (second, waited, open)
    });
    assert_eq!(second.status, 429, "{}", second.body);
    assert_eq!(second.error_type(), "rate_limit_error", "{}", second.body);
    assert!(second.message().contains("concurrency"), "{}", second.body);
    assert!(second.header("retry-after").is_some(), "retry-after");
    assert!(
        waited >= MAX_WAIT - Duration::from_millis(200),
        "it waited for the slot first: {waited:?}"
    );
    assert_eq!(open.status, 200, "{}", open.body);
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(
        pool.upstream_requests(),
        2,
        "the refused one reached no upstream (the first and the other key's did)"
    );
    assert_eq!(pool.refusals("concurrency"), 1);

    // Within the wait, the second is served once the first is done, never beside it.
    pool.upstream.reset_stats();
    pool.upstream
        .script_clients("cred-claude", [Scripted::Delay(MAX_WAIT / 4)]);
    let (first, second) = tokio::join!(pool.send(Key::Single, false), async {
        eventually(Duration::from_secs(5), || async {
            (pool.upstream.stats("cred-claude").current == 1).then_some(())
        })
        .await
        .expect("the first request is upstream");
        pool.send(Key::Single, false).await
    });
    assert_eq!((first.status, second.status), (200, 200), "{}", second.body);
    assert_eq!(
        pool.upstream.stats("cred-claude").peak,
        1,
        "the key's requests ran one at a time"
    );
    assert_eq!(pool.refusals("concurrency"), 1);
}

async fn past_its_tpm_a_key_gets_429_with_retry_after_and_reaches_no_upstream(pool: Pool) {
    let first = pool.send(Key::Tpm, false).await;
    assert_eq!(first.status, 200, "{}", first.body);
    pool.served(Key::Tpm, 1).await;
    let before = pool.upstream_requests();
    for openai in [false, true] {
        let refused = pool.send(Key::Tpm, openai).await;
        assert_eq!(refused.status, 429, "{}", refused.body);
        assert_eq!(refused.error_type(), "rate_limit_error", "{}", refused.body);
        assert!(
            refused.message().contains("tokens-per-minute"),
            "{}",
            refused.body
        );
        let retry: u64 = refused
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .expect("retry-after in seconds");
        assert!(
            (1..=60).contains(&retry),
            "within the rolling minute: {retry}"
        );
    }
    assert_eq!(
        pool.upstream_requests(),
        before,
        "nothing reached an upstream"
    );
    assert_eq!(pool.refusals("tpm"), 2);
    // The key is refused, not the accounts.
    let open = pool.send(Key::Open, false).await;
    assert_eq!(open.status, 200, "{}", open.body);
    let view = pool.view(Key::Tpm).await;
    assert_eq!(view["key"]["limits"]["tpm"], 10, "{view}");
    assert_eq!(
        view["usage"]["total"]["requests"], 1,
        "a refused request writes no usage: {view}"
    );
}

/// The next midnight UTC (the deployments' budget calendar: UTC by default), RFC 3339.
fn next_midnight_utc() -> String {
    let now_ms = poolgate_core::now_ms();
    let day_ms = 86_400_000;
    poolgate_core::keys::rfc3339_utc((now_ms / day_ms + 1) * day_ms)
}

async fn past_its_budget_a_key_gets_a_402_that_is_not_retried_and_names_the_reset(pool: Pool) {
    for key in [Key::Daily, Key::Total] {
        let first = pool.send(key, false).await;
        assert_eq!(first.status, 200, "{key:?}: {}", first.body);
        pool.served(key, 1).await;
    }
    let before = pool.upstream_requests();
    for openai in [false, true] {
        let daily = pool.send(Key::Daily, openai).await;
        assert_eq!(daily.status, 402, "{}", daily.body);
        assert_eq!(daily.header("x-should-retry"), Some("false"));
        let expected_type = if openai {
            "insufficient_quota"
        } else {
            "billing_error"
        };
        assert_eq!(daily.error_type(), expected_type, "{}", daily.body);
        let midnight = next_midnight_utc();
        assert_eq!(
            daily.header("x-poolgate-budget-resets-at"),
            Some(midnight.as_str())
        );
        assert!(
            daily.message().contains("budget") && daily.message().contains(&midnight),
            "{}",
            daily.body
        );
        let retry: u64 = daily
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .expect("retry-after: the time to the reset");
        assert!((1..=86_400).contains(&retry), "{retry}");

        let total = pool.send(Key::Total, openai).await;
        assert_eq!(total.status, 402, "{}", total.body);
        assert_eq!(total.header("x-should-retry"), Some("false"));
        assert!(total.message().contains("does not reset"), "{}", total.body);
        assert_eq!(total.header("retry-after"), None, "a total never resets");
    }
    assert_eq!(
        pool.upstream_requests(),
        before,
        "nothing reached an upstream"
    );
    assert_eq!(pool.refusals("budget"), 4);
    let open = pool.send(Key::Open, false).await;
    assert_eq!(
        open.status, 200,
        "the pool is open to other keys: {}",
        open.body
    );

    // The holder sees why: the budget, and nothing left of it.
    let view = pool.view(Key::Daily).await;
    assert_eq!(view["key"]["limits"]["budget_usd"]["day"], 1.0, "{view}");
    assert_eq!(view["usage"]["day"]["remaining_usd"], 0.0, "{view}");
    assert_eq!(
        view["usage"]["total"]["requests"], 1,
        "nothing recorded for refusals"
    );
    let cost = view["usage"]["day"]["cost_usd"]
        .as_f64()
        .unwrap_or_default();
    assert!((cost - COST_PER_ANSWER).abs() < 1e-6, "{view}");
}

fn sdk_python() -> Option<std::path::PathBuf> {
    if let Some(python) = std::env::var_os("POOLGATE_SDK_PYTHON") {
        return Some(python.into());
    }
    let venv = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    venv.exists().then_some(venv)
}

/// Both official SDKs, with retries on, call once with a key whose budget is used up: each
/// raises the 402 and neither asks again (the relay counts every refusal).
const SDK_NO_RETRY: &str = r#"
import sys
import anthropic
import openai

base, key = sys.argv[1], sys.argv[2]
claude = anthropic.Anthropic(base_url=base, api_key=key, max_retries=3)
try:
    claude.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    sys.exit("anthropic: the refused request was served")
except anthropic.APIStatusError as error:
    assert error.status_code == 402, error.status_code
oai = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=3)
try:
    oai.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}])
    sys.exit("openai: the refused request was served")
except openai.APIStatusError as error:
    assert error.status_code == 402, error.status_code
print("both refused once")
"#;

async fn the_official_sdks_do_not_retry_a_budget_refusal(pool: Pool) {
    let Some(python) = sdk_python() else {
        panic!(
            "the SDK check needs the official SDKs: run `bash scripts/test.sh` (it makes .venv), or set POOLGATE_SDK_PYTHON"
        );
    };
    let first = pool.send(Key::Total, false).await;
    assert_eq!(first.status, 200, "{}", first.body);
    pool.served(Key::Total, 1).await;
    let before = pool.upstream_requests();
    let output = tokio::process::Command::new(python)
        .arg("-c")
        .arg(SDK_NO_RETRY)
        .arg(&pool.base)
        .arg(pool.secret(Key::Total))
        .output()
        .await
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("both refused once"),
        "{stdout}\n{stderr}"
    );
    assert_eq!(
        pool.refusals("budget"),
        2,
        "one request per SDK reached the relay: no retry"
    );
    assert_eq!(
        pool.upstream_requests(),
        before,
        "nothing reached an upstream"
    );
}

macro_rules! key_limits_suite {
    ($mode:ident) => {
        mod $mode {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_key_at_its_concurrency_waits_for_its_slot_then_gets_429() {
                super::a_key_at_its_concurrency_waits_for_its_slot_then_gets_429(
                    super::$mode().await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn past_its_tpm_a_key_gets_429_with_retry_after_and_reaches_no_upstream() {
                super::past_its_tpm_a_key_gets_429_with_retry_after_and_reaches_no_upstream(
                    super::$mode().await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn past_its_budget_a_key_gets_a_402_that_is_not_retried_and_names_the_reset() {
                super::past_its_budget_a_key_gets_a_402_that_is_not_retried_and_names_the_reset(
                    super::$mode().await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_official_sdks_do_not_retry_a_budget_refusal() {
                super::the_official_sdks_do_not_retry_a_budget_refusal(super::$mode().await).await;
            }
        }
    };
}

key_limits_suite!(standalone);
key_limits_suite!(distributed);
