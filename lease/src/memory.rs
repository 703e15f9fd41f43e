//! The in-process backend: the same semantics as the Redis scripts, for one process. It is the
//! embedded default (`admission-svc` without `--redis-url`) and the fallback of the `open` and
//! `divided` Redis failure policies.
//!
//! Time is the [`Clock`] it is given: tests move a manual clock instead of sleeping.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;
use std::time::Instant;

use crate::backend::{AcquireLimits, KeyCharge, KeyGate, LeaseBackend};
use poolgate_core::lease::{
    Denial, DenyReason, LeaseId, LeaseTerms, LostReason, Renewal, Resumption,
};
use poolgate_core::status::AdmissionReport;
use poolgate_core::{AccountId, Clock};
use poolgate_runtime::error::StateError;

mod client_keys;
mod fences;
use client_keys::KeyState;
use fences::Fences;

#[derive(Default)]
struct AccountState {
    /// lease id -> expiry (ms)
    leases: HashMap<String, u64>,
    /// RPM event times (ms), oldest first.
    rpm_events: VecDeque<(u64, String)>,
    cooldown_until: u64,
    /// waiter id -> expiry (ms)
    waiters: HashMap<String, u64>,
    /// lease id -> holder epoch (resumed leases only)
    holders: HashMap<String, u64>,
    /// Released leases no renewal or resume restores, until their fence expires.
    released: Fences,
    window: Option<SpendWindow>,
}

#[derive(Clone, Copy)]
struct SpendWindow {
    start: u64,
    spend_micros: i64,
}

impl AccountState {
    fn live_leases(&mut self, now: u64) -> usize {
        self.leases.retain(|_, expiry| *expiry >= now);
        let leases = &self.leases;
        self.holders.retain(|id, _| leases.contains_key(id));
        self.leases.len()
    }

    fn is_live(&self, lease_id: &str, now: u64) -> bool {
        self.leases
            .get(lease_id)
            .is_some_and(|expiry| *expiry >= now)
    }

    fn is_fenced(&mut self, lease_id: &str, now: u64) -> bool {
        self.released.prune(now);
        self.released.contains(lease_id, now)
    }

    fn prune_fences(&mut self, now: u64) {
        self.released.prune(now);
    }

    fn fence(&mut self, lease_id: &str, until: u64) {
        self.released.raise(lease_id, until);
    }

    fn is_empty(&self) -> bool {
        self.leases.is_empty()
            && self.released.is_empty()
            && self.rpm_events.is_empty()
            && self.waiters.is_empty()
            && self.window.is_none()
    }

    fn window_spend(&mut self, now: u64, window_ms: u64) -> Option<SpendWindow> {
        if let Some(window) = self.window
            && now >= window.start + window_ms
        {
            self.window = None;
        }
        self.window
    }

    fn add_spend(&mut self, now: u64, micros: i64, window_ms: u64) -> i64 {
        match self.window_spend(now, window_ms) {
            Some(mut window) => {
                window.spend_micros += micros;
                self.window = Some(window);
                window.spend_micros
            }
            None => {
                self.window = Some(SpendWindow {
                    start: now,
                    spend_micros: micros,
                });
                micros
            }
        }
    }
}

/// Rolling-minute event log shared by account RPM and user RPM.
fn rpm_check(
    events: &mut VecDeque<(u64, String)>,
    now: u64,
    limit: i32,
    window_ms: u64,
) -> Option<Denial> {
    let since = now.saturating_sub(window_ms);
    while events.front().is_some_and(|(at, _)| *at < since) {
        events.pop_front();
    }
    if limit > 0 && events.len() >= limit as usize {
        let oldest = events.front().map(|(at, _)| *at).unwrap_or(now);
        return Some(Denial::new(
            DenyReason::Rpm,
            (oldest + window_ms).saturating_sub(now).max(1),
        ));
    }
    None
}

/// LeaseEngine state of one process.
pub struct MemoryBackend {
    clock: Clock,
    epoch: Instant,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    accounts: HashMap<AccountId, AccountState>,
    users: HashMap<String, VecDeque<(u64, String)>>,
    keys: HashMap<i64, KeyState>,
}

impl MemoryBackend {
    /// An empty backend on `clock` (its TTLs, windows and cool-downs run on it).
    pub fn new(clock: Clock) -> Self {
        MemoryBackend {
            epoch: clock.now(),
            clock,
            state: Mutex::new(State::default()),
        }
    }

