//! Prices keep budgets honest (docs/DESIGN.md §6, "Prices"), in both modes: a model with a price
//! in the shipped catalogue is charged it with no price configured; a model with none (released
//! tomorrow) is charged its family's highest catalogue price, never $0, and counted in
//! `relay_unpriced_usage_total{pricing="fallback"}`; where the operator refuses unpriced models
//! (YAML `unpriced: refuse`, the selector's `--unpriced refuse`), a key with a budget is refused
//! such a model (403 naming it, no upstream call) and a key without one is served at $0, counted
//! as `pricing="none"`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use poolgate_core::account::Platform;
use poolgate_core::price::UnpricedPolicy;
use poolgate_operator::grpc::SelectorAdmin;
use poolgate_proto::selector::v1 as spb;
use poolgate_select::engine::SelectorSettings;
use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::FakeUpstream;
use relay_svc::proxy::{Relay, RelaySettings};
use serde_json::{Value, json};

/// The fake upstream's answers: 10 input and 7 output tokens each.
const INPUT: f64 = 10.0;
const OUTPUT: f64 = 7.0;

/// A relay over one Anthropic account, with a key that has a budget and one that has none.
struct Pool {
    upstream: FakeUpstream,
    base: String,
    http: reqwest::Client,
    relay: Arc<Relay>,
    budgeted: String,
    open: String,
    _running: Box<dyn std::any::Any + Send>,
}

async fn standalone(policy: UnpricedPolicy) -> Pool {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let (budgeted, open) = ("pgk-budgeted-key-0001", "pgk-open-key-0001");
    let yaml = format!(
        "unpriced: {}\napi_keys:\n  - {{key: {budgeted}, user: alice, budget_usd: {{total: 100}}}}\n  - {{key: {open}, user: bob}}\n\
         accounts:\n  - {{name: claude, platform: anthropic, base_url: \"{}\", credential: cred-claude, concurrency: 8}}\n",
        policy.as_str(),
        upstream.base_url
    );
    let (relay, addr) = common::standalone(&yaml, RelaySettings::default(), Default::default())
        .await
        .expect("standalone relay starts");
    Pool {
        upstream,
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
        relay,
        budgeted: budgeted.into(),
        open: open.into(),
        _running: Box::new(()),
    }
}

async fn distributed(policy: UnpricedPolicy) -> Pool {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let backends = common::backends().await.expect("backends start");
    let mut account = common::account("claude", &upstream.base_url, 8, 0);
    account.platform = Platform::Anthropic;
    backends
        .store
        .upsert_account(&account)
        .await
        .expect("account");
    let settings = SelectorSettings {
        unpriced: policy,
        ..SelectorSettings::default()
    };
    let (selector, selector_addr) = common::selector_with(&backends, settings)
        .await
        .expect("selector starts");
    let (admission, admission_addr) = common::admission(&backends.redis.url(), Default::default())
        .await
        .expect("admission starts");
    let (relay, addr) = common::relay_with_handle(
        vec![format!("http://{selector_addr}")],
        vec![format!("http://{admission_addr}")],
        RelaySettings::default(),
    )
    .await
    .expect("relay starts");
    let mut admin = SelectorAdmin::connect(
        &format!("http://{selector_addr}"),
        common::ADMIN_TOKEN,
        Some(common::SERVICE_TOKEN),
    )
    .await
    .expect("the admin API answers")
    .client();
    let mut keys = Vec::new();
    for (user, budget) in [("alice", 100.0), ("bob", 0.0)] {
        let request = spb::CreateApiKeyRequest {
            user: user.into(),
            group: "default".into(),
            name: user.into(),
            key_budget_total_usd: budget,
            ..Default::default()
        };
        let created = admin
            .create_api_key(request)
            .await
            .expect("the key is created")
            .into_inner();
        keys.push(created.api_key);
    }
    let open = keys.pop().expect("bob's key");
    let budgeted = keys.pop().expect("alice's key");
    Pool {
        upstream,
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
        relay,
        budgeted,
        open,
        _running: Box::new((backends, selector, admission)),
    }
}

