//! What a client key reaches (docs/DESIGN.md §6), in both modes: a disabled key, an expired key,
//! a model or an endpoint outside the key's lists are refused in the client's format, naming the
//! reason, before anything reaches an upstream; `/v1/models` lists only the key's models; and
//! `GET /v1/poolgate/key` shows its holder that key and its usage, nothing of another key.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use poolgate_core::account::Platform;
use poolgate_operator::grpc::SelectorAdmin;
use poolgate_proto::selector::v1 as spb;
use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::FakeUpstream;
use relay_svc::proxy::{Relay, RelaySettings};
use serde_json::{Value, json};

/// The pool's client keys, one per kind of limit.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Key {
    /// No limits (what every key created before limits existed is).
    Open,
    Disabled,
    /// Expired on 2020-01-01.
    Expired,
    /// `claude-haiku-*` and `gpt-4o-mini` only, on `messages`, `chat_completions` and `models`.
    Limited,
}

const KEYS: [Key; 4] = [Key::Open, Key::Disabled, Key::Expired, Key::Limited];
const EXPIRED_AT: &str = "2020-01-01T00:00:00Z";
const EXPIRED_AT_MS: i64 = 1_577_836_800_000;
/// The admin token of the stack's selectors (`poolgate_stack`).
const STACK_ADMIN_TOKEN: &str = "admin";
const LIMITED_MODELS: [&str; 2] = ["claude-haiku-*", "gpt-4o-mini"];
const LIMITED_ENDPOINTS: [&str; 3] = ["messages", "chat_completions", "models"];

impl Key {
    fn user(self) -> &'static str {
        match self {
            Key::Open => "alice",
            Key::Disabled => "bob",
            Key::Expired => "carol",
            Key::Limited => "dave",
        }
    }
}