    /// Milliseconds since the backend was made; starts at 1 so 0 can mean "never".
    fn now(&self) -> u64 {
        u64::try_from(self.clock.since(self.epoch).as_millis()).unwrap_or(u64::MAX) + 1
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State, u64) -> T) -> T {
        let now = self.now();
        // A panic while holding the lock cannot leave half-applied state worth refusing over:
        // every mutation below is a single map operation.
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut state, now)
    }

    /// What this process admitted on its own (live leases, RPM events of the last window), for
    /// writing into Redis when it returns: the recovery step of the failure policies.
    pub fn snapshot(&self, rpm_window_ms: u64) -> FallbackSnapshot {
        self.with_state(|state, now| {
            let mut snapshot = FallbackSnapshot::default();
            let since = now.saturating_sub(rpm_window_ms);
            for (&account_id, account) in state.accounts.iter_mut() {
                account.live_leases(now);
                let leases: Vec<(String, u64)> = account
                    .leases
                    .iter()
                    .map(|(id, expiry)| (id.clone(), expiry - now))
                    .collect();
                let events: Vec<(String, u64)> = account
                    .rpm_events
                    .iter()
                    .filter(|(at, _)| *at >= since)
                    .map(|(at, id)| (id.clone(), now - at))
                    .collect();
                if !leases.is_empty() || !events.is_empty() {
                    snapshot.accounts.push(AccountSnapshot {
                        account_id,
                        leases,
                        rpm_events: events,
                    });
                }
            }
            for (&api_key_id, key) in state.keys.iter_mut() {
                key.live_leases(now);
                let leases: Vec<(String, u64)> = key
                    .leases
                    .iter()
                    .map(|(id, expiry)| (id.clone(), expiry - now))
                    .collect();
                if !leases.is_empty() {
                    snapshot.keys.push((api_key_id, leases));
                }
            }
            for (user, events) in &state.users {
                let events: Vec<(String, u64)> = events
                    .iter()
                    .filter(|(at, _)| *at >= since)
                    .map(|(at, id)| (id.clone(), now - at))
                    .collect();
                if !events.is_empty() {
                    snapshot.users.push((user.clone(), events));
                }
            }
            snapshot
        })
    }

    /// Forgets what a snapshot held (it now lives in Redis).
    pub fn forget(&self, snapshot: &FallbackSnapshot) {
        self.with_state(|state, _| {
            for written in &snapshot.accounts {
                if let Some(account) = state.accounts.get_mut(&written.account_id) {
                    for (id, _) in &written.leases {
                        account.leases.remove(id);
                    }
                    account
                        .rpm_events
                        .retain(|(_, id)| !written.rpm_events.iter().any(|(w, _)| w == id));
                }
            }
            for (user, written) in &snapshot.users {
                if let Some(events) = state.users.get_mut(user) {
                    events.retain(|(_, id)| !written.iter().any(|(w, _)| w == id));
                }
            }
            for (api_key_id, written) in &snapshot.keys {
                if let Some(key) = state.keys.get_mut(api_key_id) {
                    for (id, _) in written {
                        key.leases.remove(id);
                    }
                }
            }
        })
    }
}

/// Leases and RPM events one process admitted while Redis was away.
#[derive(Debug, Default, Clone)]
pub struct FallbackSnapshot {
    pub accounts: Vec<AccountSnapshot>,
    /// user -> (event id, age ms)
    pub users: Vec<(String, Vec<(String, u64)>)>,
    /// client key -> (lease id, remaining ttl ms): the key slots of keyed leases.
    pub keys: Vec<(i64, Vec<(String, u64)>)>,
}

impl FallbackSnapshot {
    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty() && self.users.is_empty() && self.keys.is_empty()
    }
}

#[derive(Debug, Clone)]
pub struct AccountSnapshot {
    pub account_id: AccountId,
    /// (lease id, remaining ttl ms)
    pub leases: Vec<(String, u64)>,
    /// (event id, age ms)
    pub rpm_events: Vec<(String, u64)>,
}

#[async_trait]
impl LeaseBackend for MemoryBackend {
    async fn wall_now_ms(&self) -> Result<i64, StateError> {
        Ok(self.clock.wall_ms())
    }

    async fn charge_user(
        &self,
        user_id: &str,
        rpm_limit: i32,
        event_id: &str,
        window_ms: u64,
    ) -> Result<Option<Denial>, StateError> {
        Ok(self.with_state(|state, now| {
            let events = state.users.entry(user_id.to_owned()).or_default();
            if events.iter().any(|(_, id)| id == event_id) {
                return None;
            }
            if let Some(denial) = rpm_check(events, now, rpm_limit, window_ms) {
                return Some(Denial::new(DenyReason::UserRpm, denial.retry_after_ms));
            }
            events.push_back((now, event_id.to_owned()));
            None
        }))
    }

