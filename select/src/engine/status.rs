//! The pool at a glance, as gauges (docs/METRICS.md): `selector_accounts{group,status}` (each
//! account in the one status an operator sees it in, `LiveStatus`),
//! `selector_group_eligible{group}` (the accounts a select could plan now, by the rules plans
//! use: `health_gate` and `windows_block_until` in `select.rs`), and the group's live leases
//! against its accounts' concurrency limits (`selector_group_leases`,
//! `selector_group_concurrency_limit`).
//!
//! Recomputed every few seconds by a background task (`status_gauges_every`), never on a
//! select's path: one read of the snapshot, one batched health read and one usage-windows read
//! (both past the engine's caches, which they would otherwise fill with readings a select is
//! then served), and the block list of the hard-blocked accounts only (to tell a running
//! confirmation from another hard block). Every status of
//! every configured group is set, 0 included, so a scrape shows them all; a group gone from the
//! config loses its series.

use std::collections::{HashMap, HashSet};
use std::sync::Weak;
use std::time::Duration;

use poolgate_core::AccountId;
use poolgate_core::account::AccountStatus;
use poolgate_core::health::{AccountHealth, LiveStatus};
use poolgate_core::windows::{WindowReading, assess};

use super::Selector;
use super::select::{Gate, health_gate, windows_block_until};

/// How often the composition roots recompute the status gauges.
pub const STATUS_GAUGES_EVERY: Duration = Duration::from_secs(5);

/// One group's counts.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GroupStatus {
    /// Accounts per status, in `LiveStatus::ALL`'s order.
    pub by_status: [i64; LiveStatus::ALL.len()],
    /// Accounts a select could plan now.
    pub eligible: i64,
    /// Live leases on the active accounts (those whose load could be read).
    pub leases: i64,
    /// The active accounts' concurrency limits, summed (0: no limit, adds nothing).
    pub concurrency_limit: i64,
}

impl GroupStatus {
    fn count(&mut self, status: LiveStatus) {
        if let Some(index) = LiveStatus::ALL.iter().position(|s| *s == status) {
            self.by_status[index] += 1;
        }
    }
}

impl Selector {
    /// Runs [`Selector::update_status_gauges`] at once and then every `interval`, until the
    /// engine is gone.
    pub async fn status_gauges_every(selector: Weak<Selector>, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(selector) = selector.upgrade() else {
                return;
            };
            selector.update_status_gauges().await;
        }
    }

    /// Recomputes the status gauges from the snapshot and the stores. A health read that fails
    /// as a whole leaves the gauges as they were (a Redis outage does not show every account
    /// active).
    pub async fn update_status_gauges(&self) {
        let Some(groups) = self.group_statuses().await else {
            tracing::debug!("account health unreadable; status gauges kept");
            return;
        };
        let mut shown = self.status_groups.lock().unwrap_or_else(|p| p.into_inner());
        for gone in shown.iter().filter(|group| !groups.contains_key(*group)) {
            for status in LiveStatus::ALL {
                let _ = self
                    .metrics
                    .accounts
                    .remove_label_values(&[gone, status.label()]);
            }
            for gauge in [
                &self.metrics.group_eligible,
                &self.metrics.group_leases,
                &self.metrics.group_concurrency_limit,
            ] {
                let _ = gauge.remove_label_values(&[gone]);
            }
        }
        for (group, counts) in &groups {
            for (status, count) in LiveStatus::ALL.iter().zip(counts.by_status) {
                self.metrics
                    .accounts
                    .with_label_values(&[group, status.label()])
                    .set(count);
            }
            for (gauge, value) in [
                (&self.metrics.group_eligible, counts.eligible),
                (&self.metrics.group_leases, counts.leases),
                (
                    &self.metrics.group_concurrency_limit,
                    counts.concurrency_limit,
                ),
            ] {
                gauge.with_label_values(&[group]).set(value);
            }
        }
        *shown = groups.into_keys().collect();
    }

    /// Every configured group's counts; `None` when no active account's health could be read.
    pub async fn group_statuses(&self) -> Option<HashMap<String, GroupStatus>> {
        let snapshot = self.snapshot.get();
        let active: Vec<AccountId> = snapshot
            .accounts()
            .filter(|account| account.status == AccountStatus::Active)
            .map(|account| account.id)
            .collect();
        let health = self.read_health(&active).await;
        if !active.is_empty() && health.is_empty() {
            return None;
        }
        let confirming = self.confirming(&health).await;
        let windows: HashMap<AccountId, Vec<WindowReading>> =
            match self.health.read_windows(&active).await {
                Ok(readings) if readings.len() == active.len() => {
                    active.iter().copied().zip(readings).collect()
                }
                // Unread windows: no account counts as used up (as selection orders them).
                _ => HashMap::new(),
            };
        let now = self.clock.wall_ms();
        let mut groups = HashMap::new();
        for group in snapshot.groups() {
            let thresholds = {
                let settings = snapshot.group_settings(group);
                self.settings
                    .windows
                    .overridden(settings.window_shed_at, settings.window_move_at)
            };
            let mut counts = GroupStatus::default();
            for account in snapshot.group_accounts(group) {
                let known = health.get(&account.id);
                counts.count(LiveStatus::of(
                    account.status,
                    known.unwrap_or(&AccountHealth::HEALTHY),
                    confirming.contains(&account.id),
                ));
                let used_up = windows.get(&account.id).is_some_and(|readings| {
                    windows_block_until(&assess(readings, now, thresholds), None, now).is_some()
                });
                if account.status != AccountStatus::Active {
                    continue;
                }
                counts.concurrency_limit += i64::from(account.concurrency_limit.max(0));
                counts.leases += known.and_then(|h| h.inflight).map_or(0, i64::from);
                if health_gate(known) == Gate::Open && !used_up {
                    counts.eligible += 1;
                }
            }
            groups.insert(group.to_owned(), counts);
        }
        Some(groups)
    }

    /// The health of `ids` in batches of the load cache's size, read past the load cache (a
    /// status pass must not leave a reading a select would then be served). An account whose
    /// batch failed is left out (unknown).
    async fn read_health(&self, ids: &[AccountId]) -> HashMap<AccountId, AccountHealth> {
        let batch = self.settings.load_cache.batch_size.max(1);
        let reads = ids.chunks(batch).map(|chunk| async move {
            match self.health.read_batch(chunk).await {
                Ok(values) if values.len() == chunk.len() => {
                    chunk.iter().copied().zip(values).collect::<Vec<_>>()
                }
                Ok(_) => Vec::new(),
                Err(error) => {
                    tracing::debug!(%error, "status gauges: a health batch was not read");
                    Vec::new()
                }
            }
        });
        futures_util::future::join_all(reads)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Which of the hard-blocked accounts are blocked by a running confirmation (their block's
    /// reason says so). Unreadable: none (they show as hard-blocked).
    async fn confirming(&self, health: &HashMap<AccountId, AccountHealth>) -> HashSet<AccountId> {
        let hard: Vec<AccountId> = health
            .iter()
            .filter(|(_, health)| health.hard_block_ms > 0)
            .map(|(id, _)| *id)
            .collect();
        if hard.is_empty() {
            return HashSet::new();
        }
        match self.health.list_blocks(&hard).await {
            Ok(blocks) => blocks
                .iter()
                .filter(|block| block.is_confirming())
                .map(|block| block.account_id)
                .collect(),
            Err(error) => {
                tracing::debug!(%error, "blocks not read; confirmations shown as hard blocks");
                HashSet::new()
            }
        }
    }
}
