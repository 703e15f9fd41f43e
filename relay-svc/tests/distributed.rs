//! The distributed stack end to end: relay → selector (Postgres + Redis) and admission (Redis)
//! over gRPC, against the fake upstream. Real Postgres and Redis, private to the test.

use crate::common;

use common::account;

use std::sync::Arc;
use std::time::Duration;

use poolgate_runtime::redis_keys::AccountKeys;
use poolgate_testkit::fake_upstream::{FakeUpstream, Scripted};
use poolgate_testkit::{PostgresServer, RedisServer, eventually};

use relay_svc::proxy::RelaySettings;

use poolgate_core::account::Price;
use selector_svc::store::PostgresSource;
use serde_json::{Value, json};

struct Stack {
    _postgres: PostgresServer,
    redis: RedisServer,
    store: PostgresSource,
    upstream: FakeUpstream,
    base: String,
    key: String,
    key_id: i64,
    http: reqwest::Client,
    _selector: selector_svc::server::Built,
    admission: Arc<poolgate_lease::LeaseEngine>,
}

async fn start() -> Stack {
    start_with(poolgate_core::lease::Settings::default()).await
}

async fn start_with(admission_settings: poolgate_core::lease::Settings) -> Stack {
    start_edge(admission_settings, Default::default()).await
}

/// [`start_with`], the relay selecting at the edge with `edge`.
async fn start_edge(
    admission_settings: poolgate_core::lease::Settings,
    edge: poolgate_client::edge::EdgeSelectionSettings,
) -> Stack {
    let backends = common::backends().await.expect("backends start");
    let upstream = FakeUpstream::start().await.expect("upstream");
    for name in ["a", "b"] {
        backends
            .store
            .upsert_account(&account(name, &upstream.base_url, 2, 0))
            .await
            .expect("account");
    }
    backends
        .store
        .set_price(
            "claude-x",
            Price {
                input_per_mtok: 3.0,
                output_per_mtok: 15.0,
                ..Price::default()
            },
        )
        .await
        .expect("price");
    let (key_id, key) = backends
        .store
        .create_api_key("test", "alice", "default", 0)
        .await
        .expect("key");
    let (selector, selector_addr) = common::selector(&backends).await.expect("selector starts");
    let (admission, admission_addr) = common::admission(&backends.redis.url(), admission_settings)
        .await
        .expect("admission starts");
    let (_, addr) = common::relay_with_edge(
        vec![format!("http://{selector_addr}")],
        vec![format!("http://{admission_addr}")],
        RelaySettings {
            max_wait: Duration::from_secs(10),
            ..RelaySettings::default()
        },
        Some(edge),
    )
    .await
    .expect("relay starts");
    let common::Backends {
        postgres,
        redis,
        store,
        ..
    } = backends;
    Stack {
        _postgres: postgres,
        redis,
        store,
        upstream,
        base: format!("http://{addr}"),
        key: key.expose().to_owned(),
        key_id,
        http: reqwest::Client::new(),
        _selector: selector,
        admission,
    }
}