    async fn refund_user(&self, user_id: &str, event_id: &str) -> Result<(), StateError> {
        self.with_state(|state, _| {
            if let Some(events) = state.users.get_mut(user_id) {
                events.retain(|(_, id)| id != event_id);
                if events.is_empty() {
                    state.users.remove(user_id);
                }
            }
        });
        Ok(())
    }

    async fn acquire_keyed(
        &self,
        terms: &LeaseTerms,
        lease_id: &LeaseId,
        limits: AcquireLimits,
        key: Option<&KeyGate>,
    ) -> Result<Option<Denial>, StateError> {
        Ok(self.with_state(|state, now| {
            let State {
                accounts,
                users,
                keys,
            } = state;
            // The user gate first (its refusal wins, as on Redis), checked only: it is charged
            // below, with the lease, when every gate passed.
            let user = terms.user.as_ref().filter(|user| user.rpm_limit > 0);
            if let Some(user) = user
                && let Some(events) = users.get_mut(&user.user_id)
                && let Some(denial) = rpm_check(events, now, user.rpm_limit, limits.rpm_window_ms)
            {
                return Some(Denial::new(DenyReason::UserRpm, denial.retry_after_ms));
            }
            // Then the key's gates, checked only: the key slot is taken with the lease.
            let key_slot = lease_id.api_key_id();
            if let Some(gate) = key
                && let Some(denial) = keys.entry(gate.api_key_id).or_default().check(gate, now)
            {
                return Some(denial);
            }
            let account = accounts.entry(terms.account_id).or_default();
            if !terms.ignore_cooldown && account.cooldown_until > now {
                return Some(Denial::new(
                    DenyReason::Cooling,
                    account.cooldown_until - now,
                ));
            }
            let held = account.live_leases(now);
            if terms.concurrency_limit > 0 && held >= terms.concurrency_limit as usize {
                return Some(Denial::new(DenyReason::Concurrency, 0));
            }
            if let Some(denial) = rpm_check(
                &mut account.rpm_events,
                now,
                terms.rpm_limit,
                limits.rpm_window_ms,
            ) {
                return Some(denial);
            }
            if limits.window_limit_micros > 0
                && let Some(window) = account.window_spend(now, limits.session_window_ms)
                && window.spend_micros >= limits.window_limit_micros
            {
                let ends = window.start + limits.session_window_ms;
                return Some(Denial::new(DenyReason::SessionWindow, ends - now));
            }
            account
                .leases
                .insert(lease_id.as_str().to_owned(), now + limits.ttl_ms);
            if let Some(api_key_id) = key_slot {
                keys.entry(api_key_id)
                    .or_default()
                    .leases
                    .insert(lease_id.as_str().to_owned(), now + limits.ttl_ms);
            }
            if terms.rpm_limit > 0 {
                account
                    .rpm_events
                    .push_back((now, lease_id.as_str().to_owned()));
            }
            if let Some(user) = user {
                users
                    .entry(user.user_id.clone())
                    .or_default()
                    .push_back((now, lease_id.as_str().to_owned()));
            }
            None
        }))
    }

    async fn renew(
        &self,
        lease_id: &LeaseId,
        ttl_ms: u64,
        restore_within: Option<i32>,
        key_limit: i32,
    ) -> Result<Renewal, StateError> {
        Ok(self.with_state(|state, now| {
            let State { accounts, keys, .. } = state;
            let account = accounts.entry(lease_id.account_id()).or_default();
            let id = lease_id.as_str();
            let mut key = lease_id
                .api_key_id()
                .map(|api_key_id| keys.entry(api_key_id).or_default());
            if account.is_live(id, now) {
                account.leases.insert(id.to_owned(), now + ttl_ms);
                account.released.remove(id);
                if let Some(key) = key.as_mut() {
                    key.leases.insert(id.to_owned(), now + ttl_ms);
                    key.released.remove(id);
                }
                return Renewal::Renewed;
            }
            if account.is_fenced(id, now) || key.as_mut().is_some_and(|k| k.is_fenced(id, now)) {
                return Renewal::Lost(LostReason::Released);
            }
            let Some(limit) = restore_within else {
                return Renewal::Lost(LostReason::Expired);
            };
            let held = account.live_leases(now);
            if limit > 0 && held >= limit as usize {
                return Renewal::Lost(LostReason::NoRoom);
            }
            if let Some(key) = key.as_mut() {
                let live = key.leases.get(id).is_some_and(|expiry| *expiry >= now);
                let held = key.live_leases(now);
                if !live && key_limit > 0 && held >= key_limit as usize {
                    return Renewal::Lost(LostReason::NoRoom);
                }
                key.leases.insert(id.to_owned(), now + ttl_ms);
            }
            account.leases.insert(id.to_owned(), now + ttl_ms);
            Renewal::Restored
        }))
    }

