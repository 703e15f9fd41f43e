//! Embeddings and rerank through the pool (docs/DESIGN.md §6, "Embeddings and rerank"), in both
//! modes, against the fake upstream's `/v1/embeddings` and Cohere-format `/v1/rerank` and
//! `/v2/rerank` (docs/SUBSCRIPTIONS.md gives each of its rules a source):
//! - only accounts that serve a path are asked for it, and the answer passes whole (a base64
//!   embedding as the upstream wrote it);
//! - a broken account fails over before the answer; a batch the pool cannot take now is answered
//!   429 at once with `retry-after` (the soonest known reset, else a second), having waited in no
//!   queue;
//! - client keys' endpoint lists and budgets hold: embeddings charged by input tokens, rerank by
//!   search units;
//! - rerank degrades to the recall order only when the request or its group asks, never with an
//!   invented score, never charged; a client's own bad request is never degraded;
//! - an embeddings-only account and a rerank account are probed with a request they answer.

use crate::common;
use crate::support::{self, Mode, Options, Spec};

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use poolgate_core::account::{Platform, Price, Service};
use poolgate_operator::grpc::SelectorAdmin;
use poolgate_proto::selector::v1 as spb;
use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::{FakeUpstream, Scripted};
use relay_svc::proxy::{Relay, RelaySettings};
use serde_json::{Value, json};

const EMBEDDING_MODEL: &str = "text-embedding-3-small";
const RERANK_MODEL: &str = "rerank-v3.5";
/// The pool's embedding price: USD per million input tokens (an input of "hello world" is 3
/// tokens at the fake: $0.30).
const EMBEDDING_PER_MTOK: f64 = 100_000.0;
/// The pool's rerank price: USD per search unit (up to 100 documents: $0.50).
const PER_SEARCH_UNIT: f64 = 0.5;

/// One upstream account of the pool.
#[derive(Clone)]
struct Account {
    name: &'static str,
    platform: Platform,
    serves: &'static [&'static str],
    concurrency: i32,
    rpm: i32,
    priority: i32,
    models: &'static [&'static str],
}

fn openai(name: &'static str) -> Account {
    Account {
        name,
        platform: Platform::OpenAi,
        serves: &[],
        concurrency: 8,
        rpm: 0,
        priority: 1,
        models: &[],
    }
}

fn reranker(name: &'static str) -> Account {
    Account {
        platform: Platform::Rerank,
        ..openai(name)
    }
}

/// One client key of the pool.
#[derive(Clone)]
struct Key {
    user: &'static str,
    endpoints: &'static [&'static str],
    budget_total_usd: f64,
}

fn open_key(user: &'static str) -> Key {
    Key {
        user,
        endpoints: &[],
        budget_total_usd: 0.0,
    }
}

/// A relay over `accounts` and `keys`, deployed one way or the other.
struct Pool {
    upstream: FakeUpstream,
    base: String,
    http: reqwest::Client,
    relay: Arc<Relay>,
    /// Each key's secret, by user.
    keys: Vec<(&'static str, String)>,
    _running: Box<dyn std::any::Any + Send>,
}

struct Setup {
    accounts: Vec<Account>,
    keys: Vec<Key>,
    /// The group's rerank requests degrade unless they say otherwise.
    group_passthrough: bool,
    settings: RelaySettings,
}

impl Setup {
    fn new(accounts: Vec<Account>, keys: Vec<Key>) -> Self {
        Setup {
            accounts,
            keys,
            group_passthrough: false,
            settings: RelaySettings {
                max_wait: Duration::from_secs(10),
                ..RelaySettings::default()
            },
        }
    }

    async fn start(&self, mode: Mode) -> Pool {
        let upstream = FakeUpstream::start().await.expect("fake upstream");
        match mode {
            Mode::Standalone => self.standalone(upstream).await,
            Mode::Distributed => self.distributed(upstream).await,
        }
    }