/// The accounts: an Anthropic and an OpenAI one, each serving two models.
const CLAUDE_MODELS: [&str; 2] = ["claude-haiku-4-5", "claude-sonnet-4-5"];
const GPT_MODELS: [&str; 2] = ["gpt-4o", "gpt-4o-mini"];

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
        max_wait: Duration::from_secs(3),
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
            Key::Open => String::new(),
            Key::Disabled => ", disabled: true".into(),
            Key::Expired => format!(", expires_at: \"{EXPIRED_AT}\""),
            Key::Limited => format!(
                ", models: [\"{}\"], endpoints: [{}]",
                LIMITED_MODELS.join("\", \""),
                LIMITED_ENDPOINTS.join(", ")
            ),
        };
        yaml.push_str(&format!(
            "  - {{key: {secret}, user: {}, group: default{limits}}}\n",
            key.user()
        ));
    }
    yaml.push_str("accounts:\n");
    for (name, platform, models) in [
        ("claude", "anthropic", CLAUDE_MODELS),
        ("gpt", "openai", GPT_MODELS),
    ] {
        yaml.push_str(&format!(
            "  - {{name: {name}, platform: {platform}, base_url: \"{}\", credential: cred-{name}, concurrency: 8, models: [{}]}}\n",
            upstream.base_url,
            models.join(", ")
        ));
    }
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
    for (name, platform, models) in [
        ("claude", Platform::Anthropic, CLAUDE_MODELS),
        ("gpt", Platform::OpenAi, GPT_MODELS),
    ] {
        let mut account = common::account(name, &upstream.base_url, 8, 0);
        account.platform = platform;
        account.allowed_models = models.iter().map(|m| m.to_string()).collect();
        backends
            .store
            .upsert_account(&account)
            .await
            .expect("account");
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
    // The keys, as an operator makes them: through the selector's admin API (which reloads the
    // selector's snapshot before it answers).
    let mut admin = SelectorAdmin::connect(
        &format!("http://{selector_addr}"),
        STACK_ADMIN_TOKEN,
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
            Key::Open | Key::Disabled => {}
            // Made without an expiry: one in the past is refused at creation. It expires below.
            Key::Expired => {}
            Key::Limited => {
                request.allowed_models = LIMITED_MODELS.map(str::to_owned).to_vec();
                request.allowed_endpoints = LIMITED_ENDPOINTS.map(str::to_owned).to_vec();
            }
        }
        let created = admin
            .create_api_key(request)
            .await
            .expect("the key is created")
            .into_inner();
        if key == Key::Expired {
            // A key that has expired since it was made: the expiry written to the store as it
            // stands after the fact, then the selector's snapshot reloaded by an admin update
            // that changes nothing else.
            backends
                .store
                .update_api_key(
                    created.id,
                    &poolgate_core::keys::KeyUpdate {
                        expires_at_ms: Some(Some(EXPIRED_AT_MS)),
                        ..Default::default()
                    },
                )
                .await
                .expect("the key's expiry is written");
            admin
                .update_api_key(spb::UpdateApiKeyRequest {
                    id: created.id,
                    disabled: Some(false),
                    ..Default::default()
                })
                .await
                .expect("the selector reloads");
        }
        if key == Key::Disabled {
            admin
                .update_api_key(spb::UpdateApiKeyRequest {
                    id: created.id,
                    disabled: Some(true),
                    ..Default::default()
                })
                .await
                .expect("the key is disabled");
        }
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

/// A path's client format: Anthropic's on `/v1/messages*`, OpenAI's elsewhere.
fn anthropic(path: &str) -> bool {
    path.starts_with("/v1/messages")
}

fn body(path: &str, model: &str) -> Value {
    if path == "/v1/responses" {
        json!({"model": model, "input": "hi"})
    } else {
        json!({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
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

    fn request(&self, method: reqwest::Method, path: &str, key: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        if anthropic(path) {
            request
                .header("x-api-key", key)
                .header("anthropic-version", "2023-06-01")
        } else {
            request.bearer_auth(key)
        }
    }

    /// Sends a request for `model` to `path` with `key`: status and JSON answer.
    async fn send(&self, key: Key, path: &str, model: &str) -> (u16, Value) {
        let response = self
            .request(reqwest::Method::POST, path, self.secret(key))
            .json(&body(path, model))
            .send()
            .await
            .expect("the relay answers");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// `GET path` with `key` (Anthropic's headers when `anthropic_headers`).
    async fn get(&self, key: &str, path: &str, anthropic_headers: bool) -> (u16, Value) {
        let mut request = self.http.get(format!("{}{path}", self.base));
        request = if anthropic_headers {
            request
                .header("x-api-key", key)
                .header("anthropic-version", "2023-06-01")
        } else {
            request.bearer_auth(key)
        };
        let response = request.send().await.expect("the relay answers");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn model_ids(&self, key: Key, anthropic_headers: bool) -> Vec<String> {
        let (status, answer) = self
            .get(self.secret(key), "/v1/models", anthropic_headers)
            .await;
        assert_eq!(status, 200, "{answer}");
        let mut ids: Vec<String> = answer["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["id"].as_str().map(str::to_owned))
            .collect();
        ids.sort();
        ids
    }

    /// Every request the fake upstream received, `count_tokens` calls included.
    fn upstream_requests(&self) -> usize {
        self.upstream.seen_requests().len()
            + ["cred-claude", "cred-gpt"]
                .iter()
                .map(|credential| self.upstream.count_tokens_calls(credential) as usize)
                .sum::<usize>()
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

/// The error's type and message, in either client format.
fn error_of(answer: &Value) -> (&str, &str) {
    let error = &answer["error"];
    (
        error["type"].as_str().unwrap_or_default(),
        error["message"].as_str().unwrap_or_default(),
    )
}

const PATHS: [&str; 4] = [
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/chat/completions",
    "/v1/responses",
];

fn model_for(path: &str) -> &'static str {
    if anthropic(path) {
        "claude-haiku-4-5"
    } else {
        "gpt-4o-mini"
    }
}

async fn a_disabled_key_is_refused_403_naming_why_and_reaches_no_upstream(pool: Pool) {
    for path in PATHS {
        let (status, answer) = pool.send(Key::Disabled, path, model_for(path)).await;
        assert_eq!(status, 403, "{path}: {answer}");
        let (kind, message) = error_of(&answer);
        assert_eq!(kind, "permission_error", "{path}: {answer}");
        assert!(message.contains("disabled"), "{path}: {answer}");
        assert!(
            !message.contains(pool.secret(Key::Disabled)),
            "the key is never named"
        );
    }
    let (status, answer) = pool
        .get(pool.secret(Key::Disabled), "/v1/models", true)
        .await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(pool.upstream_requests(), 0, "nothing reached an upstream");
    assert_eq!(pool.refusals("disabled"), 5);
    // The same requests with an open key are served: the refusal is the key's.
    for path in PATHS {
        let (status, answer) = pool.send(Key::Open, path, model_for(path)).await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    assert_eq!(pool.refusals("disabled"), 5);
}

async fn an_expired_key_is_refused_401_naming_when_it_expired(pool: Pool) {
    for path in PATHS {
        let (status, answer) = pool.send(Key::Expired, path, model_for(path)).await;
        assert_eq!(status, 401, "{path}: {answer}");
        let (kind, message) = error_of(&answer);
        assert_eq!(kind, "authentication_error", "{path}: {answer}");
        assert!(
            message.contains("expired") && message.contains(EXPIRED_AT),
            "{path}: {answer}"
        );
    }
    assert_eq!(pool.upstream_requests(), 0, "nothing reached an upstream");
    assert_eq!(pool.refusals("expired"), 4);
}

async fn a_model_outside_the_keys_list_is_403_for_anthropic_and_model_not_found_for_openai(
    pool: Pool,
) {
    let (status, answer) = pool
        .send(Key::Limited, "/v1/messages", "claude-sonnet-4-5")
        .await;
    assert_eq!(status, 403, "{answer}");
    let (kind, message) = error_of(&answer);
    assert_eq!(kind, "permission_error", "{answer}");
    assert!(message.contains("claude-sonnet-4-5"), "{answer}");
    let (status, answer) = pool
        .send(Key::Limited, "/v1/chat/completions", "gpt-4o")
        .await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(
        answer,
        json!({"error": {
            "message": "The model `gpt-4o` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }})
    );
    assert_eq!(pool.upstream_requests(), 0, "nothing reached an upstream");
    assert_eq!(pool.refusals("model"), 2);
    // The key's own models are served, and the open key's reach every model.
    for (key, path, model) in [
        (Key::Limited, "/v1/messages", "claude-haiku-4-5"),
        (Key::Limited, "/v1/chat/completions", "gpt-4o-mini"),
        (Key::Open, "/v1/messages", "claude-sonnet-4-5"),
        (Key::Open, "/v1/chat/completions", "gpt-4o"),
    ] {
        let (status, answer) = pool.send(key, path, model).await;
        assert_eq!(status, 200, "{key:?} {path} {model}: {answer}");
    }
    assert_eq!(pool.upstream.seen_requests().len(), 4);
}

async fn an_endpoint_outside_the_keys_list_is_403(pool: Pool) {
    for (path, model) in [
        ("/v1/responses", "gpt-4o-mini"),
        ("/v1/messages/count_tokens", "claude-haiku-4-5"),
    ] {
        let (status, answer) = pool.send(Key::Limited, path, model).await;
        assert_eq!(status, 403, "{path}: {answer}");
        let (kind, message) = error_of(&answer);
        assert_eq!(kind, "permission_error", "{path}: {answer}");
        assert!(message.contains("endpoint"), "{path}: {answer}");
    }
    assert_eq!(pool.upstream_requests(), 0, "nothing reached an upstream");
    assert_eq!(pool.refusals("endpoint"), 2);
    let (status, answer) = pool.send(Key::Open, "/v1/responses", "gpt-4o-mini").await;
    assert_eq!(status, 200, "the open key reaches it: {answer}");
}

async fn the_model_list_shows_only_the_models_the_key_may_use(pool: Pool) {
    assert_eq!(pool.model_ids(Key::Open, true).await, CLAUDE_MODELS);
    assert_eq!(pool.model_ids(Key::Open, false).await, GPT_MODELS);
    assert_eq!(
        pool.model_ids(Key::Limited, true).await,
        ["claude-haiku-4-5"]
    );
    assert_eq!(pool.model_ids(Key::Limited, false).await, ["gpt-4o-mini"]);
}

async fn the_self_service_view_shows_the_callers_own_key_and_usage_and_nothing_else(pool: Pool) {
    let (status, answer) = pool
        .send(Key::Open, "/v1/messages", "claude-haiku-4-5")
        .await;
    assert_eq!(status, 200, "{answer}");
    let view = |key: Key, anthropic_headers: bool| {
        let pool = &pool;
        async move {
            let (status, view) = pool
                .get(pool.secret(key), "/v1/poolgate/key", anthropic_headers)
                .await;
            assert_eq!(status, 200, "{key:?}: {view}");
            view
        }
    };
    // Usage reaches the ledger in batches: wait for the served request.
    eventually(Duration::from_secs(10), || async {
        (view(Key::Open, true).await["usage"]["day"]["requests"] == 1).then_some(())
    })
    .await
    .expect("the served request shows in the key's usage");
    let open = view(Key::Open, false).await;
    let key = &open["key"];
    assert_eq!(key["user"], "alice", "{open}");
    assert_eq!(key["group"], "default");
    assert_eq!(key["status"], "active");
    assert_eq!(key["expires_at"], Value::Null);
    assert_eq!(key["allowed_models"], json!([]));
    assert_eq!(
        key["prefix"].as_str(),
        Some(&pool.secret(Key::Open)[..8]),
        "{open}"
    );
    for period in ["day", "week", "month", "total"] {
        let usage = &open["usage"][period];
        assert_eq!(usage["requests"], 1, "{period}: {open}");
        assert!(usage["input_tokens"].as_i64() > Some(0), "{period}: {open}");
        assert!(usage["from"].is_string(), "{period}: {open}");
    }
    let text = open.to_string();
    for other in [Key::Disabled, Key::Expired, Key::Limited] {
        assert!(
            !text.contains(other.user()) && !text.contains(pool.secret(other)),
            "nothing of another key: {open}"
        );
    }

    let limited = view(Key::Limited, false).await;
    assert_eq!(limited["key"]["user"], "dave", "{limited}");
    assert_eq!(limited["key"]["allowed_models"], json!(LIMITED_MODELS));
    assert_eq!(
        limited["key"]["allowed_endpoints"],
        json!(LIMITED_ENDPOINTS)
    );
    assert_eq!(
        limited["usage"]["total"]["requests"], 0,
        "the other key's request is not this key's: {limited}"
    );
    assert_ne!(limited["key"]["id"], open["key"]["id"]);
    // A refused key reads why.
    let disabled = view(Key::Disabled, true).await;
    assert_eq!(disabled["key"]["status"], "disabled", "{disabled}");
    let expired = view(Key::Expired, true).await;
    assert_eq!(expired["key"]["status"], "expired", "{expired}");
    assert_eq!(expired["key"]["expires_at"], EXPIRED_AT);
    // An unknown key gets the usual 401.
    for anthropic_headers in [true, false] {
        let (status, answer) = pool
            .get("pgk-nobody-key-0001", "/v1/poolgate/key", anthropic_headers)
            .await;
        assert_eq!(status, 401, "{answer}");
        assert_eq!(error_of(&answer).0, "authentication_error", "{answer}");
    }
}

macro_rules! key_access_suite {
    ($mode:ident) => {
        mod $mode {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_disabled_key_is_refused_403_naming_why_and_reaches_no_upstream() {
                super::a_disabled_key_is_refused_403_naming_why_and_reaches_no_upstream(
                    super::$mode().await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_expired_key_is_refused_401_naming_when_it_expired() {
                super::an_expired_key_is_refused_401_naming_when_it_expired(super::$mode().await)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_model_outside_the_keys_list_is_403_for_anthropic_and_model_not_found_for_openai()
             {
                super::a_model_outside_the_keys_list_is_403_for_anthropic_and_model_not_found_for_openai(
                    super::$mode().await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_endpoint_outside_the_keys_list_is_403() {
                super::an_endpoint_outside_the_keys_list_is_403(super::$mode().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_model_list_shows_only_the_models_the_key_may_use() {
                super::the_model_list_shows_only_the_models_the_key_may_use(super::$mode().await)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_self_service_view_shows_the_callers_own_key_and_usage_and_nothing_else() {
                super::the_self_service_view_shows_the_callers_own_key_and_usage_and_nothing_else(
                    super::$mode().await,
                )
                .await;
            }
        }
    };
}

key_access_suite!(standalone);
key_access_suite!(distributed);