    async fn resume(
        &self,
        lease_id: &LeaseId,
        ttl_ms: u64,
        _key_limit: i32,
    ) -> Result<Resumption, StateError> {
        Ok(self.with_state(|state, now| {
            // One process: the key slot holds exactly the account's keyed leases, so it follows.
            if let Some(api_key_id) = lease_id.api_key_id()
                && state
                    .accounts
                    .get(&lease_id.account_id())
                    .is_some_and(|account| account.is_live(lease_id.as_str(), now))
            {
                let key = state.keys.entry(api_key_id).or_default();
                key.leases
                    .insert(lease_id.as_str().to_owned(), now + ttl_ms);
                key.released.remove(lease_id.as_str());
            }
            let Some(account) = state.accounts.get_mut(&lease_id.account_id()) else {
                return Resumption::Unknown;
            };
            let id = lease_id.as_str();
            if !account.is_live(id, now) {
                return if account.is_fenced(id, now) {
                    Resumption::Released
                } else {
                    Resumption::Unknown
                };
            }
            account.leases.insert(id.to_owned(), now + ttl_ms);
            account.released.remove(id);
            let epoch = account.holders.entry(id.to_owned()).or_insert(0);
            *epoch += 1;
            Resumption::Resumed {
                holder_epoch: *epoch,
            }
        }))
    }

    async fn attempt(
        &self,
        lease_id: &LeaseId,
        rpm_limit: i32,
        event_id: &str,
        window_ms: u64,
    ) -> Result<Option<Denial>, StateError> {
        Ok(self.with_state(|state, now| {
            let account = state.accounts.entry(lease_id.account_id()).or_default();
            if let Some(denial) = rpm_check(&mut account.rpm_events, now, rpm_limit, window_ms) {
                return Some(denial);
            }
            if rpm_limit > 0 {
                account.rpm_events.push_back((now, event_id.to_owned()));
            }
            None
        }))
    }

    async fn release_charged(
        &self,
        lease_id: &LeaseId,
        spend_micros: i64,
        session_window_ms: u64,
        fence_ms: u64,
        key: Option<&KeyCharge>,
    ) -> Result<bool, StateError> {
        Ok(self.with_state(|state, now| {
            if let Some(api_key_id) = lease_id.api_key_id() {
                let state_of_key = state.keys.entry(api_key_id).or_default();
                state_of_key.leases.remove(lease_id.as_str());
                state_of_key.is_fenced(lease_id.as_str(), now);
                state_of_key.fence(lease_id.as_str(), now + fence_ms);
                if let Some(charge) = key {
                    state_of_key.charge(lease_id.as_str(), charge, now, fence_ms);
                }
            }
            let account_id = lease_id.account_id();
            let account = state.accounts.entry(account_id).or_default();
            let removed = account
                .leases
                .remove(lease_id.as_str())
                .is_some_and(|expiry| expiry >= now);
            account.holders.remove(lease_id.as_str());
            account.prune_fences(now);
            account.fence(lease_id.as_str(), now + fence_ms);
            if spend_micros > 0 {
                account.add_spend(now, spend_micros, session_window_ms);
            }
            account.live_leases(now);
            if account.is_empty() && account.cooldown_until <= now {
                state.accounts.remove(&account_id);
            }
            removed
        }))
    }

    async fn orphan(
        &self,
        lease_id: &LeaseId,
        grace_ms: u64,
        holder_epoch: u64,
        fence_ms: u64,
    ) -> Result<(), StateError> {
        self.with_state(|state, now| {
            let id = lease_id.as_str();
            if let Some(account) = state.accounts.get_mut(&lease_id.account_id())
                && account.holders.get(id).copied().unwrap_or(0) == holder_epoch
                && let Some(expiry) = account.leases.get_mut(id)
                && *expiry >= now
            {
                *expiry = (*expiry).min(now + grace_ms);
                let ends = *expiry;
                account.fence(id, ends + fence_ms);
                if let Some(api_key_id) = lease_id.api_key_id() {
                    let key = state.keys.entry(api_key_id).or_default();
                    if let Some(key_expiry) = key.leases.get_mut(id) {
                        *key_expiry = (*key_expiry).min(ends);
                    }
                    key.fence(id, ends + fence_ms);
                }
            }
        });
        Ok(())
    }

