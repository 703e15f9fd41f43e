//! Every Redis key poolgate writes is bounded (docs/DESIGN.md §3, "What each key holds and how
//! long"): a mixed workload through the distributed stack — leases and waiters, RPM events,
//! usage windows, client keys with TPM and budgets, sticky and response bindings, soft and hard
//! blocks, a breaker, a confirmation and its probe, a token refresh, usage reads, the wake
//! channel's waiters — and then every key in Redis either carries an expiry or is one of the few
//! the design lists as bounded otherwise (one per client key, one per replica).

use crate::support::{self, Mode, Options, Spec};

use std::collections::BTreeMap;
use std::time::Duration;

use poolgate_core::account::Platform;
use poolgate_core::lease::KeyLimits;
use poolgate_testkit::fake_upstream::{Scripted, Window, WindowBudgets};
use serde_json::json;

/// The keys without an expiry the design states a bound for (docs/DESIGN.md §3): a client key's
/// total-budget counter (one per key with a total budget: its lifetime spend, which only the
/// ledger could rebuild) and the bindings' epoch (one key).
fn bounded_without_expiry(key: &str) -> bool {
    (key.starts_with("pg:{k:") && key.ends_with("}:spend:t")) || key == "pg:sel:bindings-since"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_mixed_workload_every_redis_key_has_an_expiry_or_a_stated_bound() {
    let specs = [
        Spec {
            concurrency: 1,
            ..Spec::api_key("claude", Platform::Anthropic, 0)
        },
        Spec::oauth("sub", "access-sub", "refresh-sub", 1),
        Spec::api_key("gpt", Platform::OpenAi, 0),
        Spec::api_key("gpt-b", Platform::OpenAi, 1),
    ];
    let options = Options {
        probe: support::quick_probe(),
        ..Options::default()
    };
    let pool = support::Pool::start(Mode::Distributed, &specs, options).await;
    let backends = pool.backends().expect("the distributed stack");
    // A client key with every limit: TPM, budgets, concurrency.
    let limits = KeyLimits {
        concurrency_limit: 4,
        tpm_limit: 1_000_000,
        budget_total_micros: 1_000_000_000,
        budget_day_micros: 1_000_000_000,
        budget_week_micros: 1_000_000_000,
        budget_month_micros: 1_000_000_000,
        ..KeyLimits::default()
    };
    let (_, limited) = backends
        .store
        .create_api_key_with_limits(
            "limited",
            "carol",
            "default",
            1_000,
            &Default::default(),
            &limits,
        )
        .await
        .expect("a limited key");
    let limited = limited.expose().to_owned();
    pool.upstream.set_windows(
        "cred-claude",
        WindowBudgets {
            five_hour: Some(Window::new(Duration::from_secs(5 * 3600), 1_000)),
            weekly: Some(Window::new(Duration::from_secs(7 * 86_400), 10_000)),
            ..WindowBudgets::default()
        },
    );

    // Sessions (sticky bindings), in parallel on a one-slot account (waiters, the wake channel).
    pool.upstream
        .script_clients("cred-claude", [Scripted::Delay(Duration::from_millis(300))]);
    let pool = &pool;
    let mut sent = Vec::new();
    for n in 0..4 {
        let body = json!({
            "model": "claude-x",
            "max_tokens": 8,
            "metadata": {"user_id": format!("user_1_account_2_session_{n}")},
            "messages": [{"role": "user", "content": format!("hi {n}")}],
        });
        sent.push(async move { pool.send(n, "/v1/messages", &body).await });
    }
    for (status, body) in futures_util::future::join_all(sent).await {
        assert_eq!(status, 200, "{body}");
    }
    // Held requests with the limited key: its leases, TPM, budgets and RPM, the account's leases
    // and waiters, scanned while they are in flight.
    pool.upstream.set_delay(Duration::from_secs(2));
    let base = pool.bases[0].clone();
    let held: Vec<_> = (0..3)
        .map(|n| {
            let request = pool
                .http
                .post(format!("{base}/v1/messages"))
                .header("x-api-key", &limited)
                .header("anthropic-version", "2023-06-01")
                .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": format!("held {n}")}]}));
            tokio::spawn(async move { request.send().await.map(|r| r.status().as_u16()) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut redis = backends.redis.client().await.expect("redis");
    let during = scan(&mut redis).await;
    assert_bounded(&during);
    for request in held {
        assert_eq!(request.await.ok().and_then(Result::ok), Some(200));
    }
    pool.upstream.set_delay(Duration::ZERO);

    // Responses (a response binding), chat.
    let (status, body) = pool
        .send(
            0,
            "/v1/responses",
            &json!({"model": "gpt-x", "input": "hi"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // A busy answer (soft block), a broken one confirmed by the probe (hard block, breaker,
    // confirmation lock).
    pool.upstream.script_clients(
        "cred-gpt",
        [Scripted::Fail {
            status: 429,
            headers: vec![("retry-after".into(), "30".into())],
            body: r#"{"error":{"type":"rate_limit_error","message":"slow down"}}"#.into(),
        }],
    );
    pool.upstream.script(
        "cred-gpt-b",
        [
            Scripted::Fail {
                status: 500,
                headers: vec![],
                body: r#"{"error":{"type":"server_error","message":"boom"}}"#.into(),
            },
            Scripted::Fail {
                status: 500,
                headers: vec![],
                body: r#"{"error":{"type":"server_error","message":"boom"}}"#.into(),
            },
        ],
    );
    for _ in 0..3 {
        pool.send(
            0,
            "/v1/chat/completions",
            &json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    }
    // A refused subscription token: a refresh (its lock) and the usage endpoint's read.
    pool.upstream.revoke("access-sub");
    pool.upstream.set_standing_answer(None);
    for _ in 0..2 {
        pool.send(
            0,
            "/v1/messages",
            &json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "sub"}]}),
        )
        .await;
    }
    // Let the confirmations, reports and usage records land.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut redis = backends.redis.client().await.expect("redis");
    let after = scan(&mut redis).await;
    assert_bounded(&after);
    let mut seen: Vec<String> = during.keys().chain(after.keys()).cloned().collect();
    seen.sort();
    seen.dedup();
    // The workload wrote what it meant to: each kind of key is there.
    for prefix in [
        "pg:{k:",
        "pg:{u:carol}:rpm",
        "pg:{a:1}:leases",
        "pg:sel:sticky:",
        "pg:sel:resp:",
        "pg:sel:soft:",
        "pg:sel:{a:",
    ] {
        assert!(
            seen.iter().any(|key| key.starts_with(prefix)),
            "no {prefix}* key: {seen:?}"
        );
    }
}

/// Every key in Redis with its `PTTL` (ms; -1: no expiry).
async fn scan(redis: &mut redis::aio::MultiplexedConnection) -> BTreeMap<String, i64> {
    let mut cursor = 0u64;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(redis)
            .await
            .expect("scan");
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let mut expiries = BTreeMap::new();
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(redis)
            .await
            .expect("pttl");
        expiries.insert(key, ttl);
    }
    expiries
}

fn assert_bounded(expiries: &BTreeMap<String, i64>) {
    eprintln!("{} keys:", expiries.len());
    for (key, ttl) in expiries {
        eprintln!("  {key}: {ttl} ms");
    }
    let unbounded: Vec<&String> = expiries
        .iter()
        .filter(|(key, ttl)| **ttl == -1 && !bounded_without_expiry(key))
        .map(|(key, _)| key)
        .collect();
    assert!(
        unbounded.is_empty(),
        "keys with neither an expiry nor a stated bound: {unbounded:?}"
    );
}

/// Redis wiped under load (docs/DESIGN.md §3, "When Redis is wiped"), through the distributed
/// stack: no request fails, and no account holds more than its limit across the wipe (the
/// requests in flight at it are put back before new ones are admitted); no account is out of
/// service after it (its health is re-learned from answers, never assumed); a key's total budget
/// counter is rebuilt to at least the ledger's spend within seconds of the wipe; and a response
/// made before the wipe is continued by no key, its maker's included, while the bindings that
/// would say whose it is may be gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_wipe_under_load_fails_nothing_and_serves_no_continuation_to_another_key() {
    let specs = [
        Spec {
            concurrency: 2,
            ..Spec::api_key("one", Platform::Anthropic, 0)
        },
        Spec {
            concurrency: 2,
            ..Spec::api_key("two", Platform::Anthropic, 0)
        },
        Spec::api_key("gpt", Platform::OpenAi, 0),
    ];
    let pool = support::Pool::start(Mode::Distributed, &specs, Options::default()).await;
    let backends = pool.backends().expect("the distributed stack");
    let limits = KeyLimits {
        budget_total_micros: 1_000_000_000_000,
        ..KeyLimits::default()
    };
    let (key_id, secret) = backends
        .store
        .create_api_key_with_limits(
            "budgeted",
            "dave",
            "default",
            0,
            &Default::default(),
            &limits,
        )
        .await
        .expect("a budgeted key");
    let secret = secret.expose().to_owned();
    // A key whose total budget is spent before the wipe: after it, while its counter is not yet
    // rebuilt from the ledger, it must not be served either.
    let (spent_id, spent_secret) = backends
        .store
        .create_api_key_with_limits(
            "spent",
            "erin",
            "default",
            0,
            &Default::default(),
            &KeyLimits {
                budget_total_micros: 1,
                ..KeyLimits::default()
            },
        )
        .await
        .expect("a key with a tiny budget");
    let spent_secret = spent_secret.expose().to_owned();
    let send_spent = || {
        let (http, base, secret) = (
            pool.http.clone(),
            pool.bases[0].clone(),
            spent_secret.clone(),
        );
        async move {
            http.post(format!("{base}/v1/messages"))
                .header("x-api-key", &secret)
                .header("anthropic-version", "2023-06-01")
                .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "spend"}]}))
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }
    };
    // Served once the selectors know the new key (401 until then).
    poolgate_testkit::eventually(Duration::from_secs(10), || async {
        (send_spent().await == 200).then_some(())
    })
    .await
    .expect("the budget's first request is served");
    poolgate_testkit::eventually(Duration::from_secs(10), || async {
        let recorded: f64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(cost_usd), 0) FROM usage_records WHERE api_key_id = $1",
        )
        .bind(spent_id)
        .fetch_one(backends.store.pool())
        .await
        .ok()?;
        (recorded > 0.0 && send_spent().await != 200).then_some(())
    })
    .await
    .expect("the spent key is refused, its spend in the ledger");
    // A response made before the wipe, with the pool's key.
    let (status, made) = pool
        .send(
            0,
            "/v1/responses",
            &json!({"model": "gpt-x", "input": "before"}),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let made: serde_json::Value = serde_json::from_str(&made).expect("json");
    let response_id = made["id"].as_str().expect("a response id").to_owned();

    pool.upstream.set_delay(Duration::from_millis(150));
    let base = pool.bases[0].clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|n| {
            let (http, base, secret, stop) =
                (pool.http.clone(), base.clone(), secret.clone(), stop.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let status = http
                        .post(format!("{base}/v1/messages"))
                        .header("x-api-key", &secret)
                        .header("anthropic-version", "2023-06-01")
                        .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": format!("load {n}")}]}))
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                        .unwrap_or(0);
                    statuses.push(status);
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let spent_before: f64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(cost_usd), 0) FROM usage_records WHERE api_key_id = $1",
    )
    .bind(key_id)
    .fetch_one(backends.store.pool())
    .await
    .expect("ledger");
    backends.redis.flush().await.expect("flushed");
    // The spent key right after the wipe, its counter gone: refused still (the accounts
    // recount for longer than the selector takes to rebuild the counter from the ledger).
    let started = std::time::Instant::now();
    let mut spent_statuses = Vec::new();
    while started.elapsed() < Duration::from_secs(3) {
        spent_statuses.push(send_spent().await);
    }
    assert!(
        spent_statuses.iter().all(|status| *status != 200),
        "a key over its budget was served after the wipe: {spent_statuses:?}"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut served = 0;
    for client in clients {
        let statuses = client.await.expect("a client");
        assert!(
            statuses.iter().all(|s| *s == 200),
            "a request failed across the wipe: {statuses:?}"
        );
        served += statuses.len();
    }
    pool.upstream.set_delay(Duration::ZERO);
    assert!(served > 20, "under load: {served} requests");
    // The requests in flight at the wipe keep running while Redis holds none of their leases:
    // the accounts recount until every replica has put them back, so no account ever ran over
    // its limit (docs/DESIGN.md §3, "When Redis is wiped").
    for credential in ["cred-one", "cred-two"] {
        let peak = pool.upstream.stats(credential).peak;
        assert!(
            peak <= 2,
            "{credential} held {peak} requests at once (limit 2)"
        );
    }
    // No account out of service: every account serves.
    for health in pool.health().await {
        assert!(health.hard_block().is_none(), "{health}");
    }
    // The total budget's counter comes back to the ledger's spend, the spend before the wipe
    // included (the charges since the wipe alone are less), within the rebuild period.
    assert!(spent_before > 0.0, "the load was charged");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ledger: f64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(cost_usd), 0) FROM usage_records WHERE api_key_id = $1",
    )
    .bind(key_id)
    .fetch_one(backends.store.pool())
    .await
    .expect("ledger");
    let redis = backends.redis.client().await.expect("redis");
    let key = poolgate_runtime::redis_keys::client_key_spend(key_id, "t");
    let read = || {
        let (key, mut redis) = (key.clone(), redis.clone());
        async move {
            redis::cmd("GET")
                .arg(&key)
                .query_async::<Option<i64>>(&mut redis)
                .await
                .ok()
                .flatten()
                .unwrap_or(0)
        }
    };
    // A second wipe, the ledger complete (under load, the records still on their way when the
    // counters are rebuilt are counted at the next rebuild: DESIGN §6, "Prices"): the counter is
    // the ledger's again within seconds, not the 30 s period, since the selector notices the wipe.
    backends.redis.flush().await.expect("flushed again");
    let after_wipe = read().await;
    // Within seconds, not the 30 s period: the selector notices the wipe.
    let rebuilt = poolgate_testkit::eventually(Duration::from_secs(4), || async {
        let micros = read().await;
        (micros as f64 >= ledger * 1e6 - 1.0).then_some(micros)
    })
    .await;
    assert!(
        rebuilt.is_ok(),
        "the total's counter ({after_wipe} µ$ after the wipe) was not rebuilt to the ledger's ${ledger}"
    );
    // The response made before the wipe: another key's continuation is refused (no binding
    // says whose it is); its maker's relay still holds the binding it made, and continues it.
    let other = pool
        .http
        .post(format!("{base}/v1/responses"))
        .bearer_auth(&secret)
        .json(&json!({"model": "gpt-x", "input": "after", "previous_response_id": response_id}))
        .send()
        .await
        .expect("an answer");
    let status = other.status().as_u16();
    let body = other.text().await.unwrap_or_default();
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("previous_response_not_found"), "{body}");
    let (status, body) = pool
        .send(
            0,
            "/v1/responses",
            &json!({"model": "gpt-x", "input": "after", "previous_response_id": response_id}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
}
