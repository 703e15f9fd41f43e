//! Each load-cache mechanism (docs/DESIGN.md §5, seed 001), pinned by counting the Redis round
//! trips the selector makes through its counting connection wrapper (a pipeline or a script is one
//! trip). A select that plans someone also reads its candidates' usage windows (docs/DESIGN.md
//! §5), cached like the load for a period: one more trip per miss, counted here as `WINDOWS`.

mod support;

use std::time::Duration;

use poolgate_runtime::keys::AccountKeys;
use poolgate_select::engine::SelectQuery;
use support::{Backends, Replica, fast_settings};

/// The usage-windows read of a select whose candidates are not cached: one pipeline.
const WINDOWS: u64 = 1;

fn query(group: &str, max_accounts: usize) -> SelectQuery {
    SelectQuery {
        group: group.into(),
        platform: Some(poolgate_core::account::Platform::Anthropic),
        model: "claude-sonnet".into(),
        max_accounts,
        ..SelectQuery::default()
    }
}

/// Round trips of the replica's health store (its counting Redis connection).
fn trips(replica: &Replica) -> u64 {
    replica.built.health.handle().round_trips()
}

async fn add_leases(backends: &Backends, account: i64, count: usize) {
    let mut conn = backends.redis.client().await.expect("redis");
    for n in 0..count {
        let _: i64 = redis::cmd("ZADD")
            .arg(AccountKeys::new(account).leases)
            .arg(i64::MAX / 2)
            .arg(format!("{account}.test.{n}"))
            .query_async(&mut conn)
            .await
            .expect("zadd");
    }
}

async fn setup(accounts: usize) -> (Backends, Replica, Vec<i64>) {
    let backends = Backends::start().await;
    let mut ids = Vec::new();
    for n in 0..accounts {
        ids.push(
            backends
                .account(&format!("acct-{n}"), "g", |a| a.concurrency_limit = 10)
                .await,
        );
    }
    let replica = Replica::start(backends.config(fast_settings())).await;
    // Learn the Redis clock once (one TIME round trip), so counts below are about reads only.
    replica
        .built
        .selector
        .select(&query("g", 1))
        .await
        .expect("warm-up select");
    tokio::time::sleep(Duration::from_millis(250)).await;
    (backends, replica, ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_hit_makes_no_round_trip() {
    let (_backends, replica, _) = setup(3).await;
    let selector = &replica.built.selector;
    let before = trips(&replica);
    selector.select(&query("g", 3)).await.expect("select");
    assert_eq!(
        trips(&replica) - before,
        1 + WINDOWS,
        "a miss is one pipelined read"
    );
    let before = trips(&replica);
    for _ in 0..20 {
        selector.select(&query("g", 3)).await.expect("select");
    }
    assert_eq!(
        trips(&replica) - before,
        0,
        "hits within 200 ms read neither load nor windows"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_misses_send_one_fetch() {
    let (_backends, replica, _) = setup(4).await;
    let selector = replica.built.selector.clone();
    let before = trips(&replica);
    let selects: Vec<_> = (0..16)
        .map(|_| {
            let selector = selector.clone();
            tokio::spawn(async move {
                selector
                    .select(&query("g", 4))
                    .await
                    .map(|p| p.accounts.len())
            })
        })
        .collect();
    for select in selects {
        assert_eq!(select.await.expect("task").expect("select"), 4);
    }
    assert_eq!(
        trips(&replica) - before,
        1 + WINDOWS,
        "16 misses for one candidate set coalesce into one fetch of each"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_and_twenty_five_accounts_are_read_in_three_batches() {
    let (backends, replica, ids) = setup(125).await;
    for (n, &id) in ids.iter().enumerate() {
        add_leases(&backends, id, n % 4).await;
    }
    let selector = &replica.built.selector;
    let before = trips(&replica);
    let plan = selector.select(&query("g", 125)).await.expect("select");
    assert_eq!(
        trips(&replica) - before,
        3 + WINDOWS,
        "50 + 50 + 25: three pipelines"
    );
    assert_eq!(plan.accounts.len(), 125, "every account takes part");
    for (n, &id) in ids.iter().enumerate() {
        let entry = plan.accounts.iter().find(|e| e.id == id).expect("planned");
        assert_eq!(entry.inflight, Some((n % 4) as u32), "account {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pipeline_falls_back_per_account_and_never_reports_zero_for_an_unread_account() {
    let (backends, replica, ids) = setup(4).await;
    add_leases(&backends, ids[0], 2).await;
    // A lease key of the wrong type makes its ZCOUNT, and with it the whole pipeline, fail.
    let mut conn = backends.redis.client().await.expect("redis");
    let _: () = redis::cmd("SET")
        .arg(AccountKeys::new(ids[3]).leases)
        .arg("not a zset")
        .query_async(&mut conn)
        .await
        .expect("set");
    let selector = &replica.built.selector;
    let before = trips(&replica);
    let plan = selector.select(&query("g", 4)).await.expect("select");
    assert_eq!(
        trips(&replica) - before,
        1 + 4 + WINDOWS,
        "the batch, then one read per account"
    );
    let inflight = |id| {
        plan.accounts
            .iter()
            .find(|e| e.id == id)
            .expect("planned")
            .inflight
    };
    assert_eq!(inflight(ids[0]), Some(2));
    assert_eq!(inflight(ids[1]), Some(0));
    assert_eq!(inflight(ids[3]), None, "unknown, not zero");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_reading_that_filters_everyone_triggers_exactly_one_fresh_read() {
    let (backends, replica, ids) = setup(3).await;
    let mut conn = backends.redis.client().await.expect("redis");
    for &id in &ids {
        let _: () = redis::cmd("SET")
            .arg(AccountKeys::new(id).cooldown)
            .arg("window_exhausted|429|test")
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .expect("set");
    }
    let selector = &replica.built.selector;
    let before = trips(&replica);
    let plan = selector.select(&query("g", 3)).await.expect("select");
    assert!(plan.accounts.is_empty());
    assert_eq!(
        plan.none_reason,
        Some(poolgate_core::select::NoneReason::AllBlocked)
    );
    assert!(
        plan.retry_after_ms > 55_000,
        "the earliest block end: {}",
        plan.retry_after_ms
    );
    assert_eq!(
        trips(&replica) - before,
        2,
        "the miss, then one confirming fresh read"
    );
    // The blocks go away; the cached reading still says "all blocked".
    for &id in &ids {
        let _: i64 = redis::cmd("DEL")
            .arg(AccountKeys::new(id).cooldown)
            .query_async(&mut conn)
            .await
            .expect("del");
    }
    let before = trips(&replica);
    let plan = selector.select(&query("g", 3)).await.expect("select");
    assert_eq!(plan.accounts.len(), 3, "the fresh read found them");
    assert_eq!(
        trips(&replica) - before,
        1 + WINDOWS,
        "exactly one fresh read"
    );
}
