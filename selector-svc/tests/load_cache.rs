//! Each load-cache mechanism (docs/DESIGN.md §5), pinned by counting the Redis round
//! trips the selector makes through its counting connection wrapper (a pipeline or a script is one
//! trip). A select that plans someone also reads its candidates' usage windows (docs/DESIGN.md
//! §5), cached like the load for a period and served stale the same way: one more trip per miss,
//! counted here as `WINDOWS`.
//!
//! Stale-while-revalidate: a reading past its 200 ms period but younger than the
//! bound (3 periods) is served at once while one background fetch replaces it; a block this
//! replica writes is never served stale, and one another replica writes reaches this one within
//! a second.

use crate::support;

use std::time::Duration;

use poolgate_core::plan::Plan;
use poolgate_proto::selector::v1 as pb;
use poolgate_runtime::redis_keys::AccountKeys;
use poolgate_select::engine::SelectQuery;
use poolgate_testkit::eventually;
use support::{Backends, Replica, fast_settings};

/// The usage-windows read of a select whose candidates are not cached: one pipeline.
const WINDOWS: u64 = 1;
/// Past the 200 ms cache period, within the 600 ms bound: served stale.
const STALE: Duration = Duration::from_millis(300);
/// Past the bound: nothing is served from the cache.
const PAST_THE_BOUND: Duration = Duration::from_millis(700);

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
    tokio::time::sleep(PAST_THE_BOUND).await;
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
        3,
        "the miss, then one confirming fresh read, then one read of what the blocks are (a \
         confirmation's is waited for, issue 36)"
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

fn inflight(plan: &Plan, id: i64) -> Option<u32> {
    plan.accounts
        .iter()
        .find(|entry| entry.id == id)
        .and_then(|entry| entry.inflight)
}

