//! Usage retention (docs/DESIGN.md §6, "Usage retention"): records older than the retention are
//! folded into their keys' all-time totals and deleted, and everything that reads a total reads
//! the same after as before — the budget rebuilt after a Redis wipe, the key's described usage,
//! the per-model view — as the clock moves records across the boundary; the calendar periods are
//! untouched; two selectors folding at once fold each record once.

use crate::support;

use std::time::Duration;

use poolgate_core::clock::ManualClock;
use poolgate_core::lease::KeyLimits;
use poolgate_core::now_ms;
use poolgate_core::price::PriceSource;
use poolgate_runtime::redis_keys::client_key_spend;
use poolgate_select::source::UsageInput;
use poolgate_testkit::eventually;
use selector_svc::retention::{FOLD_BATCH, fold_pass};
use support::{Backends, Replica, fast_settings};

const DAY_MS: i64 = 86_400_000;
const RETENTION: Duration = Duration::from_secs(90 * 86_400);

fn usage(api_key_id: i64, model: &str, cost_usd: f64, at_ms: i64) -> UsageInput {
    UsageInput {
        api_key_id: Some(api_key_id),
        user: "alice".into(),
        account_id: None,
        model: model.into(),
        input_tokens: 10,
        output_tokens: 5,
        cache_write_tokens: 0,
        cache_read_tokens: 0,
        cost_usd,
        price_source: Some(PriceSource::Catalogue),
        status: 200,
        latency_ms: 1,
        at_ms: Some(at_ms),
    }
}

/// A budget counter as admission keeps it in Redis (`None`: absent).
async fn counter(backends: &Backends, api_key_id: i64, period: &str) -> Option<i64> {
    let mut redis = backends.redis.client().await.expect("redis");
    redis::cmd("GET")
        .arg(client_key_spend(api_key_id, period))
        .query_async::<Option<i64>>(&mut redis)
        .await
        .expect("get")
}

async fn records(backends: &Backends) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM usage_records")
        .fetch_one(backends.store.pool())
        .await
        .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_total_budget_rebuilt_after_a_wipe_is_the_same_across_the_retention_boundary() {
    let backends = Backends::start().await;
    backends.account("a", "g", |_| {}).await;
    let store = &backends.store;
    let limits = KeyLimits {
        budget_total_micros: 1_000_000_000,
        budget_day_micros: 1_000_000_000,
        ..KeyLimits::default()
    };
    let (id, secret) = store
        .create_api_key_with_limits("ci", "alice", "g", 0, &Default::default(), &limits)
        .await
        .expect("created");
    let now = now_ms();
    store
        .insert_usage(&[
            usage(id, "claude-sonnet-4-5", 2.0, now - 120 * DAY_MS),
            usage(id, "claude-sonnet-4-5", 1.5, now - 100 * DAY_MS),
            usage(id, "gpt-5", 0.25, now - 80 * DAY_MS),
            usage(id, "gpt-5", 0.5, now - 1_000),
        ])
        .await
        .expect("usage recorded");
    let replica = Replica::start(backends.config(fast_settings())).await;
    let total_micros = 4_250_000;
    eventually(Duration::from_secs(5), || async {
        (counter(&backends, id, "t").await == Some(total_micros)).then_some(())
    })
    .await
    .expect("the total's counter is rebuilt at start");
    let describe = || async {
        replica
            .built
            .selector
            .describe_key(secret.expose())
            .await
            .expect("described")
    };
    let before = describe().await;
    let models_before = store
        .read_model_usage(id, 0, now + 1)
        .await
        .expect("models");

    let clock = ManualClock::starting_at(now);
    let folded = fold_pass(store, &clock.clock(), RETENTION)
        .await
        .expect("a pass");
    assert_eq!(folded, 2, "the two records past 90 days");
    assert_eq!(records(&backends).await, 2);
    let after = describe().await;
    assert_eq!(after.usage, before.usage, "every period reads what it read");
    assert_eq!(
        store
            .read_model_usage(id, 0, now + 1)
            .await
            .expect("models"),
        models_before,
        "the total per model and price source"
    );
    let last_30_days = store
        .read_usage(id, now - 30 * DAY_MS, now + 1)
        .await
        .expect("a range");
    assert_eq!(
        (last_30_days.requests, last_30_days.cost_usd),
        (1, 0.5),
        "a range that starts after the beginning reads records only"
    );

    // Redis wiped: the rebuild puts the same total back.
    backends.redis.flush().await.expect("flushed");
    replica
        .built
        .selector
        .rebuild_budgets(replica.built.budgets.as_ref())
        .await
        .expect("rebuild");
    assert_eq!(counter(&backends, id, "t").await, Some(total_micros));

    // Fifteen days on, the 80-day-old record crosses the boundary too.
    clock.advance(Duration::from_secs(15 * 86_400));
    let folded = fold_pass(store, &clock.clock(), RETENTION)
        .await
        .expect("a pass");
    assert_eq!(folded, 1);
    assert_eq!(
        fold_pass(store, &clock.clock(), RETENTION)
            .await
            .expect("a pass"),
        0,
        "nothing twice"
    );
    backends.redis.flush().await.expect("flushed");
    replica
        .built
        .selector
        .rebuild_budgets(replica.built.budgets.as_ref())
        .await
        .expect("rebuild");
    assert_eq!(counter(&backends, id, "t").await, Some(total_micros));
    let spend = store
        .spend_since(&[id], &[0], now + 1)
        .await
        .expect("spend");
    assert!((spend[&id][0] - 4.25).abs() < 1e-9, "{spend:?}");
    assert_eq!(describe().await.usage, before.usage);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_selectors_folding_at_once_fold_each_record_once() {
    let (_postgres, store) = support::migrated_store().await;
    let now = now_ms();
    let old = now - 200 * DAY_MS;
    let count = FOLD_BATCH * 2 + 123;
    let batch: Vec<UsageInput> = (0..count)
        .map(|n| usage(1 + n % 3, "m", 0.01, old + n))
        .collect();
    for chunk in batch.chunks(1_000) {
        store.insert_usage(chunk).await.expect("usage");
    }
    let totals_before = store
        .spend_since(&[1, 2, 3], &[0], now)
        .await
        .expect("spend");
    let clock = ManualClock::starting_at(now).clock();
    let (a, b) = tokio::join!(
        fold_pass(&store, &clock, RETENTION),
        fold_pass(&store, &clock, RETENTION)
    );
    let folded = a.expect("a pass") + b.expect("a pass");
    assert_eq!(
        folded, count as u64,
        "every record folded once between them"
    );
    let totals_after = store
        .spend_since(&[1, 2, 3], &[0], now)
        .await
        .expect("spend");
    for id in [1, 2, 3] {
        assert!(
            (totals_after[&id][0] - totals_before[&id][0]).abs() < 1e-6,
            "{id}: {totals_before:?} → {totals_after:?}"
        );
    }
    let requests: i64 = sqlx::query_scalar("SELECT sum(requests)::bigint FROM usage_rollups")
        .fetch_one(store.pool())
        .await
        .expect("sum");
    assert_eq!(requests, count);
}
