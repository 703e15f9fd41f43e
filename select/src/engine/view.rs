//! The relays' view of the pool (docs/DESIGN.md §2, "Selection at the edge"): one publisher per
//! selector reads the pool every view period (the load cache's: 200 ms by default), or sooner
//! after a write that changes what a plan may do (an outcome's block, an operator's clear), and
//! hands it to every relay's stream; each stream sends its relay what changed in the groups it
//! serves ([`ViewFilter`]). One health read per period however many relays watch.
//!
//! The half-open breaker checks start here too, on the selector's own timer
//! ([`Selector::check_half_open_every`]): a relay selecting at the edge never starts one.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::select::{Gate, health_gate};
use super::{Selector, SelectorError};
use crate::health::HardBlock;
use crate::snapshot::Snapshot;
use poolgate_core::account::{Account, AccountStatus};
use poolgate_core::health::{AccountHealth, Breaker};
use poolgate_core::view::{AccountState, Deployment, MAX_VIEW_GROUPS, ViewConfig, ViewUpdate};
use poolgate_core::windows::WindowReading;
use poolgate_core::{AccountId, MAX_NAME_BYTES as MAX_GROUP_BYTES, millis};

/// The least time between two reads of the pool (a burst of blocks is one read).
const MIN_READ_SPACING: Duration = Duration::from_millis(20);

/// Two readings of a block or an open breaker whose ends differ by less than this are the same
/// (the remaining time shrinks between reads; the end does not move).
const SAME_END: Duration = Duration::from_millis(500);

/// The pool as the publisher last read it: the config, and every active account's state.
#[derive(Debug)]
pub struct PoolState {
    snapshot: Arc<Snapshot>,
    states: HashMap<AccountId, AccountState>,
    /// When the states were read (their remaining times count from here).
    read_at: Instant,
    /// Read from the stores (the first value, before the publisher's first read, is not).
    read: bool,
}

impl PoolState {
    /// Whether this is a reading of the stores (a stream waits for the first).
    pub fn is_read(&self) -> bool {
        self.read
    }
}

impl Selector {
    /// The settings a relay plans with: this engine's.
    pub fn deployment(&self) -> Deployment {
        Deployment {
            unpriced: self.settings.unpriced,
            windows: self.settings.windows,
            plan_size: u32::try_from(self.settings.plan_size).unwrap_or(u32::MAX),
        }
    }

    /// How often a relay hears from the selector at least.
    pub fn view_period(&self) -> Duration {
        self.settings.load_cache.cache_ttl.max(MIN_READ_SPACING)
    }

    /// The pool as the publisher reads it, starting the publisher on the first call (the engine
    /// owns it, as its other tasks).
    pub fn watch_pool(self: &Arc<Self>) -> watch::Receiver<Arc<PoolState>> {
        self.view_hub
            .get_or_init(|| {
                let (sender, receiver) = watch::channel(Arc::new(PoolState {
                    snapshot: self.snapshot.get(),
                    states: HashMap::new(),
                    read_at: Instant::now(),
                    read: false,
                }));
                let handle = tokio::spawn(publish(Arc::downgrade(self), sender));
                self.tasks
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(handle);
                receiver
            })
            .clone()
    }

    /// A write changed what a plan may do: the relays hear it now, not at the next period.
    pub(crate) fn view_changed(&self) {
        self.view_notify.notify_one();
    }

    /// Reads every active account's state: health (fresh, from the store itself: the plans'
    /// load cache is left to the plans), confirmations, usage windows. `None` when the health
    /// store cannot be read: the relays keep the last view (the last known blocks, as a select
    /// keeps them through an outage).
    async fn read_pool(&self) -> Option<PoolState> {
        let snapshot = self.snapshot.get();
        let mut ids: Vec<AccountId> = snapshot
            .accounts()
            .filter(|account| account.status == AccountStatus::Active)
            .map(|account| account.id)
            .collect();
        ids.sort_unstable();
        let read_at = Instant::now();
        let reading: HashMap<AccountId, AccountHealth> = match self.health.read_batch(&ids).await {
            Ok(read) => ids.iter().copied().zip(read).collect(),
            Err(error) => {
                tracing::debug!(%error, "account health unreadable; the relays keep their view");
                return None;
            }
        };
        // Fresh too: a reading another selector stored reaches the relays within a period.
        let windows: HashMap<AccountId, Vec<WindowReading>> =
            match self.health.read_windows(&ids).await {
                Ok(read) => ids.iter().copied().zip(read).collect(),
                Err(error) => {
                    tracing::debug!(%error, "usage windows unreadable; the relays keep their view");
                    return None;
                }
            };
        let blocked: Vec<AccountId> = ids
            .iter()
            .copied()
            .filter(|id| reading.get(id).is_some_and(|h| h.hard_block_ms > 0))
            .collect();
        let confirming: HashSet<AccountId> = if blocked.is_empty() {
            HashSet::new()
        } else {
            match self.health.hard_blocks(&blocked).await {
                Ok(blocks) => blocked
                    .iter()
                    .zip(blocks)
                    .filter(|(_, block)| *block == HardBlock::Confirming)
                    .map(|(id, _)| *id)
                    .collect(),
                Err(error) => {
                    tracing::debug!(%error, "blocks not read; the view names no confirmation");
                    HashSet::new()
                }
            }
        };
        let states = ids
            .iter()
            .map(|id| {
                let state = AccountState {
                    account_id: *id,
                    health: reading.get(id).copied(),
                    confirming: confirming.contains(id),
                    windows: windows.get(id).cloned().unwrap_or_default(),
                };
                (*id, state)
            })
            .collect();
        Some(PoolState {
            snapshot,
            states,
            read_at,
            read: true,
        })
    }

