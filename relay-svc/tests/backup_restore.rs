//! Backups that restore (docs/DESIGN.md §7, "Backups"): a `pg_dump` of the selector's database
//! (accounts with their encrypted credentials, client keys, prices, the usage ledger and its
//! retention totals), restored into a fresh Postgres beside a wiped Redis, with the same
//! credential keys, serves the pool again: its accounts call their upstreams with the right
//! credentials, its keys authenticate with their limits, and a key's spent budget is still spent.

use crate::common;

use std::time::Duration;

use poolgate_core::account::Price;
use poolgate_core::lease::KeyLimits;
use poolgate_select::source::UsageInput;
use poolgate_stack::Backends;
use poolgate_testkit::fake_upstream::FakeUpstream;
use poolgate_testkit::{PostgresServer, Scratch, eventually, pg_tool};
use selector_svc::store::PostgresSource;
use serde_json::{Value, json};

const PRICE_PER_MTOK: f64 = 100_000.0;

async fn messages(http: &reqwest::Client, base: &str, key: &str) -> (u16, Value) {
    let response = http
        .post(format!("{base}/v1/messages"))
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("the relay answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The stack over `backends`: a selector, admission and a relay; the relay's address and what
/// keeps them running.
async fn serve(backends: &Backends) -> (String, Box<dyn std::any::Any + Send>) {
    let (selector, selector_addr) = common::selector(backends).await.expect("selector starts");
    let (admission, admission_addr) = common::admission(&backends.redis.url(), Default::default())
        .await
        .expect("admission starts");
    let (_relay, addr) = common::relay_with_handle(
        vec![format!("http://{selector_addr}")],
        vec![format!("http://{admission_addr}")],
        Default::default(),
    )
    .await
    .expect("relay starts");
    (format!("http://{addr}"), Box::new((selector, admission)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_restored_into_a_fresh_postgres_with_a_wiped_redis_serves_the_pool_again() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let backends = common::backends().await.expect("backends start");
    let store = &backends.store;
    store
        .upsert_account(&common::account("claude", &upstream.base_url, 4, 0))
        .await
        .expect("account");
    store
        .set_price(
            "claude-x",
            Price {
                input_per_mtok: PRICE_PER_MTOK,
                output_per_mtok: PRICE_PER_MTOK,
                ..Price::default()
            },
        )
        .await
        .expect("price");
    // $3 in total; $2.50 of it spent long ago (past the retention, folded into the totals).
    let limits = KeyLimits {
        budget_total_micros: 3_000_000,
        ..KeyLimits::default()
    };
    let (key_id, secret) = store
        .create_api_key_with_limits(
            "backed-up",
            "erin",
            "default",
            0,
            &Default::default(),
            &limits,
        )
        .await
        .expect("a key");
    let secret = secret.expose().to_owned();
    store
        .insert_usage(&[UsageInput {
            api_key_id: Some(key_id),
            user: "erin".into(),
            model: "claude-x".into(),
            cost_usd: 2.5,
            status: 200,
            at_ms: Some(poolgate_core::now_ms() - 200 * 86_400_000),
            ..UsageInput::default()
        }])
        .await
        .expect("old usage");
    store
        .fold_usage(poolgate_core::now_ms() - 90 * 86_400_000, 100)
        .await
        .expect("folded");
    let http = reqwest::Client::new();
    {
        let (base, _running) = serve(&backends).await;
        // One answer costs $1.70 (17 tokens at the pool's price): $4.20 spent, over the budget.
        let (status, body) = messages(&http, &base, &secret).await;
        assert_eq!(status, 200, "{body}");
        let spent = eventually(Duration::from_secs(15), || async {
            let view: Value = http
                .get(format!("{base}/v1/poolgate/key"))
                .header("x-api-key", &secret)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let cost = view["usage"]["total"]["cost_usd"].as_f64()?;
            ((cost - 4.2).abs() < 1e-6).then_some(cost)
        })
        .await;
        assert!(spent.is_ok(), "the answer was recorded");
    }

    // The backup: Postgres as pg_dump writes it (the credential keys are kept apart, as a file).
    let scratch = Scratch::new("backup").expect("scratch");
    let dump = scratch.path().join("poolgate.dump");
    let dumped = std::process::Command::new(pg_tool("pg_dump").expect("pg_dump"))
        .arg("--format=custom")
        .arg(format!("--file={}", dump.display()))
        .arg(format!("--dbname={}", backends.postgres.url()))
        .output()
        .expect("pg_dump runs");
    assert!(
        dumped.status.success(),
        "{}",
        String::from_utf8_lossy(&dumped.stderr)
    );

    // Disaster: a fresh Postgres, the dump restored; Redis wiped.
    let Backends {
        postgres: old_postgres,
        redis,
        keyring,
        store: _,
    } = backends;
    drop(old_postgres);
    let postgres = PostgresServer::start().await.expect("a fresh postgres");
    let restored = std::process::Command::new(pg_tool("pg_restore").expect("pg_restore"))
        .arg("--no-owner")
        .arg("--exit-on-error")
        .arg(format!("--dbname={}", postgres.url()))
        .arg(&dump)
        .output()
        .expect("pg_restore runs");
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );
    redis.flush().await.expect("redis wiped");
    let store = PostgresSource::connect(&postgres.url(), std::sync::Arc::new(keyring.clone()))
        .await
        .expect("connect");
    store
        .check_schema()
        .await
        .expect("the restored schema is current");
    let backends = Backends {
        postgres,
        redis,
        keyring,
        store,
    };
    let (base, _running) = serve(&backends).await;
    // The key is spent past its budget: refused, the budget rebuilt from the restored ledger and
    // its totals; no upstream called for it.
    let seen = upstream.seen_requests().len();
    let refused = eventually(Duration::from_secs(45), || async {
        let (status, body) = messages(&http, &base, &secret).await;
        (status == 402).then_some(body)
    })
    .await;
    assert!(
        refused.is_ok(),
        "the spent budget was not rebuilt from the restored ledger"
    );
    // The account serves with its restored credential, for a key with room.
    let (_, open) = backends
        .store
        .create_api_key("after", "frank", "default", 0)
        .await
        .expect("a key on the restored database");
    let served = eventually(Duration::from_secs(15), || async {
        let (status, _) = messages(&http, &base, open.expose()).await;
        (status == 200).then_some(())
    })
    .await;
    assert!(
        served.is_ok(),
        "not served: {:?}",
        messages(&http, &base, open.expose()).await
    );
    let served = upstream.seen_requests();
    assert!(
        served[seen..]
            .iter()
            .all(|request| request.credential() == "cred-claude"),
        "the restored account's credential decrypted"
    );
}