    async fn standalone(&self, upstream: FakeUpstream) -> Pool {
        let keys: Vec<(&'static str, String)> = self
            .keys
            .iter()
            .map(|key| (key.user, format!("pgk-{}-key-0001", key.user)))
            .collect();
        let mut yaml = String::from("api_keys:\n");
        for (key, (_, secret)) in self.keys.iter().zip(&keys) {
            yaml.push_str(&format!(
                "  - {{key: {secret}, user: {}, group: default, endpoints: [{}], budget_usd: {{total: {}}}}}\n",
                key.user,
                key.endpoints.join(", "),
                key.budget_total_usd
            ));
        }
        if self.group_passthrough {
            yaml.push_str("groups:\n  default: {rerank_fallback: passthrough}\n");
        }
        yaml.push_str("accounts:\n");
        for account in &self.accounts {
            yaml.push_str(&format!(
                "  - {{name: {0}, platform: {1}, base_url: \"{2}\", credential: cred-{0}, concurrency: {3}, priority: {4}, serves: [{5}], models: [{6}], rpm_limit: {7}}}\n",
                account.name,
                account.platform.as_str(),
                upstream.base_url,
                account.concurrency,
                account.priority,
                account.serves.join(", "),
                account.models.join(", "),
                account.rpm,
            ));
        }
        yaml.push_str(&format!(
            "prices:\n  {EMBEDDING_MODEL}: {{input: {EMBEDDING_PER_MTOK}}}\n  {RERANK_MODEL}: {{search_unit: {PER_SEARCH_UNIT}}}\n"
        ));
        let (relay, addr) = common::standalone(&yaml, self.settings.clone(), Default::default())
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

    async fn distributed(&self, upstream: FakeUpstream) -> Pool {
        let backends = common::backends().await.expect("backends start");
        for account in &self.accounts {
            let mut input = common::account(
                account.name,
                &upstream.base_url,
                account.concurrency,
                account.priority,
            );
            input.platform = account.platform;
            input.rpm_limit = account.rpm;
            input.serves = account
                .serves
                .iter()
                .map(|name| Service::parse(name).expect("a service"))
                .collect();
            input.allowed_models = account.models.iter().map(|m| (*m).to_owned()).collect();
            backends
                .store
                .upsert_account(&input)
                .await
                .expect("account");
        }
        if self.group_passthrough {
            sqlx::query("UPDATE groups SET rerank_passthrough = true WHERE name = 'default'")
                .execute(backends.store.pool())
                .await
                .expect("group setting");
        }
        let embedding = Price {
            input_per_mtok: EMBEDDING_PER_MTOK,
            ..Price::default()
        };
        let rerank = Price {
            per_search_unit: PER_SEARCH_UNIT,
            ..Price::default()
        };
        for (model, price) in [(EMBEDDING_MODEL, embedding), (RERANK_MODEL, rerank)] {
            backends.store.set_price(model, price).await.expect("price");
        }
        let (selector, selector_addr) = common::selector(&backends).await.expect("selector starts");
        let (admission, admission_addr) =
            common::admission(&backends.redis.url(), Default::default())
                .await
                .expect("admission starts");
        let (relay, addr) = common::relay_with_handle(
            vec![format!("http://{selector_addr}")],
            vec![format!("http://{admission_addr}")],
            self.settings.clone(),
        )
        .await
        .expect("relay starts");
        let mut admin = SelectorAdmin::connect(
            &format!("http://{selector_addr}"),
            "admin",
            Some(common::SERVICE_TOKEN),
        )
        .await
        .expect("the admin API answers")
        .client();
        let mut keys = Vec::new();
        for key in &self.keys {
            let created = admin
                .create_api_key(spb::CreateApiKeyRequest {
                    user: key.user.into(),
                    group: "default".into(),
                    name: key.user.into(),
                    allowed_endpoints: key.endpoints.iter().map(|e| (*e).to_owned()).collect(),
                    key_budget_total_usd: key.budget_total_usd,
                    ..Default::default()
                })
                .await
                .expect("the key is created")
                .into_inner();
            keys.push((key.user, created.api_key));
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
}

/// An answer as the client got it.
#[derive(Debug)]
struct Answered {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
    took: Duration,
}

impl Answered {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Pool {
    fn secret(&self, user: &str) -> &str {
        self.keys
            .iter()
            .find(|(u, _)| *u == user)
            .map(|(_, secret)| secret.as_str())
            .expect("the key is in the pool")
    }

    async fn post(
        &self,
        user: &str,
        path: &str,
        body: Value,
        headers: &[(&str, &str)],
    ) -> Answered {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(self.secret(user))
            .json(&body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let started = Instant::now();
        let response = request.send().await.expect("the relay answers");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.json().await.unwrap_or(Value::Null);
        Answered {
            status,
            headers,
            body,
            took: started.elapsed(),
        }
    }

    async fn embed(&self, user: &str, body: Value) -> Answered {
        self.post(user, "/v1/embeddings", body, &[]).await
    }

    /// The key's total spend and requests, as its holder reads them (`/v1/poolgate/key`).
    async fn spent(&self, user: &str) -> (f64, i64) {
        let view: Value = self
            .http
            .get(format!("{}/v1/poolgate/key", self.base))
            .bearer_auth(self.secret(user))
            .send()
            .await
            .expect("the relay answers")
            .json()
            .await
            .expect("a JSON view");
        let total = &view["usage"]["total"];
        (
            total["cost_usd"].as_f64().unwrap_or(-1.0),
            total["requests"].as_i64().unwrap_or(-1),
        )
    }

    /// Requests the upstream got on `path` with account `name`'s credential (probes aside).
    fn seen(&self, name: &str, path: &str) -> usize {
        let credential = format!("cred-{name}");
        self.upstream
            .seen_requests()
            .iter()
            .filter(|r| !r.probe && r.path == path && r.credential() == credential)
            .count()
    }
}

fn batch(inputs: &[&str]) -> Value {
    json!({"model": EMBEDDING_MODEL, "input": inputs})
}

fn rerank_body(documents: &[&str]) -> Value {
    json!({"model": RERANK_MODEL, "query": "rust pool", "documents": documents})
}

const MODES: [Mode; 2] = [Mode::Standalone, Mode::Distributed];

/// Request headers a test adds.
type Headers = &'static [(&'static str, &'static str)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_go_whole_to_the_accounts_that_serve_them_and_are_charged() {
    for mode in MODES {
        // The chat-only account comes first by priority: were it planned, it would be asked.
        let chat_only = Account {
            serves: &["chat"],
            priority: 0,
            ..openai("chat-only")
        };
        let embedder = Account {
            models: &[EMBEDDING_MODEL, "gpt-x"],
            ..openai("embedder")
        };
        let pool = Setup::new(vec![chat_only, embedder], vec![open_key("alice")])
            .start(mode)
            .await;
        for n in 0..6 {
            let answer = pool
                .embed("alice", batch(&["hello world", "second input"]))
                .await;
            assert_eq!(answer.status, 200, "{mode:?} batch {n}: {answer:?}");
            let data = answer.body["data"].as_array().cloned().unwrap_or_default();
            assert_eq!(data.len(), 2, "{mode:?}: both inputs answered: {answer:?}");
            assert_eq!(
                data[0]["embedding"].as_array().map(Vec::len),
                Some(1536),
                "{mode:?}: a float vector of the model's size"
            );
            assert_eq!(answer.body["usage"]["prompt_tokens"], json!(3 + 3));
        }
        assert_eq!(pool.seen("chat-only", "/v1/embeddings"), 0, "{mode:?}");
        assert_eq!(pool.seen("embedder", "/v1/embeddings"), 6, "{mode:?}");

        // base64, as the openai SDK asks by default: the string passes as the upstream wrote it.
        let answer = pool
            .embed(
                "alice",
                json!({"model": EMBEDDING_MODEL, "input": "hello world", "encoding_format": "base64"}),
            )
            .await;
        let encoded = answer.body["data"][0]["embedding"]
            .as_str()
            .unwrap_or_default();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .expect("base64 of the vector");
        assert_eq!(
            bytes.len(),
            1536 * 4,
            "{mode:?}: little-endian f32s: {answer:?}"
        );

        // Charged by input tokens at the pool's price: 7 answers of 6, 6, …, 3 tokens.
        let expected = (6.0 * 6.0 + 3.0) * EMBEDDING_PER_MTOK / 1e6;
        let spent = eventually(Duration::from_secs(15), || async {
            let (cost, requests) = pool.spent("alice").await;
            (requests == 7 && (cost - expected).abs() < 1e-6).then_some(cost)
        })
        .await;
        assert!(
            spent.is_ok(),
            "{mode:?}: expected $${expected} over 7 requests, the key reads {:?}",
            pool.spent("alice").await
        );

        // `/v1/models` lists the embedding model an account names.
        let models: Value = pool
            .http
            .get(format!("{}/v1/models", pool.base))
            .bearer_auth(pool.secret("alice"))
            .send()
            .await
            .expect("answer")
            .json()
            .await
            .expect("json");
        let listed: Vec<&str> = models["data"]
            .as_array()
            .map(|d| d.iter().filter_map(|m| m["id"].as_str()).collect())
            .unwrap_or_default();
        assert!(listed.contains(&EMBEDDING_MODEL), "{mode:?}: {models}");

        // Chat still reaches either account.
        let chat = pool
            .post(
                "alice",
                "/v1/chat/completions",
                json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}),
                &[],
            )
            .await;
        assert_eq!(chat.status, 200, "{mode:?}: {chat:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_account_fails_over_before_the_answer_and_only_the_answer_is_charged() {
    for mode in MODES {
        let pool = Setup::new(
            vec![
                Account {
                    priority: 0,
                    ..openai("first")
                },
                openai("second"),
            ],
            vec![open_key("alice")],
        )
        .start(mode)
        .await;
        pool.upstream.script_clients(
            "cred-first",
            [Scripted::Fail {
                status: 500,
                headers: vec![("content-type".into(), "application/json".into())],
                body: r#"{"error":{"message":"internal","type":"server_error","code":null}}"#
                    .into(),
            }],
        );
        let answer = pool.embed("alice", batch(&["hello world"])).await;
        assert_eq!(answer.status, 200, "{mode:?}: failed over: {answer:?}");
        assert_eq!(pool.seen("first", "/v1/embeddings"), 1, "{mode:?}");
        assert_eq!(pool.seen("second", "/v1/embeddings"), 1, "{mode:?}");
        let expected = 3.0 * EMBEDDING_PER_MTOK / 1e6;
        let charged = eventually(Duration::from_secs(15), || async {
            let (cost, requests) = pool.spent("alice").await;
            (requests == 1 && (cost - expected).abs() < 1e-6).then_some(())
        })
        .await;
        assert!(
            charged.is_ok(),
            "{mode:?}: one answer charged once: {:?}",
            pool.spent("alice").await
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_pool_cannot_take_now_is_refused_at_once_with_retry_after() {
    for mode in MODES {
        let pool = Setup::new(
            vec![Account {
                concurrency: 1,
                ..openai("only")
            }],
            vec![open_key("alice")],
        )
        .start(mode)
        .await;
        // The account's one slot is held by a slow batch.
        pool.upstream
            .script_clients("cred-only", [Scripted::Delay(Duration::from_secs(3))]);
        let first = {
            let http = pool.http.clone();
            let url = format!("{}/v1/embeddings", pool.base);
            let key = pool.secret("alice").to_owned();
            tokio::spawn(async move {
                http.post(url)
                    .bearer_auth(key)
                    .json(&batch(&["slow"]))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            })
        };
        let held = eventually(Duration::from_secs(10), || async {
            (pool.upstream.stats("cred-only").current == 1).then_some(())
        })
        .await;
        assert!(
            held.is_ok(),
            "{mode:?}: the slow batch reached the upstream"
        );
        let refused = pool.embed("alice", batch(&["next"])).await;
        assert_eq!(refused.status, 429, "{mode:?}: {refused:?}");
        assert!(
            refused.took < Duration::from_secs(2),
            "{mode:?}: answered at once, not after a wait for the slot: {:?}",
            refused.took
        );
        assert_eq!(
            refused.header("retry-after"),
            Some("1"),
            "{mode:?}: no reset known: a second"
        );
        assert_eq!(refused.body["error"]["type"], json!("rate_limit_error"));
        assert_eq!(refused.body["error"]["code"], json!("pool_busy"));
        assert_eq!(
            pool.seen("only", "/v1/embeddings"),
            1,
            "{mode:?}: the refused batch reached no upstream"
        );
        assert_eq!(first.await.ok().and_then(Result::ok), Some(200), "{mode:?}");
        let refusals = pool
            .relay
            .metrics
            .pool_refusals
            .with_label_values(&["embeddings", "busy"])
            .get();
        assert_eq!(refusals, 1, "{mode:?}: counted");
    }
}

/// When the account says when it has room again (its requests-per-minute window frees), the
/// refused batch is told that time, not the default second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_batch_is_told_the_soonest_known_reset() {
    for mode in MODES {
        let pool = Setup::new(
            vec![Account {
                rpm: 1,
                ..openai("only")
            }],
            vec![open_key("alice")],
        )
        .start(mode)
        .await;
        let first = pool.embed("alice", batch(&["first"])).await;
        assert_eq!(first.status, 200, "{mode:?}: {first:?}");
        let refused = pool.embed("alice", batch(&["second"])).await;
        assert_eq!(refused.status, 429, "{mode:?}: {refused:?}");
        assert!(refused.took < Duration::from_secs(2), "{mode:?}: at once");
        let secs: u64 = refused
            .header("retry-after")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        assert!(
            (2..=60).contains(&secs),
            "{mode:?}: the minute window's reset, not the default: {refused:?}"
        );
        assert_eq!(pool.seen("only", "/v1/embeddings"), 1, "{mode:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_endpoint_lists_and_budgets_hold_on_the_new_endpoints() {
    for mode in MODES {
        let keys = vec![
            Key {
                endpoints: &["chat_completions"],
                ..open_key("chatter")
            },
            Key {
                endpoints: &["embeddings"],
                ..open_key("embedder")
            },
            Key {
                budget_total_usd: 1.0,
                ..open_key("budgeted")
            },
        ];
        let pool = Setup::new(vec![openai("gpt"), reranker("cohere")], keys)
            .start(mode)
            .await;
        let refused = pool.embed("chatter", batch(&["x"])).await;
        assert_eq!(refused.status, 403, "{mode:?}: {refused:?}");
        assert_eq!(refused.body["error"]["code"], json!("endpoint_not_allowed"));
        let refused = pool
            .post("chatter", "/v2/rerank", rerank_body(&["a"]), &[])
            .await;
        assert_eq!(refused.status, 403, "{mode:?}: {refused:?}");
        assert!(
            refused.body["message"]
                .as_str()
                .is_some_and(|m| m.contains("rerank")),
            "{mode:?}: Cohere's error shape: {refused:?}"
        );
        let allowed = pool.embed("embedder", batch(&["x"])).await;
        assert_eq!(allowed.status, 200, "{mode:?}: {allowed:?}");
        let chat = pool
            .post(
                "embedder",
                "/v1/chat/completions",
                json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}),
                &[],
            )
            .await;
        assert_eq!(
            chat.status, 403,
            "{mode:?}: a list keeps its list: {chat:?}"
        );

        // $1 in total: reranks at $0.50 a search unit, then embeddings at $0.30 a batch.
        for n in 0..2 {
            let answer = pool
                .post("budgeted", "/v2/rerank", rerank_body(&["a", "b"]), &[])
                .await;
            assert_eq!(answer.status, 200, "{mode:?} rerank {n}: {answer:?}");
        }
        let spent = eventually(Duration::from_secs(15), || async {
            let (cost, _) = pool.spent("budgeted").await;
            ((cost - 2.0 * PER_SEARCH_UNIT).abs() < 1e-6).then_some(cost)
        })
        .await;
        assert!(
            spent.is_ok(),
            "{mode:?}: two search units charged: {:?}",
            pool.spent("budgeted").await
        );
        let over = eventually(Duration::from_secs(15), || async {
            let answer = pool.embed("budgeted", batch(&["hello world"])).await;
            (answer.status == 402).then_some(answer)
        })
        .await
        .unwrap_or_else(|_| panic!("{mode:?}: the used-up budget was not refused"));
        assert_eq!(over.body["error"]["type"], json!("insufficient_quota"));
        assert_eq!(over.header("x-should-retry"), Some("false"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_is_served_in_cohere_format_and_charged_per_search_unit() {
    for mode in MODES {
        let pool = Setup::new(vec![reranker("cohere")], vec![open_key("alice")])
            .start(mode)
            .await;
        let documents = ["an unrelated text", "a rust pool of accounts", "pool party"];
        let mut body = rerank_body(&documents);
        body["top_n"] = json!(2);
        let answer = pool.post("alice", "/v2/rerank", body, &[]).await;
        assert_eq!(answer.status, 200, "{mode:?}: {answer:?}");
        let results = answer.body["results"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(results.len(), 2, "{mode:?}: top_n: {answer:?}");
        assert_eq!(
            results[0]["index"],
            json!(1),
            "{mode:?}: reranked: {answer:?}"
        );
        assert!(results[0]["relevance_score"].as_f64().is_some());
        assert_eq!(answer.header("x-poolgate-reranked"), None, "{mode:?}");
        // v1 reaches the upstream's v1, with its documents when asked.
        let v1 = pool
            .post(
                "alice",
                "/v1/rerank",
                json!({"model": RERANK_MODEL, "query": "pool", "documents": ["pool"], "return_documents": true}),
                &[],
            )
            .await;
        assert_eq!(v1.status, 200, "{mode:?}: {v1:?}");
        assert_eq!(v1.body["results"][0]["document"], json!({"text": "pool"}));
        assert_eq!(pool.seen("cohere", "/v2/rerank"), 1, "{mode:?}");
        assert_eq!(pool.seen("cohere", "/v1/rerank"), 1, "{mode:?}");
        // 250 documents are 3 search units.
        let many: Vec<String> = (0..250).map(|n| format!("document {n}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let answer = pool
            .post("alice", "/v2/rerank", rerank_body(&many), &[])
            .await;
        assert_eq!(answer.status, 200, "{mode:?}");
        let expected = (1.0 + 1.0 + 3.0) * PER_SEARCH_UNIT;
        let charged = eventually(Duration::from_secs(15), || async {
            let (cost, requests) = pool.spent("alice").await;
            (requests == 3 && (cost - expected).abs() < 1e-6).then_some(())
        })
        .await;
        assert!(
            charged.is_ok(),
            "{mode:?}: expected ${expected}: {:?}",
            pool.spent("alice").await
        );
    }
}

/// Every rerank account broken: the request's answer with and without the passthrough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_degrades_to_the_recall_order_only_when_asked_and_is_never_charged() {
    for (mode, group_passthrough) in [
        (Mode::Standalone, false),
        (Mode::Distributed, false),
        (Mode::Standalone, true),
        (Mode::Distributed, true),
    ] {
        let setup = Setup {
            group_passthrough,
            ..Setup::new(
                vec![reranker("first"), reranker("second")],
                vec![open_key("alice")],
            )
        };
        let pool = setup.start(mode).await;
        pool.upstream.set_standing_answer(Some(Scripted::Fail {
            status: 503,
            headers: vec![("content-type".into(), "application/json".into())],
            body: r#"{"message":"service unavailable"}"#.into(),
        }));
        let documents = ["zero", "one", "two", "three"];
        let mut body = rerank_body(&documents);
        body["top_n"] = json!(3);

        let (passthrough, refused): (Headers, Headers) = if group_passthrough {
            (&[], &[("x-poolgate-rerank-fallback", "error")])
        } else {
            (&[("x-poolgate-rerank-fallback", "passthrough")], &[])
        };
        let error = pool
            .post("alice", "/v2/rerank", body.clone(), refused)
            .await;
        assert_eq!(error.status, 429, "{mode:?}/{group_passthrough}: {error:?}");
        assert!(
            error.body["message"].is_string(),
            "Cohere's shape: {error:?}"
        );
        assert!(error.header("retry-after").is_some());

        let degraded = pool
            .post("alice", "/v2/rerank", body.clone(), passthrough)
            .await;
        assert_eq!(
            degraded.status, 200,
            "{mode:?}/{group_passthrough}: {degraded:?}"
        );
        assert_eq!(degraded.header("x-poolgate-reranked"), Some("false"));
        let results = degraded.body["results"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(results.len(), 3, "top_n holds: {degraded:?}");
        for (position, result) in results.iter().enumerate() {
            assert_eq!(
                result["index"],
                json!(position),
                "the recall order: {degraded:?}"
            );
            assert!(
                result["relevance_score"].is_null(),
                "no invented score: {degraded:?}"
            );
        }
        assert_eq!(degraded.body["poolgate"]["reranked"], json!(false));
        let reason = degraded.body["poolgate"]["reason"]
            .as_str()
            .unwrap_or_default();
        let degradations = pool
            .relay
            .metrics
            .rerank_degraded
            .with_label_values(&[reason])
            .get();
        assert_eq!(
            degradations, 1,
            "{mode:?}/{group_passthrough}: counted once"
        );

        // A client's own bad request is its error, passthrough or not.
        let mut empty = body.clone();
        empty["documents"] = json!([]);
        let bad = pool.post("alice", "/v2/rerank", empty, passthrough).await;
        assert_eq!(bad.status, 400, "{mode:?}: {bad:?}");
        assert_eq!(
            bad.body["message"],
            json!("invalid request: list of documents must not be empty")
        );

        // Nothing was charged: no account served.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let (cost, requests) = pool.spent("alice").await;
        assert_eq!(
            (cost, requests),
            (0.0, 0),
            "{mode:?}: {:?}",
            (cost, requests)
        );
    }
}

/// An embeddings-only account and a rerank account, suspected of a refused credential: the
/// confirmation probe asks each for what it serves, gets a healthy answer, and the account
/// stays in service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_only_and_rerank_accounts_get_a_probe_they_answer() {
    for mode in MODES {
        let specs = [
            Spec {
                serves: &["embeddings"],
                ..Spec::api_key("vectors", Platform::OpenAi, 0)
            },
            Spec::api_key("ranks", Platform::Rerank, 0),
        ];
        let options = Options {
            probe: support::quick_probe(),
            ..Options::default()
        };
        let pool = support::Pool::start(mode, &specs, options).await;
        let unauthorized = |body: &str| Scripted::Fail {
            status: 401,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.into(),
        };
        pool.upstream.script_clients(
            "cred-vectors",
            [unauthorized(
                r#"{"error":{"message":"bad key","type":"invalid_request_error","code":"invalid_api_key"}}"#,
            )],
        );
        pool.upstream.script_clients(
            "cred-ranks",
            [unauthorized(r#"{"message":"invalid api token"}"#)],
        );
        // Each path's only account refused: the pool cannot take the request now.
        let (status, body) = pool
            .send(
                0,
                "/v1/embeddings",
                &json!({"model": EMBEDDING_MODEL, "input": "x"}),
            )
            .await;
        assert_eq!(status, 429, "{mode:?}: {body}");
        let (status, body) = pool
            .send(
                0,
                "/v2/rerank",
                &json!({"model": RERANK_MODEL, "query": "q", "documents": ["d"]}),
            )
            .await;
        assert_eq!(status, 429, "{mode:?}: {body}");
        for (credential, path) in [
            ("cred-vectors", "/v1/embeddings"),
            ("cred-ranks", "/v1/rerank"),
        ] {
            let probed = eventually(Duration::from_secs(15), || async {
                let probes = pool.upstream.probes(credential);
                (!probes.is_empty()).then_some(probes)
            })
            .await
            .unwrap_or_else(|_| panic!("{mode:?}: {credential} was not probed"));
            assert!(
                probed.iter().all(|p| p.path == path),
                "{mode:?}: {credential} probed on {:?}",
                probed.iter().map(|p| p.path.clone()).collect::<Vec<_>>()
            );
        }
        // The probes' healthy answers leave both in service.
        let served = eventually(Duration::from_secs(15), || async {
            let (status, _) = pool
                .send(
                    0,
                    "/v1/embeddings",
                    &json!({"model": EMBEDDING_MODEL, "input": "x"}),
                )
                .await;
            (status == 200).then_some(())
        })
        .await;
        assert!(
            served.is_ok(),
            "{mode:?}: {}",
            pool.health_of("vectors").await
        );
        let served = eventually(Duration::from_secs(15), || async {
            let (status, _) = pool
                .send(
                    0,
                    "/v2/rerank",
                    &json!({"model": RERANK_MODEL, "query": "q", "documents": ["d"]}),
                )
                .await;
            (status == 200).then_some(())
        })
        .await;
        assert!(
            served.is_ok(),
            "{mode:?}: {}",
            pool.health_of("ranks").await
        );
    }
}
