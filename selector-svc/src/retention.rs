//! Usage retention (docs/DESIGN.md §6, "Usage retention"): off the hot path, in batches, the
//! selector folds usage records older than its retention into each key's all-time totals
//! (`PostgresSource::fold_usage`), so `usage_records` stops growing with time while a key's
//! `total` (its budget, rebuilt after a Redis wipe; `/v1/poolgate/key`; the operator's `usage`)
//! stays what it was. The calendar periods are younger than any retention allowed here.

use std::time::Duration;

use poolgate_core::Clock;

use crate::store::{PostgresSource, StoreError};

/// The shortest retention the selector takes: a month's budget and usage read the records of
/// the calendar month, which never reach further back than 31 days (and the budget time zone's
/// offset).
pub const MIN_RETENTION_DAYS: u64 = 35;
/// Records folded per statement: short transactions, one index range each.
pub const FOLD_BATCH: i64 = 5_000;
/// How often the selector folds (and once shortly after it starts).
pub const FOLD_EVERY: Duration = Duration::from_secs(3600);
/// The pause between two batches of one pass: the ledger's writers go first.
const BETWEEN_BATCHES: Duration = Duration::from_millis(50);

/// Folds every record older than `retention` at `clock`'s time, batch by batch; the number
/// folded. A failed batch ends the pass (the next one takes up where it stopped).
pub async fn fold_pass(
    store: &PostgresSource,
    clock: &Clock,
    retention: Duration,
) -> Result<u64, StoreError> {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let before_ms = clock.wall_ms().saturating_sub(retention_ms);
    let mut folded = 0;
    loop {
        let batch = store.fold_usage(before_ms, FOLD_BATCH).await?;
        folded += batch;
        if batch < FOLD_BATCH as u64 {
            return Ok(folded);
        }
        tokio::time::sleep(BETWEEN_BATCHES).await;
    }
}

/// The selector's retention task: a pass a minute after start, then every [`FOLD_EVERY`].
/// Replicas may fold at once: each takes rows the others do not hold (`SKIP LOCKED`).
pub async fn fold_loop(store: PostgresSource, clock: Clock, retention: Duration) {
    tokio::time::sleep(Duration::from_secs(60)).await;
    let mut tick = tokio::time::interval(FOLD_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match fold_pass(&store, &clock, retention).await {
            Ok(0) => {}
            Ok(folded) => tracing::info!(folded, "usage records past retention folded into totals"),
            Err(error) => tracing::warn!(%error, "usage retention pass failed; retried next pass"),
        }
    }
}