    /// Starts the check of every half-open breaker among the active accounts, every `period`
    /// (one check per account cluster-wide: the confirmation lock). Selects at the edge never
    /// start one, so this timer is what lets a half-open account back.
    pub async fn check_half_open_every(selector: Weak<Selector>, period: Duration) {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(selector) = selector.upgrade() else {
                return;
            };
            selector.check_half_open().await;
        }
    }

    /// One round of [`check_half_open_every`](Self::check_half_open_every).
    pub async fn check_half_open(&self) {
        let snapshot = self.snapshot.get();
        let active: Vec<&Arc<Account>> = snapshot
            .accounts()
            .filter(|account| account.status == AccountStatus::Active)
            .collect();
        let ids: Vec<AccountId> = active.iter().map(|account| account.id).collect();
        // From the store itself: the plans' load cache is left to the plans.
        let Ok(reading) = self.health.read_batch(&ids).await else {
            return;
        };
        for (account, health) in active.into_iter().zip(reading) {
            if health_gate(Some(&health)) == Gate::HalfOpen
                && let Err(error) = self.start_half_open_check(account.clone()).await
            {
                tracing::debug!(%error, account_id = account.id, "half-open check not started");
            }
        }
    }
}

/// The publisher: reads the pool every period, or sooner when a write asks, while the engine
/// lives.
async fn publish(engine: Weak<Selector>, sender: watch::Sender<Arc<PoolState>>) {
    loop {
        let Some(selector) = engine.upgrade() else {
            return;
        };
        if let Some(state) = selector.read_pool().await
            && sender.send(Arc::new(state)).is_err()
        {
            return;
        }
        let (period, notify, installed) = (
            selector.view_period(),
            selector.view_notify.clone(),
            selector.snapshot.installed(),
        );
        drop(selector);
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = notify.notified() => {}
            // A new config (a reload after an operator's change): the relays get it now.
            () = installed.notified() => {}
        }
        tokio::time::sleep(MIN_READ_SPACING).await;
    }
}

/// One relay's stream: the groups it serves, and what it was sent.
#[derive(Debug)]
pub struct ViewFilter {
    /// `None`: every group.
    groups: Option<HashSet<String>>,
    /// The snapshot the config sent was made from, and that config: a new snapshot (every
    /// reload makes one) is sent only when the relay's part of it changed.
    sent_config: Option<(Arc<Snapshot>, ViewConfig)>,
    /// Per account: the state sent, and when it had been read.
    sent: HashMap<AccountId, (AccountState, Instant)>,
    period_ms: u64,
    deployment: Deployment,
}

impl ViewFilter {
    /// A stream for a relay serving `groups` (empty: every group), planning with `deployment`
    /// (the selector's settings). Too many groups, or a name no group can have, is
    /// `InvalidArgument` naming `groups`.
    pub fn new(
        groups: Vec<String>,
        period: Duration,
        deployment: Deployment,
    ) -> Result<Self, SelectorError> {
        if groups.len() > MAX_VIEW_GROUPS {
            return Err(SelectorError::invalid(
                "groups",
                format!("at most {MAX_VIEW_GROUPS} groups"),
            ));
        }
        if let Some(bad) = groups
            .iter()
            .find(|group| group.is_empty() || group.len() > MAX_GROUP_BYTES)
        {
            return Err(SelectorError::invalid(
                "groups",
                format!(
                    "each group is 1..={MAX_GROUP_BYTES} bytes, got {} bytes",
                    bad.len()
                ),
            ));
        }
        Ok(ViewFilter {
            groups: (!groups.is_empty()).then(|| groups.into_iter().collect()),
            sent_config: None,
            sent: HashMap::new(),
            period_ms: millis(period).max(1),
            deployment,
        })
    }

    fn serves(&self, group: &str) -> bool {
        self.groups
            .as_ref()
            .is_none_or(|groups| groups.contains(group))
    }