fn planned(plan: &Plan, id: i64) -> bool {
    plan.accounts.iter().any(|entry| entry.id == id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_reading_is_served_at_once_while_exactly_one_fetch_replaces_it() {
    let (backends, replica, ids) = setup(3).await;
    let selector = replica.built.selector.clone();
    let plan = selector.select(&query("g", 3)).await.expect("select");
    assert_eq!(inflight(&plan, ids[0]), Some(0));
    add_leases(&backends, ids[0], 2).await;
    tokio::time::sleep(STALE).await;
    let before = trips(&replica);
    let plan = selector.select(&query("g", 3)).await.expect("select");
    assert_eq!(
        inflight(&plan, ids[0]),
        Some(0),
        "the stale reading is served, without waiting for Redis"
    );
    // More selects while the fetch runs (or just after): none starts another.
    let selects: Vec<_> = (0..16)
        .map(|_| {
            let selector = selector.clone();
            tokio::spawn(async move { selector.select(&query("g", 3)).await.is_ok() })
        })
        .collect();
    for select in selects {
        assert!(select.await.expect("task"), "select");
    }
    // The load and the usage windows (cached the same period) are each read once, behind.
    let fetched = eventually(Duration::from_secs(5), || async {
        let plan = selector.select(&query("g", 3)).await.ok()?;
        (inflight(&plan, ids[0]) == Some(2)).then_some(())
    })
    .await;
    assert!(fetched.is_ok(), "the background fetch replaced the reading");
    assert_eq!(
        trips(&replica) - before,
        1 + WINDOWS,
        "exactly one fetch of the load for 18 selects of a stale set"
    );
    let before = trips(&replica);
    let plan = selector.select(&query("g", 3)).await.expect("select");
    assert_eq!(inflight(&plan, ids[0]), Some(2), "fresh after the fetch");
    assert_eq!(trips(&replica) - before, 0, "and served from the cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_bound_a_select_waits_for_the_fetch() {
    let (backends, replica, ids) = setup(3).await;
    let selector = &replica.built.selector;
    selector.select(&query("g", 3)).await.expect("select");
    add_leases(&backends, ids[0], 2).await;
    tokio::time::sleep(PAST_THE_BOUND).await;
    let before = trips(&replica);
    let plan = selector.select(&query("g", 3)).await.expect("select");
    assert_eq!(inflight(&plan, ids[0]), Some(2), "read before answering");
    assert_eq!(trips(&replica) - before, 1 + WINDOWS);
}

/// Blocks `id` through an outcome report to `replica` (the upstream said its window is used up).
async fn block_through_a_report(replica: &Replica, id: i64) {
    let reset_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64 + 3_600_000)
        .unwrap_or(u64::MAX);
    let applied = replica
        .client
        .clone()
        .report_outcome(pb::ReportOutcomeRequest {
            account_id: id,
            class: pb::OutcomeClass::WindowExhausted as i32,
            status: 429,
            reset_at_ms,
            reason: "test 429".into(),
            ..Default::default()
        })
        .await
        .expect("report")
        .into_inner();
    assert_eq!(support::effect(&applied), "hard_block");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_this_replica_writes_is_never_served_stale() {
    let (_backends, replica, ids) = setup(3).await;
    let selector = &replica.built.selector;
    let plan = selector.select(&query("g", 3)).await.expect("select");
    assert!(planned(&plan, ids[1]));
    tokio::time::sleep(STALE).await;
    block_through_a_report(&replica, ids[1]).await;
    let plan = selector.select(&query("g", 3)).await.expect("select");
    assert!(
        !planned(&plan, ids[1]),
        "the reading read before the block is not served stale: {:?}",
        plan.accounts.iter().map(|a| a.id).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_written_through_another_replica_stops_selects_within_a_second() {
    let (backends, reading, ids) = setup(3).await;
    let writing = Replica::start(backends.config(fast_settings())).await;
    let selector = reading.built.selector.clone();
    // No select between the block and the bound: the first one after it waits for a read.
    selector.select(&query("g", 3)).await.expect("select");
    block_through_a_report(&writing, ids[2]).await;
    let blocked_at = std::time::Instant::now();
    tokio::time::sleep(PAST_THE_BOUND).await;
    let plan = selector.select(&query("g", 3)).await.expect("select");
    assert!(
        !planned(&plan, ids[2]),
        "planned {:?} after the block, its reading past the bound",
        blocked_at.elapsed()
    );
    // Selects all along, the reading stale when the block lands: served stale once or twice
    // while the fetch runs, then never again.
    tokio::time::sleep(STALE).await;
    block_through_a_report(&writing, ids[1]).await;
    let blocked_at = std::time::Instant::now();
    let stopped = eventually(Duration::from_secs(1), || async {
        let plan = selector.select(&query("g", 3)).await.ok()?;
        (!planned(&plan, ids[1])).then_some(())
    })
    .await;
    assert!(
        stopped.is_ok(),
        "still planned {:?} after the block",
        blocked_at.elapsed()
    );
    for _ in 0..20 {
        let plan = selector.select(&query("g", 3)).await.expect("select");
        assert!(!planned(&plan, ids[1]), "and never planned again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Another replica records that `id`'s five-hour window is used up for the next hour.
async fn exhaust_through_another_replica(other: &Replica, id: i64) {
    use poolgate_core::windows::{Scope, WindowKind, WindowReading, WindowStatus};
    let now = poolgate_core::now_ms();
    let reading = WindowReading {
        kind: WindowKind::FiveHour,
        scope: Scope::Account,
        utilization: Some(1.0),
        reset_at_ms: now + 3_600_000,
        length_ms: Some(5 * 3_600_000),
        status: WindowStatus::Rejected,
        observed_at_ms: now,
    };
    other
        .client
        .clone()
        .record_windows(poolgate_proto::convert::windows_request([(
            id,
            vec![reading],
        )]))
        .await
        .expect("recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_window_readings_are_served_at_once_and_replaced_in_the_background() {
    let (backends, replica, ids) = setup(3).await;
    let other = Replica::start(backends.config(fast_settings())).await;
    let selector = replica.built.selector.clone();
    let plan = selector.select(&query("g", 3)).await.expect("select");
    assert!(planned(&plan, ids[0]));
    exhaust_through_another_replica(&other, ids[0]).await;
    tokio::time::sleep(STALE).await;
    let plan = selector.select(&query("g", 3)).await.expect("select");
    assert!(
        planned(&plan, ids[0]),
        "the stale readings are served, without waiting for Redis"
    );
    let replaced = eventually(Duration::from_secs(5), || async {
        let plan = selector.select(&query("g", 3)).await.ok()?;
        (!planned(&plan, ids[0]) && planned(&plan, ids[1])).then_some(())
    })
    .await;
    assert!(
        replaced.is_ok(),
        "the background read brought the used-up window in"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_bound_a_select_waits_for_the_window_readings() {
    let (backends, replica, ids) = setup(3).await;
    let other = Replica::start(backends.config(fast_settings())).await;
    let selector = &replica.built.selector;
    let plan = selector.select(&query("g", 3)).await.expect("select");
    assert!(planned(&plan, ids[0]));
    exhaust_through_another_replica(&other, ids[0]).await;
    tokio::time::sleep(PAST_THE_BOUND).await;
    let plan = selector.select(&query("g", 3)).await.expect("select");
    assert!(
        !planned(&plan, ids[0]) && planned(&plan, ids[1]),
        "read before answering: the used-up window leaves the account out"
    );
}
