//! Selection at the edge (docs/DESIGN.md §2): the relay's own copy of the pool, as the selector
//! streams it ([`EdgeView`]), and the selection engine built over it ([`edge_selector`]): the
//! same engine and the same plans as the selector's, in the relay's process.
//!
//! The view is read-only where the selector owns the state: health, usage windows, the config.
//! Its writes fail (the engine never makes them at the edge: outcomes, usage and refreshes go to
//! the selector), and its confirmation lock is never taken, so a plan at the edge never starts a
//! half-open check (the selector's timer does). Bindings are the exception: the relay keeps the
//! ones it made or was told (written through the selector as well), so a session it has seen
//! needs no selector call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::engine::{Selector, SelectorParts, SelectorSettings};
use crate::health::{
    AccountHealth, Bindings, BlockInfo, Breaker, BreakerChange, HardBlock, Health, Locks,
    StateError, Windows,
};
use crate::metrics::Metrics;
use crate::snapshot::{Snapshot, SnapshotCell};
use crate::source::{AccountSource, ModelUsage, StoreError, UsageInput, UsageTotals};
use poolgate_core::account::{Account, AccountStatus, Secret};
use poolgate_core::lease::{LeaseId, LeaseTerms};
use poolgate_core::plan::Effect;
use poolgate_core::view::{AccountState, ViewUpdate};
use poolgate_core::windows::WindowReading;
use poolgate_core::{AccountId, Clock, millis};
use poolgate_runtime::ports::ProbeLeases;

/// Bindings kept at most, each kind (past it the oldest half goes).
const MAX_BINDINGS: usize = 200_000;

/// An account's state as the relay holds it: the selector's reading and when it arrived.
#[derive(Debug, Clone)]
struct Held {
    state: AccountState,
    at: Instant,
    /// When the selector answered this relay's report with a refreshed token (the account's
    /// confirmation over).
    refreshed: Option<Instant>,
}

/// How long after a refreshed-token answer an update that still shows the account confirming is
/// taken as read before the refresh (the publisher's read and the report's answer race), unless
/// an update showing it not confirming came first (the reads caught up).
const REFRESH_HOLD: Duration = Duration::from_secs(1);

impl Held {
    /// The health now: remaining times less what passed since the reading arrived (an open
    /// breaker whose time ran out is half-open: the selector's probe decides).
    fn health(&self, now: Instant) -> Option<AccountHealth> {
        let mut health = self.state.health?;
        let passed = millis(now.saturating_duration_since(self.at));
        health.hard_block_ms = health.hard_block_ms.saturating_sub(passed);
        health.soft_block_ms = health.soft_block_ms.saturating_sub(passed);
        if let Breaker::Open(ms) = health.breaker {
            health.breaker = match ms.saturating_sub(passed) {
                0 => Breaker::HalfOpen,
                left => Breaker::Open(left),
            };
        }
        Some(health)
    }
}

/// A binding the relay holds, and when it learned it.
#[derive(Debug, Clone, Copy)]
struct Bound {
    account: AccountId,
    at: Instant,
}

/// What the relay knows of a binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// Learned within the trust time: plan at the edge with it.
    Trusted(AccountId),
    /// Learned longer ago (another relay may have moved it since): ask the selector, and use it
    /// only when the selector cannot answer.
    Stale(AccountId),
    Unknown,
}

/// The relay's copy of the pool.
pub struct EdgeView {
    snapshot: Arc<SnapshotCell>,
    states: RwLock<HashMap<AccountId, Held>>,
    /// When the last update arrived; `None`: never (no view).
    received: Mutex<Option<Instant>>,
    /// The period the selector last said it sends at, ms.
    period_ms: AtomicU64,
    sessions: Mutex<HashMap<(String, String), Bound>>,
    responses: Mutex<HashMap<String, Bound>>,
}

impl Default for EdgeView {
    fn default() -> Self {
        EdgeView::new()
    }
}

impl EdgeView {
    pub fn new() -> Self {
        EdgeView {
            snapshot: Arc::new(SnapshotCell::new(Snapshot::default())),
            states: RwLock::new(HashMap::new()),
            received: Mutex::new(None),
            period_ms: AtomicU64::new(0),
            sessions: Mutex::new(HashMap::new()),
            responses: Mutex::new(HashMap::new()),
        }
    }

    /// Takes an update: a config replaces the snapshot whole (accounts gone from it lose their
    /// state); states replace the accounts' own.
    pub fn apply(&self, update: ViewUpdate) {
        let now = Instant::now();
        let mut states = self.states.write().unwrap_or_else(|p| p.into_inner());
        if let Some(config) = update.config {
            let snapshot = Snapshot::new(
                config.groups,
                config.accounts,
                config.keys.into_iter().collect(),
                config.prices,
            )
            .with_group_settings(config.settings)
            .with_deployment(config.deployment);
            states.retain(|id, _| snapshot.account(*id).is_some());
            let ticket = self.snapshot.ticket();
            self.snapshot.set(ticket, snapshot);
        }
        for mut state in update.states {
            let mut refreshed = states
                .get(&state.account_id)
                .and_then(|held| held.refreshed)
                .filter(|at| now.saturating_duration_since(*at) < REFRESH_HOLD);
            if refreshed.is_some() {
                if state.confirming {
                    // Read before the refresh the selector answered: that confirmation is over.
                    state.confirming = false;
                    if let Some(health) = state.health.as_mut() {
                        health.hard_block_ms = 0;
                    }
                } else {
                    // The selector's reads have caught up: a confirming state from here on is
                    // a new confirmation, taken as it comes.
                    refreshed = None;
                }
            }
            states.insert(
                state.account_id,
                Held {
                    state,
                    at: now,
                    refreshed,
                },
            );
        }
        drop(states);
        self.period_ms.store(update.period_ms, Ordering::Relaxed);
        *self.received.lock().unwrap_or_else(|p| p.into_inner()) = Some(now);
    }