    /// The update that brings the relay from what it was sent to `pool`: the config when it
    /// changed (and then every account's state), else the states that changed. Empty when
    /// nothing did (the stream's heartbeat).
    pub fn update(&mut self, pool: &PoolState) -> ViewUpdate {
        let new_snapshot = self
            .sent_config
            .as_ref()
            .is_none_or(|(sent, _)| !Arc::ptr_eq(sent, &pool.snapshot));
        let mut config = None;
        if new_snapshot {
            let made = self.config_of(&pool.snapshot);
            let changed = self
                .sent_config
                .as_ref()
                .is_none_or(|(_, sent)| *sent != made);
            if changed {
                // Every account's state follows a new config.
                self.sent.clear();
                config = Some(made.clone());
            }
            self.sent_config = Some((pool.snapshot.clone(), made));
        }
        let mut states = Vec::new();
        let mut served: HashSet<AccountId> = HashSet::new();
        for account in pool.snapshot.accounts() {
            if account.status != AccountStatus::Active || !self.serves(&account.group) {
                continue;
            }
            served.insert(account.id);
            let Some(state) = pool.states.get(&account.id) else {
                continue;
            };
            let unchanged = self
                .sent
                .get(&account.id)
                .is_some_and(|(sent, at)| same_state(sent, *at, state, pool.read_at));
            if !unchanged {
                states.push(state.clone());
                self.sent.insert(account.id, (state.clone(), pool.read_at));
            }
        }
        self.sent.retain(|id, _| served.contains(id));
        states.sort_unstable_by_key(|state| state.account_id);
        ViewUpdate {
            config,
            states,
            period_ms: self.period_ms,
        }
    }

    /// The config of the groups this relay serves.
    fn config_of(&self, snapshot: &Snapshot) -> ViewConfig {
        let mut groups: Vec<String> = snapshot
            .groups()
            .filter(|group| self.serves(group))
            .map(str::to_owned)
            .collect();
        groups.sort_unstable();
        let mut accounts: Vec<Account> = snapshot
            .accounts()
            .filter(|account| account.status == AccountStatus::Active)
            .filter(|account| self.serves(&account.group))
            .map(|account| Account {
                // A relay never holds a refresh token: the selector alone refreshes.
                oauth: None,
                ..(**account).clone()
            })
            .collect();
        accounts.sort_unstable_by_key(|account| account.id);
        let mut keys: Vec<(Vec<u8>, _)> = snapshot
            .api_key_hashes()
            .filter(|(_, record)| self.serves(&record.group))
            .map(|(hash, record)| (hash.to_vec(), record.clone()))
            .collect();
        keys.sort_unstable_by_key(|(_, record)| record.id);
        ViewConfig {
            settings: snapshot
                .group_settings_map()
                .iter()
                .filter(|(group, _)| self.serves(group))
                .map(|(group, settings)| (group.clone(), settings.clone()))
                .collect(),
            groups,
            accounts,
            keys,
            prices: snapshot.operator_prices().clone(),
            deployment: self.deployment,
        }
    }
}

/// Whether `now` (read at `now_at`) says what `sent` (read at `sent_at`) said: the same
/// counts, windows and confirmation, blocks and an open breaker ending at the same time.
fn same_state(sent: &AccountState, sent_at: Instant, now: &AccountState, now_at: Instant) -> bool {
    if sent.confirming != now.confirming || sent.windows != now.windows {
        return false;
    }
    match (&sent.health, &now.health) {
        (None, None) => true,
        (Some(a), Some(b)) => same_health(a, sent_at, b, now_at),
        _ => false,
    }
}

fn same_health(a: &AccountHealth, a_at: Instant, b: &AccountHealth, b_at: Instant) -> bool {
    let same_end = |a_ms: u64, b_ms: u64| {
        match (a_ms, b_ms) {
            (0, 0) => return true,
            (0, _) | (_, 0) => return false,
            _ => {}
        }
        let a_end = a_at + Duration::from_millis(a_ms);
        let b_end = b_at + Duration::from_millis(b_ms);
        let apart = if a_end > b_end {
            a_end - b_end
        } else {
            b_end - a_end
        };
        apart < SAME_END
    };
    let breakers = match (a.breaker, b.breaker) {
        (Breaker::Closed, Breaker::Closed) | (Breaker::HalfOpen, Breaker::HalfOpen) => true,
        (Breaker::Open(x), Breaker::Open(y)) => same_end(x.max(1), y.max(1)),
        _ => false,
    };
    a.inflight == b.inflight
        && a.failures == b.failures
        && breakers
        && same_end(a.hard_block_ms, b.hard_block_ms)
        && same_end(a.soft_block_ms, b.soft_block_ms)
}

#[cfg(test)]
mod tests;