impl Stack {
    async fn message(&self, stream: bool) -> (u16, String) {
        let response = self
            .http
            .post(format!("{}/v1/messages", self.base))
            .header("x-api-key", &self.key)
            .json(&json!({"model": "claude-x", "max_tokens": 8, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .expect("relay answers");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }

    async fn leases(&self, account: i64) -> u32 {
        let mut conn = self.redis.client().await.expect("redis");
        redis::cmd("ZCOUNT")
            .arg(AccountKeys::new(account).leases)
            .arg(0)
            .arg("+inf")
            .query_async(&mut conn)
            .await
            .expect("zcount")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_flow_through_selector_and_admission_and_never_exceed_the_limits() {
    let stack = Arc::new(start().await);
    let (status, body) = stack.message(false).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = stack.message(true).await;
    assert_eq!(status, 200);
    assert!(body.contains("message_stop"), "{body}");

    stack.upstream.set_delay(Duration::from_millis(80));
    let requests: Vec<_> = (0..100)
        .map(|n| {
            let stack = stack.clone();
            tokio::spawn(async move { stack.message(n % 2 == 0).await.0 })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.expect("task"), 200);
    }
    for credential in ["cred-a", "cred-b"] {
        let peak = stack.upstream.stats(credential).peak;
        assert!(
            peak <= 2,
            "{credential} saw {peak} concurrent requests, limit 2"
        );
    }
    // Every lease was released: the counts go back to 0 at once, not after a ttl.
    eventually(Duration::from_secs(3), || async {
        (stack.leases(1).await + stack.leases(2).await == 0).then_some(())
    })
    .await
    .expect("no lease left");
    // Usage reached Postgres in batches, priced.
    let usage = eventually(Duration::from_secs(5), || async {
        let totals = stack
            .store
            .read_usage(stack.key_id, 0, poolgate_core::now_ms() + 3_600_000)
            .await
            .ok()?;
        (totals.requests >= 102).then_some(totals)
    })
    .await
    .expect("usage recorded");
    assert!(usage.cost_usd > 0.0, "{usage:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_window_hard_blocks_the_account_in_redis_for_every_replica() {
    let stack = start().await;
    let reset = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 7200)
        .to_string();
    // Whichever account goes first gets the exhausted window.
    for credential in ["cred-a", "cred-b"] {
        stack.upstream.script(
            credential,
            [Scripted::Fail {
                status: 429,
                headers: vec![
                    (
                        "anthropic-ratelimit-unified-status".into(),
                        "rejected".into(),
                    ),
                    ("anthropic-ratelimit-unified-reset".into(), reset.clone()),
                ],
                body: r#"{"type":"error","error":{"type":"rate_limit_error","message":"window"}}"#
                    .into(),
            }],
        );
    }
    let (status, _) = stack.message(false).await;
    assert_eq!(
        status, 429,
        "both windows exhausted: the last upstream error as it came"
    );
    let mut conn = stack.redis.client().await.expect("redis");
    for account in [1, 2] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(AccountKeys::new(account).cooldown)
            .query_async(&mut conn)
            .await
            .expect("pttl");
        assert!(
            ttl > 7_000_000,
            "account {account} hard-blocked until the reset: {ttl}"
        );
    }
    let response = stack
        .http
        .post(format!("{}/v1/messages", stack.base))
        .header("x-api-key", &stack.key)
        .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": []}))
        .send()
        .await
        .expect("answer");
    assert_eq!(
        response.status().as_u16(),
        503,
        "nothing eligible for two hours: no wait that long"
    );
    assert!(response.headers().get("retry-after").is_some());
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["type"], "overloaded_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_aborts_mid_stream_frees_its_lease_long_before_the_orphan_grace() {
    // The orphan grace is 30 s: only an explicit release can free the slot within the test.
    let settings = poolgate_core::lease::Settings {
        orphan_grace: Duration::from_secs(30),
        ..poolgate_core::lease::Settings::default()
    };
    let stack = start_with(settings).await;
    stack.upstream.set_chunk_delay(Duration::from_millis(500));
    let response = stack
        .http
        .post(format!("{}/v1/messages", stack.base))
        .header("x-api-key", &stack.key)
        .json(&json!({"model": "claude-x", "max_tokens": 8, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("relay answers");
    let mut body = response.bytes_stream();
    futures_util::StreamExt::next(&mut body)
        .await
        .expect("first chunk")
        .expect("bytes");
    assert_eq!(
        stack.leases(1).await + stack.leases(2).await,
        1,
        "the stream holds one lease"
    );
    let aborted = std::time::Instant::now();
    drop(body);
    eventually(Duration::from_secs(3), || async {
        (stack.leases(1).await + stack.leases(2).await == 0).then_some(())
    })
    .await
    .expect("the lease was released, not left to the 30 s grace");
    println!(
        "lease released {:?} after the client aborted",
        aborted.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_spread_over_both_admission_replicas_and_names_are_resolved() {
    let backends = common::backends().await.expect("backends start");
    let upstream = FakeUpstream::start().await.expect("upstream");
    backends
        .store
        .upsert_account(&account("a", &upstream.base_url, 50, 0))
        .await
        .expect("account");
    let (_, key) = backends
        .store
        .create_api_key("t", "u", "default", 0)
        .await
        .expect("key");
    let (_selector, selector_addr) = common::selector(&backends).await.expect("selector starts");
    let mut engines = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..2 {
        let (engine, addr) = common::admission(&backends.redis.url(), Default::default())
            .await
            .expect("admission starts");
        engines.push(engine);
        urls.push(format!("http://{addr}"));
    }
    // A name, resolved by the relay (as a headless Service name would be).
    let addr = common::relay(
        vec![format!("http://localhost:{}", selector_addr.port())],
        urls,
        RelaySettings::default(),
    )
    .await
    .expect("relay starts");
    let http = reqwest::Client::new();
    let requests: Vec<_> = (0..40)
        .map(|_| {
            let (http, key) = (http.clone(), key.expose().to_owned());
            tokio::spawn(async move {
                http.post(format!("http://{addr}/v1/messages"))
                    .header("x-api-key", key)
                    .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.expect("task"), 200);
    }
    let granted: Vec<u64> = engines
        .iter()
        .map(|e| {
            e.metrics()
                .decisions
                .with_label_values(&["granted", "none"])
                .get()
        })
        .collect();
    assert_eq!(granted.iter().sum::<u64>(), 40);
    assert!(
        granted.iter().all(|g| *g > 0),
        "leases spread over both replicas: {granted:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_keep_succeeding_through_a_redis_outage_and_enforcement_resumes() {
    let mut stack = start().await;
    stack.upstream.set_delay(Duration::from_millis(10));
    let (status, _) = stack.message(false).await;
    assert_eq!(status, 200);
    stack.redis.kill();
    // Under the `open` policy admission falls back to its in-process limits; the selector serves
    // from its snapshot and last known health. Clients keep being served.
    let mut statuses = Vec::new();
    for n in 0..20 {
        statuses.push(stack.message(n % 2 == 0).await.0);
    }
    assert!(
        statuses.iter().all(|s| *s == 200),
        "served through the outage: {statuses:?}"
    );
    assert!(
        stack.admission.is_degraded(),
        "admission knows it is degraded"
    );
    assert_eq!(stack.admission.metrics().degraded.get(), 1);
    stack.redis.restart().await.expect("redis back, empty");
    eventually(Duration::from_secs(5), || async {
        (!stack.admission.is_degraded()).then_some(())
    })
    .await
    .expect("admission recovers");
    assert_eq!(stack.admission.metrics().degraded.get(), 0);
    // Global enforcement resumes: concurrent requests never exceed the limits again.
    stack.upstream.reset_stats();
    stack.upstream.set_delay(Duration::from_millis(40));
    let stack = Arc::new(stack);
    let requests: Vec<_> = (0..20)
        .map(|n| {
            let stack = stack.clone();
            tokio::spawn(async move { stack.message(n % 2 == 0).await.0 })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.expect("task"), 200);
    }
    for credential in ["cred-a", "cred-b"] {
        let peak = stack.upstream.stats(credential).peak;
        assert!(
            peak <= 2,
            "{credential} saw {peak} concurrent requests after recovery, limit 2"
        );
    }
    eventually(Duration::from_secs(3), || async {
        (stack.leases(1).await + stack.leases(2).await == 0).then_some(())
    })
    .await
    .expect("no lease left after recovery");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successes_are_reported_coalesced_not_one_call_per_request() {
    let stack = start().await;
    let reported = |stack: &Stack| -> u64 {
        let outcomes = &stack._selector.selector.metrics().outcomes;
        ["none", "breaker_closed"]
            .iter()
            .map(|applied| outcomes.with_label_values(&["success", applied]).get())
            .sum()
    };
    let before = reported(&stack);
    // Sent at once: one after the other, each could take a flush period on a loaded machine and
    // be reported alone.
    let statuses = futures_util::future::join_all((0..20).map(|n| stack.message(n % 2 == 0))).await;
    for (status, body) in statuses {
        assert_eq!(status, 200, "{body}");
    }
    let after = eventually(Duration::from_secs(3), || async {
        let now = reported(&stack);
        (now > before).then_some(now)
    })
    .await
    .expect("successes reach the selector");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = reported(&stack).max(after) - before;
    assert!(
        (1..20).contains(&sent),
        "20 successes on two accounts coalesced into fewer reports: {sent}"
    );
}

async fn status_of(stack: &Stack, id: i64) -> (poolgate_core::account::AccountStatus, String) {
    let account = stack.store.load_account(id).await.expect("account");
    (account.status, account.status_reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crafted_models_and_messages_sent_to_every_account_leave_every_account_active() {
    let stack = start().await;
    stack.upstream.set_known_models(&["claude-x"]);
    let crafted = [
        "insufficient_quota",
        "billing_error",
        "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
        "exceeded your current quota",
    ];
    // `b` maps every crafted model to another upstream model, so a 404 on `a` fails over to
    // `b`: each crafted request reaches both accounts.
    let mut b = account("b", &stack.upstream.base_url, 2, 0);
    b.model_mapping = crafted
        .iter()
        .map(|m| ((*m).to_owned(), format!("{m}-on-b")))
        .collect();
    stack.store.upsert_account(&b).await.expect("mapping");
    for model in crafted {
        let body = json!({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": model}], "metadata": {"user_id": model}});
        let answered = eventually(Duration::from_secs(5), || async {
            let response = stack
                .http
                .post(format!("{}/v1/messages", stack.base))
                .header("x-api-key", &stack.key)
                .json(&body)
                .send()
                .await
                .ok()?;
            let status = response.status().as_u16();
            let body: Value = response.json().await.ok()?;
            // Until the snapshot has b's mapping, the 404 may come from one account only.
            let seen = stack.upstream.seen_models();
            (status == 404 && seen.iter().any(|m| m == &format!("{model}-on-b"))).then_some(body)
        })
        .await
        .expect("a 404 from both accounts");
        assert_eq!(answered["error"]["type"], "not_found_error", "{answered}");
    }
    // Crafted text in a valid request: a success.
    let (status, _) = stack.message(false).await;
    assert_eq!(status, 200);
    for id in [1, 2] {
        let (status, reason) = status_of(&stack, id).await;
        assert_eq!(
            status,
            poolgate_core::account::AccountStatus::Active,
            "account {id}: {reason}"
        );
        let mut conn = stack.redis.client().await.expect("redis");
        let cooldown: i64 = redis::cmd("PTTL")
            .arg(AccountKeys::new(id).cooldown)
            .query_async(&mut conn)
            .await
            .expect("pttl");
        assert_eq!(cooldown, -2, "account {id}: no hard block, no confirmation");
    }
    assert!(stack.upstream.stats("cred-a").total >= 4);
    assert!(stack.upstream.stats("cred-b").total >= 4);
    assert!(
        !stack
            .upstream
            .seen_models()
            .iter()
            .any(|m| m == "claude-haiku-4-5"),
        "no answer to a crafted request was even suspected: no confirmation probe"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_really_out_of_credit_is_retired_after_the_probe_confirms_it() {
    let stack = start().await;
    stack.upstream.set_out_of_credit("cred-a", true);
    stack.upstream.set_out_of_credit("cred-b", false);
    // The order is a weighted draw: requests go on until `a` has been asked (each one has about
    // even odds; a fixed count of six missed `a` about once in 64 runs).
    for n in 0..64 {
        if stack.upstream.stats("cred-a").total > 0 {
            break;
        }
        let body = json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": format!("q{n}")}]});
        let response = stack
            .http
            .post(format!("{}/v1/messages", stack.base))
            .header("x-api-key", &stack.key)
            .json(&body)
            .send()
            .await
            .expect("answer");
        assert_eq!(response.status().as_u16(), 200, "failed over to b");
    }
    eventually(Duration::from_secs(10), || async {
        let (status, _) = status_of(&stack, 1).await;
        (status == poolgate_core::account::AccountStatus::Retired).then_some(())
    })
    .await
    .expect("a retired");
    let (_, reason) = status_of(&stack, 1).await;
    assert!(reason.contains("confirmed by probe"), "{reason}");
    let (status, _) = status_of(&stack, 2).await;
    assert_eq!(status, poolgate_core::account::AccountStatus::Active);
    let probes = stack
        .upstream
        .seen_models()
        .iter()
        .filter(|m| *m == "claude-haiku-4-5")
        .count();
    assert_eq!(probes, 1, "one probe, to a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_listed_the_same_in_both_modes() {
    let stack = start().await;
    let mut a = account("a", &stack.upstream.base_url, 2, 0);
    a.allowed_models = vec!["claude-x".into(), "claude-y".into()];
    let mut b = account("b", &stack.upstream.base_url, 2, 0);
    b.model_mapping = [("claude-z".to_owned(), "claude-upstream".to_owned())].into();
    for account in [&a, &b] {
        stack.store.upsert_account(account).await.expect("account");
    }
    let yaml = format!(
        "api_keys:\n  - {{key: pgk-standalone-models, user: alice, group: default}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{base}\", credential: cred-a, models: [claude-x, claude-y]}}\n  - {{name: b, platform: anthropic, base_url: \"{base}\", credential: cred-b, model_mapping: {{claude-z: claude-upstream}}}}\n",
        base = stack.upstream.base_url
    );
    let (_relay, standalone) = common::standalone(
        &yaml,
        RelaySettings::default(),
        poolgate_core::outcome::RuntimeBlockSettings::default(),
    )
    .await
    .expect("standalone relay starts");
    let list = |base: String, key: String, anthropic: bool| {
        let http = stack.http.clone();
        async move {
            let mut request = http.get(format!("{base}/v1/models"));
            request = if anthropic {
                request
                    .header("x-api-key", key)
                    .header("anthropic-version", "2023-06-01")
            } else {
                request.bearer_auth(key)
            };
            let response = request.send().await.ok()?;
            response.json::<Value>().await.ok()
        }
    };
    for anthropic in [true, false] {
        let expected = list(
            format!("http://{standalone}"),
            "pgk-standalone-models".into(),
            anthropic,
        )
        .await
        .expect("standalone models");
        let ids: Vec<&str> = expected["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["id"].as_str())
            .collect();
        if anthropic {
            assert_eq!(ids, ["claude-x", "claude-y", "claude-z"], "{expected}");
        } else {
            assert!(ids.is_empty(), "no OpenAI accounts: {expected}");
        }
        // The snapshot reloads on NOTIFY: wait until the distributed relay lists the same.
        eventually(Duration::from_secs(5), || {
            let list = list(stack.base.clone(), stack.key.clone(), anthropic);
            let expected = expected.clone();
            async move { (list.await? == expected).then_some(()) }
        })
        .await
        .unwrap_or_else(|_| panic!("distributed lists {expected} too"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_subscription_token_is_refreshed_once_and_the_request_succeeds_on_the_same_account()
 {
    // The refused request waits for the selector's confirmation and refresh (the answer to its
    // report carries the new token). On a loaded CI machine that can take longer than the edge's
    // 2 s write deadline, past which the request fails over instead (held by
    // `selector_outage.rs`); here the deadline is long, so the test is about the refresh alone.
    let stack = start_edge(
        poolgate_core::lease::Settings::default(),
        poolgate_client::edge::EdgeSelectionSettings {
            write_deadline: Duration::from_secs(30),
            ..Default::default()
        },
    )
    .await;
    // A Claude subscription account whose access token the upstream no longer accepts; it is
    // not near expiry, so only the refusal can trigger the refresh.
    let mut sub = account("sub", &stack.upstream.base_url, 2, -1);
    sub.credential_kind = poolgate_core::account::CredentialKind::OAuth;
    sub.credential = Some(poolgate_core::account::Secret::new("revoked-access"));
    sub.oauth = Some(poolgate_core::account::OAuthState {
        refresh_token: poolgate_core::account::Secret::new("rt-1"),
        expires_at_ms: 4_102_444_800_000,
        token_url: format!("{}/oauth/token", stack.upstream.base_url),
        client_id: String::new(),
    });
    let id = stack.store.upsert_account(&sub).await.expect("account");
    stack.upstream.revoke("revoked-access");
    // Priority -1: the subscription account is tried first once the snapshot has it.
    let served = eventually(Duration::from_secs(5), || async {
        // A new conversation each time (no stickiness to an account that served before the
        // snapshot had the subscription account).
        let response = stack
            .http
            .post(format!("{}/v1/messages", stack.base))
            .header("x-api-key", &stack.key)
            .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": format!("hi {}", fastrand::u64(..))}]}))
            .send()
            .await
            .ok()?;
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        let on_sub = stack.upstream.seen_requests().iter().any(|r| {
            r.headers.get("authorization").and_then(|v| v.to_str().ok())
                == Some("Bearer rt-1-access")
        });
        (on_sub).then_some((status, body))
    })
    .await
    .expect("the request was retried on the subscription account with the new token");
    assert_eq!(served.0, 200, "{}", served.1);
    // The refused request itself was retried on the same account with the new token, after the
    // selector confirmed the refusal on the usage endpoint the official CLI reads (the stored,
    // revoked token refused there too), not with an inference probe.
    let seen = stack.upstream.seen_requests();
    let bearer = |r: &poolgate_testkit::fake_upstream::SeenRequest| {
        r.headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let refused = seen
        .iter()
        .position(|r| bearer(r).as_deref() == Some("Bearer revoked-access"))
        .expect("the revoked token was used once");
    assert!(
        stack.upstream.usage_calls("revoked-access") >= 1,
        "the usage endpoint confirmed the refusal"
    );
    assert_eq!(
        stack.upstream.probe_count("revoked-access"),
        0,
        "no inference probe"
    );
    // The refused request goes again: on the same account with the new token, or, when the
    // refresh lands after the request's refusal wait (a loaded machine), on another account;
    // either way it is served, never lost.
    let again = seen[refused + 1..]
        .iter()
        .find(|r| r.body["messages"] == seen[refused].body["messages"])
        .expect("the refused request was sent again");
    let new_token = seen[refused + 1..]
        .iter()
        .any(|r| bearer(r).as_deref() == Some("Bearer rt-1-access"));
    assert!(new_token, "the account serves with the new token");
    assert_ne!(bearer(again).as_deref(), Some("Bearer revoked-access"));
    let refreshes = stack.upstream.token_requests();
    assert_eq!(refreshes.len(), 1, "refreshed once: {refreshes:?}");
    assert_eq!(
        refreshes[0]["client_id"],
        poolgate_core::account::default_oauth_client_id(
            poolgate_core::account::Platform::Anthropic
        )
    );
    // The first refusal did not count against the account.
    let account = stack.store.load_account(id).await.expect("account");
    assert_eq!(
        account.status,
        poolgate_core::account::AccountStatus::Active
    );
    assert_eq!(account.credential.expose(), "rt-1-access");
    let mut conn = stack.redis.client().await.expect("redis");
    let cooldown: i64 = redis::cmd("PTTL")
        .arg(AccountKeys::new(id).cooldown)
        .query_async(&mut conn)
        .await
        .expect("pttl");
    assert_eq!(
        cooldown, -2,
        "no hard block for a refusal the refresh fixed"
    );
}