    /// How long ago the last update arrived; `None`: no view yet.
    pub fn age(&self) -> Option<Duration> {
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|at| at.elapsed())
    }

    /// The period the selector sends at (0: no view yet).
    pub fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms.load(Ordering::Relaxed))
    }

    /// The config the relay selects from.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.get()
    }

    /// A session binding (`session` scoped to its key, `binding_key`), trusted for `trust`.
    pub fn session(&self, group: &str, session: &str, trust: Duration) -> Known {
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        known(sessions.get(&(group.to_owned(), session.to_owned())), trust)
    }

    /// A response binding (scoped to its key, `scoped_response`). A response is bound once:
    /// whatever the relay holds stays true.
    pub fn response(&self, scoped: &str) -> Option<AccountId> {
        let responses = self.responses.lock().unwrap_or_else(|p| p.into_inner());
        responses.get(scoped).map(|bound| bound.account)
    }

    /// Holds a session binding the selector answered (a remote plan's sticky account).
    pub fn learn_session(&self, group: &str, session: &str, account: AccountId) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        hold(
            &mut sessions,
            (group.to_owned(), session.to_owned()),
            account,
        );
    }

    /// Holds a response binding the selector answered.
    pub fn learn_response(&self, scoped: &str, account: AccountId) {
        let mut responses = self.responses.lock().unwrap_or_else(|p| p.into_inner());
        hold(&mut responses, scoped.to_owned(), account);
    }

    /// Merges readings the relay's own answers reported (the selector's next update confirms
    /// them), so they count before the round trip.
    pub fn note_windows(&self, account_id: AccountId, readings: &[WindowReading]) {
        let mut states = self.states.write().unwrap_or_else(|p| p.into_inner());
        if let Some(held) = states.get_mut(&account_id) {
            poolgate_core::windows::merge_readings(&mut held.state.windows, readings);
        }
    }

    /// Takes what the selector answered it applied to an outcome this relay reported, so the
    /// relay's next plan sees it before the next update brings it: a block, an open breaker, a
    /// confirmation (a hard block that may lift at any moment), a closed breaker, a refreshed
    /// token (the confirmation's block lifted). The selector's
    /// answer, not the relay's guess; the next update replaces it either way.
    pub fn note_applied(&self, account_id: AccountId, what: Effect, block_ms: u64) {
        let mut states = self.states.write().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let held = states.entry(account_id).or_insert_with(|| Held {
            state: AccountState {
                account_id,
                health: None,
                confirming: false,
                windows: Vec::new(),
            },
            at: now,
            refreshed: None,
        });
        let mut health = held.health(now).unwrap_or(UNKNOWN);
        match what {
            Effect::SoftBlock => health.soft_block_ms = health.soft_block_ms.max(block_ms),
            Effect::HardBlock | Effect::Error => {
                health.hard_block_ms = health.hard_block_ms.max(block_ms)
            }
            Effect::Confirming => {
                health.hard_block_ms = health.hard_block_ms.max(block_ms.max(1));
                held.state.confirming = true;
            }
            Effect::BreakerOpen => health.breaker = Breaker::Open(block_ms.max(1)),
            Effect::BreakerClosed => {
                health.breaker = Breaker::Closed;
                health.failures = 0;
            }
            // The refusal was the token's and the selector refreshed it: the confirmation that
            // kept clients away is over (the next update says so too, up to a period later).
            Effect::Refreshed => {
                held.refreshed = Some(now);
                if !held.state.confirming {
                    return;
                }
                health.hard_block_ms = 0;
                held.state.confirming = false;
            }
            Effect::None => return,
        }
        held.state.health = Some(health);
        held.at = now;
    }

    fn held(&self, id: AccountId) -> Option<Held> {
        self.states
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }
}

fn known(bound: Option<&Bound>, trust: Duration) -> Known {
    match bound {
        Some(bound) if bound.at.elapsed() < trust => Known::Trusted(bound.account),
        Some(bound) => Known::Stale(bound.account),
        None => Known::Unknown,
    }
}

fn hold<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Bound>, key: K, account: AccountId) {
    if map.len() >= MAX_BINDINGS {
        let mut ages: Vec<Instant> = map.values().map(|bound| bound.at).collect();
        ages.sort_unstable();
        let cut = ages[ages.len() / 2];
        map.retain(|_, bound| bound.at > cut);
    }
    map.insert(
        key,
        Bound {
            account,
            at: Instant::now(),
        },
    );
}

/// An account the view has no reading of: plannable, with no load known (as a selector plans
/// an account whose health it cannot read).
const UNKNOWN: AccountHealth = AccountHealth {
    inflight: None,
    ..AccountHealth::HEALTHY
};

mod ports;
#[cfg(test)]
use ports::ViewHealth;
pub use ports::edge_selector;

#[cfg(test)]
mod tests;