    async fn inflight(&self, account_ids: &[AccountId]) -> Result<Vec<u32>, StateError> {
        Ok(self.with_state(|state, now| {
            account_ids
                .iter()
                .map(|id| {
                    state.accounts.get(id).map_or(0, |account| {
                        account
                            .leases
                            .values()
                            .filter(|expiry| **expiry >= now)
                            .count() as u32
                    })
                })
                .collect()
        }))
    }

    async fn usage(
        &self,
        account_ids: &[AccountId],
        rpm_window_ms: u64,
        session_window_ms: u64,
    ) -> Result<Vec<(u32, i64)>, StateError> {
        Ok(self.with_state(|state, now| {
            let since = now.saturating_sub(rpm_window_ms);
            account_ids
                .iter()
                .map(|id| {
                    state.accounts.get_mut(id).map_or((0, 0), |account| {
                        let rpm = account
                            .rpm_events
                            .iter()
                            .filter(|(at, _)| *at >= since)
                            .count() as u32;
                        let spend = account
                            .window_spend(now, session_window_ms)
                            .map_or(0, |window| window.spend_micros);
                        (rpm, spend)
                    })
                })
                .collect()
        }))
    }

    async fn admission_status(&self) -> AdmissionReport {
        AdmissionReport::in_process()
    }

    async fn key_inflight(&self, api_key_ids: &[i64]) -> Result<Vec<u32>, StateError> {
        Ok(self.with_state(|state, now| {
            api_key_ids
                .iter()
                .map(|id| {
                    state.keys.get(id).map_or(0, |key| {
                        key.leases.values().filter(|expiry| **expiry >= now).count() as u32
                    })
                })
                .collect()
        }))
    }

    async fn record_spend(
        &self,
        account_id: AccountId,
        spend_micros: i64,
        session_window_ms: u64,
    ) -> Result<i64, StateError> {
        Ok(self.with_state(|state, now| {
            state.accounts.entry(account_id).or_default().add_spend(
                now,
                spend_micros,
                session_window_ms,
            )
        }))
    }

    async fn seed_budget(
        &self,
        api_key_id: i64,
        period_id: &str,
        micros: i64,
        expires_in_ms: u64,
    ) -> Result<bool, StateError> {
        Ok(self.with_state(|state, now| {
            let key = state.keys.entry(api_key_id).or_default();
            key.spent(period_id, now);
            if let Some((spent, _)) = key.spend.get_mut(period_id) {
                if *spent >= micros {
                    return false;
                }
                *spent = micros;
                return true;
            }
            let expiry = if expires_in_ms == 0 {
                0
            } else {
                now + expires_in_ms
            };
            key.spend.insert(period_id.to_owned(), (micros, expiry));
            true
        }))
    }

    async fn set_cooldown(&self, account_id: AccountId, ttl_ms: u64) -> Result<(), StateError> {
        self.with_state(|state, now| {
            let account = state.accounts.entry(account_id).or_default();
            account.cooldown_until = account.cooldown_until.max(now + ttl_ms);
        });
        Ok(())
    }

    async fn clear_cooldown(&self, account_id: AccountId) -> Result<(), StateError> {
        self.with_state(|state, _| {
            if let Some(account) = state.accounts.get_mut(&account_id) {
                account.cooldown_until = 0;
                if account.is_empty() {
                    state.accounts.remove(&account_id);
                }
            }
        });
        Ok(())
    }

    async fn register_waiter(
        &self,
        account_id: AccountId,
        waiter_id: &str,
        max_waiting: u32,
        ttl_ms: u64,
    ) -> Result<Option<u32>, StateError> {
        Ok(self.with_state(|state, now| {
            let account = state.accounts.entry(account_id).or_default();
            account.waiters.retain(|_, expiry| *expiry >= now);
            if !account.waiters.contains_key(waiter_id)
                && account.waiters.len() >= max_waiting as usize
            {
                return None;
            }
            account.waiters.insert(waiter_id.to_owned(), now + ttl_ms);
            Some(account.waiters.len() as u32)
        }))
    }

    async fn remove_waiter(
        &self,
        account_id: AccountId,
        waiter_id: &str,
    ) -> Result<(), StateError> {
        self.with_state(|state, _| {
            if let Some(account) = state.accounts.get_mut(&account_id) {
                account.waiters.remove(waiter_id);
            }
        });
        Ok(())
    }
}