impl Pool {
    /// A Messages request for `model` with `key`: status and body.
    async fn send(&self, key: &str, model: &str) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}/v1/messages", self.base))
            .header("x-api-key", key)
            .header("anthropic-version", "2023-06-01")
            .json(&json!({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .expect("the relay answers");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// The key's total cost once its usage shows `requests` served.
    async fn total_cost(&self, key: &str, requests: i64) -> f64 {
        self.view(key, requests).await["usage"]["total"]["cost_usd"]
            .as_f64()
            .expect("a cost")
    }

    /// The key's self-service view once its usage shows `requests` served.
    async fn view(&self, key: &str, requests: i64) -> Value {
        eventually(Duration::from_secs(15), || async {
            let response = self
                .http
                .get(format!("{}/v1/poolgate/key", self.base))
                .bearer_auth(key)
                .send()
                .await
                .ok()?;
            let view: Value = response.json().await.ok()?;
            (view["usage"]["total"]["requests"] == requests).then_some(view)
        })
        .await
        .unwrap_or_else(|error| panic!("{requests} requests in the usage: {error}"))
    }

    fn unpriced(&self, pricing: &str) -> u64 {
        self.relay
            .metrics
            .unpriced_usage
            .with_label_values(&[pricing])
            .get()
    }
}

fn cost(input_per_mtok: f64, output_per_mtok: f64) -> f64 {
    (INPUT * input_per_mtok + OUTPUT * output_per_mtok) / 1e6
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

async fn the_catalogue_prices_a_model_and_a_model_released_tomorrow_costs_its_familys_highest(
    pool: Pool,
) {
    // In the catalogue: Claude Code's `haiku`, at its published price, no price configured.
    let (status, _) = pool.send(&pool.budgeted, "claude-haiku-5-5").await;
    assert_eq!(status, 200);
    let haiku = pool.total_cost(&pool.budgeted, 1).await;
    assert!(close(haiku, cost(0.10, 0.50)), "{haiku}");
    assert_eq!(pool.unpriced("fallback"), 0);
    // Not in it: Opus 4.6–5's 5/25 (the family's highest), never $0.
    let (status, _) = pool.send(&pool.budgeted, "claude-opus-6").await;
    assert_eq!(status, 200);
    let both = pool.total_cost(&pool.budgeted, 2).await;
    assert!(close(both - haiku, cost(5.0, 25.0)), "{}", both - haiku);
    eventually(Duration::from_secs(5), || async {
        (pool.unpriced("fallback") == 1).then_some(())
    })
    .await
    .expect("counted as priced by the fallback");
    // The key's holder sees which price each model was charged at, the fallback's too.
    let view = pool.view(&pool.budgeted, 2).await;
    let models: Vec<(String, String)> = view["usage"]["month"]["models"]
        .as_array()
        .unwrap_or_else(|| panic!("the month's models in {view}"))
        .iter()
        .map(|m| {
            (
                m["model"].as_str().unwrap_or_default().to_owned(),
                m["price_source"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        models,
        [
            ("claude-haiku-5-5".to_owned(), "catalogue".to_owned()),
            ("claude-opus-6".to_owned(), "fallback".to_owned()),
        ]
    );
}

async fn where_unpriced_models_are_refused_a_budgeted_key_gets_403_naming_the_model(pool: Pool) {
    let before = pool.upstream.seen_requests().len();
    let (status, body) = pool.send(&pool.budgeted, "claude-opus-6").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["type"], "permission_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("claude-opus-6"), "{message}");
    assert_eq!(
        pool.upstream.seen_requests().len(),
        before,
        "no upstream call"
    );
    assert_eq!(
        pool.relay
            .metrics
            .key_refusals
            .with_label_values(&["unpriced"])
            .get(),
        1
    );
    // A catalogue model is still served to it.
    let (status, _) = pool.send(&pool.budgeted, "claude-haiku-5-5").await;
    assert_eq!(status, 200);
    // A key without a budget is served the unpriced model, at $0, counted.
    let (status, _) = pool.send(&pool.open, "claude-opus-6").await;
    assert_eq!(status, 200);
    assert_eq!(pool.total_cost(&pool.open, 1).await, 0.0);
    eventually(Duration::from_secs(5), || async {
        (pool.unpriced("none") == 1).then_some(())
    })
    .await
    .expect("counted as unpriced");
}

macro_rules! prices_suite {
    ($mode:ident) => {
        mod $mode {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_catalogue_prices_a_model_and_a_model_released_tomorrow_costs_its_familys_highest()
             {
                super::the_catalogue_prices_a_model_and_a_model_released_tomorrow_costs_its_familys_highest(
                    super::$mode(UnpricedPolicy::Fallback).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn where_unpriced_models_are_refused_a_budgeted_key_gets_403_naming_the_model() {
                super::where_unpriced_models_are_refused_a_budgeted_key_gets_403_naming_the_model(
                    super::$mode(UnpricedPolicy::Refuse).await,
                )
                .await;
            }
        }
    };
}

prices_suite!(standalone);
prices_suite!(distributed);
