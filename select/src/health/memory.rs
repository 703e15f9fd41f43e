//! Account health in this process's memory, for the relay's standalone mode: the semantics of
//! the Redis store (`redis.rs`) in one map behind a `Mutex`.
//!
//! The coupling with admission is kept too: a hard block is also the in-process admission
//! engine's cooldown (so admission refuses the account in the same step that takes a slot, and
//! the probe's `ignore_cooldown` lease still goes through), and the live lease count is
//! admission's. Admission keeps only a deadline, so the block's class and reason live here.
//!
//! Time is `tokio::time::Instant` counted from the wall clock at construction, as in admission's
//! memory backend, so tests may pause and advance it and both agree on when a block ends.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use poolgate_runtime::ports::Cooldowns;
use tokio::time::Instant;

use super::{
    AccountHealth, BackendError, BlockInfo, Breaker, BreakerChange, HealthStore, block_value,
    breaker_reason, parse_block_value,
};
use poolgate_core::{AccountId, now_ms};

/// How long a breaker's count is kept after its last change (Redis: the hash's expiry).
const BREAKER_KEEP_MS: i64 = 86_400_000;

/// Bindings are pruned of expired entries when their map grows past this (and then past twice
/// what was left), so pruning stays amortized however many live bindings there are.
const PRUNE_FLOOR: usize = 10_000;

/// A value with a deadline (a Redis key with a TTL).
#[derive(Debug, Clone)]
struct Expiring<T> {
    value: T,
    until: i64,
}

impl<T> Expiring<T> {
    fn new(value: T, now: i64, ttl_ms: u64) -> Self {
        Expiring {
            value,
            until: now.saturating_add(i64::try_from(ttl_ms.max(1)).unwrap_or(i64::MAX)),
        }
    }

    fn left(&self, now: i64) -> Option<u64> {
        (self.until > now).then(|| (self.until - now) as u64)
    }
}

fn live<T>(slot: &Option<Expiring<T>>, now: i64) -> Option<&Expiring<T>> {
    slot.as_ref().filter(|entry| entry.until > now)
}

#[derive(Debug, Clone, Copy)]
struct BreakerState {
    failures: u32,
    /// 0: closed.
    open_until: i64,
    open_ms: u64,
    /// When the whole record lapses.
    expires: i64,
}

#[derive(Debug, Default)]
struct AccountState {
    hard: Option<Expiring<String>>,
    soft: Option<Expiring<String>>,
    breaker: Option<BreakerState>,
    /// Unauthorized outcome times, oldest first, and when the whole record lapses.
    unauthorized: VecDeque<i64>,
    unauthorized_until: i64,
    confirm_lock: Option<Expiring<String>>,
    refresh_lock: Option<Expiring<String>>,
}

impl AccountState {
    fn breaker(&self, now: i64) -> Option<BreakerState> {
        self.breaker.filter(|b| b.expires > now)
    }

    fn health(&self, now: i64, inflight: u32) -> AccountHealth {
        let breaker = self.breaker(now);
        AccountHealth {
            inflight: Some(inflight),
            hard_block_ms: live(&self.hard, now).and_then(|b| b.left(now)).unwrap_or(0),
            soft_block_ms: live(&self.soft, now).and_then(|b| b.left(now)).unwrap_or(0),
            breaker: match breaker.map(|b| b.open_until) {
                None | Some(0) => Breaker::Closed,
                Some(until) if until > now => Breaker::Open((until - now) as u64),
                Some(_) => Breaker::HalfOpen,
            },
            failures: breaker.map_or(0, |b| b.failures),
        }
    }
}

/// Sets a block unless a later one is there; returns the block left and whether it was set.
fn block(slot: &mut Option<Expiring<String>>, now: i64, ttl_ms: u64, value: String) -> (u64, bool) {
    let ttl_ms = ttl_ms.max(1);
    if let Some(left) = live(slot, now).and_then(|b| b.left(now))
        && left >= ttl_ms
    {
        return (left, false);
    }
    *slot = Some(Expiring::new(value, now, ttl_ms));
    (ttl_ms, true)
}

/// `SET NX PX`: whether `owner` took the lock.
fn lock(slot: &mut Option<Expiring<String>>, now: i64, owner: &str, ttl_ms: u64) -> bool {
    if live(slot, now).is_some() {
        return false;
    }
    *slot = Some(Expiring::new(owner.to_owned(), now, ttl_ms));
    true
}

/// Deletes the entry only if it still holds `value`.
fn delete_if(slot: &mut Option<Expiring<String>>, now: i64, value: &str) -> bool {
    if live(slot, now).is_some_and(|entry| entry.value == value) {
        *slot = None;
        return true;
    }
    false
}

/// Bindings with amortized pruning of expired entries.
#[derive(Debug)]
struct Bindings<K> {
    entries: HashMap<K, Expiring<AccountId>>,
    prune_at: usize,
}

impl<K: std::hash::Hash + Eq> Bindings<K> {
    fn new() -> Self {
        Bindings {
            entries: HashMap::new(),
            prune_at: PRUNE_FLOOR,
        }
    }

    fn get(&self, key: &K, now: i64) -> Option<AccountId> {
        self.entries
            .get(key)
            .filter(|entry| entry.until > now)
            .map(|entry| entry.value)
    }

    fn set(&mut self, key: K, id: AccountId, now: i64, ttl_ms: u64) -> Option<AccountId> {
        let previous = self.get(&key, now);
        self.entries.insert(key, Expiring::new(id, now, ttl_ms));
        if self.entries.len() > self.prune_at {
            self.entries.retain(|_, entry| entry.until > now);
            self.prune_at = (self.entries.len() * 2).max(PRUNE_FLOOR);
        }
        previous
    }

    fn touch(&mut self, key: &K, now: i64, ttl_ms: u64) {
        if let Some(entry) = self.entries.get_mut(key).filter(|entry| entry.until > now) {
            *entry = Expiring::new(entry.value, now, ttl_ms);
        }
    }

    fn remove(&mut self, key: &K, now: i64) -> bool {
        self.entries
            .remove(key)
            .is_some_and(|entry| entry.until > now)
    }
}

struct State {
    accounts: HashMap<AccountId, AccountState>,
    sticky: Bindings<(String, String)>,
    responses: Bindings<String>,
}

/// Health in memory, coupled to the in-process admission engine.
pub struct InProcessHealth {
    admission: Arc<dyn Cooldowns>,
    state: Mutex<State>,
    /// Held across a hard-block change and the admission cooldown write that mirrors it, so two
    /// changes cannot reach admission in the other order than they were made here (a clear
    /// overtaken by the block it cleared would leave admission refusing an unblocked account).
    cooldown_writes: tokio::sync::Mutex<()>,
    started: Instant,
    started_ms: i64,
}

impl InProcessHealth {
    /// Health over `admission`, the engine the process's leases are taken from (its memory
    /// backend: hard blocks become its cooldowns, its leases are the load).
    pub fn new(admission: Arc<dyn Cooldowns>) -> Self {
        InProcessHealth {
            admission,
            state: Mutex::new(State {
                accounts: HashMap::new(),
                sticky: Bindings::new(),
                responses: Bindings::new(),
            }),
            cooldown_writes: tokio::sync::Mutex::new(()),
            started: Instant::now(),
            started_ms: now_ms(),
        }
    }

    fn clock(&self) -> i64 {
        let elapsed = i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.started_ms.saturating_add(elapsed)
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State, i64) -> T) -> T {
        let now = self.clock();
        // Every change below is a few map operations that cannot fail half way: a poisoned lock
        // holds nothing worth refusing over.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut state, now)
    }

    fn with_account<T>(&self, id: AccountId, f: impl FnOnce(&mut AccountState, i64) -> T) -> T {
        self.with_state(|state, now| f(state.accounts.entry(id).or_default(), now))
    }

    /// A hard block, here and as admission's cooldown. Returns the block left.
    async fn hard(&self, id: AccountId, ttl_ms: u64, value: String) -> Result<u64, BackendError> {
        let _order = self.cooldown_writes.lock().await;
        let (left, set) = self.with_account(id, |account, now| {
            block(&mut account.hard, now, ttl_ms, value)
        });
        if set {
            self.admission
                .set_cooldown(id, Duration::from_millis(left))
                .await?;
        }
        Ok(left)
    }

    async fn reads(&self, ids: &[AccountId]) -> Result<Vec<AccountHealth>, BackendError> {
        let inflight = self.admission.inflight(ids).await?;
        if inflight.len() != ids.len() {
            return Err(BackendError::Failed(
                "admission answered the wrong number of lease counts".into(),
            ));
        }
        Ok(self.with_state(|state, now| {
            ids.iter()
                .zip(inflight)
                .map(|(id, inflight)| match state.accounts.get(id) {
                    Some(account) => account.health(now, inflight),
                    None => AccountHealth {
                        inflight: Some(inflight),
                        ..AccountHealth::HEALTHY
                    },
                })
                .collect()
        }))
    }
}

#[async_trait]
impl HealthStore for InProcessHealth {
    async fn now(&self) -> Result<i64, BackendError> {
        Ok(self.clock())
    }

    async fn read_batch(&self, ids: &[AccountId]) -> Result<Vec<AccountHealth>, BackendError> {
        self.reads(ids).await
    }

    async fn read_one(&self, id: AccountId) -> Result<AccountHealth, BackendError> {
        self.reads(&[id])
            .await?
            .pop()
            .ok_or_else(|| BackendError::Failed("no reading".into()))
    }

    async fn hard_block(
        &self,
        id: AccountId,
        ttl_ms: u64,
        class: &str,
        status: u16,
        reason: &str,
    ) -> Result<u64, BackendError> {
        self.hard(id, ttl_ms, block_value(class, status, reason))
            .await
    }

    async fn soft_block(
        &self,
        id: AccountId,
        ttl_ms: u64,
        class: &str,
        status: u16,
        reason: &str,
    ) -> Result<u64, BackendError> {
        let value = block_value(class, status, reason);
        Ok(self.with_account(id, |account, now| {
            block(&mut account.soft, now, ttl_ms, value).0
        }))
    }

    async fn breaker_failure(
        &self,
        id: AccountId,
        threshold: u32,
        open_ms: u64,
        max_open_ms: u64,
    ) -> Result<BreakerChange, BackendError> {
        Ok(self.with_account(id, |account, now| {
            let mut breaker = account.breaker(now).unwrap_or(BreakerState {
                failures: 0,
                open_until: 0,
                open_ms: 0,
                expires: 0,
            });
            breaker.failures = breaker.failures.saturating_add(1);
            let as_ms = |ms: u64| i64::try_from(ms).unwrap_or(i64::MAX);
            let change = if breaker.open_until > 0 {
                if now >= breaker.open_until {
                    breaker.open_ms = breaker.open_ms.saturating_mul(2).min(max_open_ms);
                    breaker.open_until = now.saturating_add(as_ms(breaker.open_ms));
                    breaker.expires = now
                        .saturating_add(BREAKER_KEEP_MS)
                        .saturating_add(as_ms(breaker.open_ms));
                    BreakerChange::Reopened(breaker.open_ms)
                } else {
                    BreakerChange::StillOpen
                }
            } else if breaker.failures >= threshold {
                breaker.open_ms = open_ms;
                breaker.open_until = now.saturating_add(as_ms(open_ms));
                breaker.expires = now
                    .saturating_add(BREAKER_KEEP_MS)
                    .saturating_add(as_ms(open_ms));
                BreakerChange::Opened(open_ms)
            } else {
                breaker.expires = now.saturating_add(BREAKER_KEEP_MS);
                BreakerChange::Counted(breaker.failures)
            };
            account.breaker = Some(breaker);
            change
        }))
    }

    async fn breaker_success(&self, id: AccountId) -> Result<bool, BackendError> {
        Ok(self.with_account(id, |account, now| {
            let was_open = account.breaker(now).is_some_and(|b| b.open_until > 0);
            account.breaker = None;
            was_open
        }))
    }

    async fn count_unauthorized(&self, id: AccountId, window_ms: u64) -> Result<u32, BackendError> {
        let window = i64::try_from(window_ms).unwrap_or(i64::MAX);
        Ok(self.with_account(id, |account, now| {
            if account.unauthorized_until <= now {
                account.unauthorized.clear();
            }
            let since = now.saturating_sub(window);
            while account.unauthorized.front().is_some_and(|at| *at < since) {
                account.unauthorized.pop_front();
            }
            account.unauthorized.push_back(now);
            account.unauthorized_until = now.saturating_add(window);
            u32::try_from(account.unauthorized.len()).unwrap_or(u32::MAX)
        }))
    }

    async fn clear(&self, id: AccountId) -> Result<(), BackendError> {
        let _order = self.cooldown_writes.lock().await;
        self.with_account(id, |account, _| {
            account.hard = None;
            account.soft = None;
            account.breaker = None;
            account.unauthorized.clear();
            account.unauthorized_until = 0;
        });
        self.admission.clear_cooldown(id).await
    }

    async fn list_blocks(&self, ids: &[AccountId]) -> Result<Vec<BlockInfo>, BackendError> {
        Ok(self.with_state(|state, now| {
            let mut blocks = Vec::new();
            for id in ids {
                let Some(account) = state.accounts.get(id) else {
                    continue;
                };
                for (kind, slot) in [("hard", &account.hard), ("soft", &account.soft)] {
                    if let Some(entry) = live(slot, now)
                        && let Some(left) = entry.left(now)
                    {
                        let (class, status, reason) = parse_block_value(&entry.value);
                        blocks.push(BlockInfo {
                            account_id: *id,
                            kind,
                            class,
                            status,
                            reason,
                            remaining_ms: left,
                        });
                    }
                }
                if let Some(breaker) = account.breaker(now).filter(|b| b.open_until > 0) {
                    blocks.push(BlockInfo {
                        account_id: *id,
                        kind: "breaker",
                        class: "broken".into(),
                        status: 0,
                        reason: breaker_reason(breaker.failures),
                        remaining_ms: (breaker.open_until - now).max(0) as u64,
                    });
                }
            }
            blocks
        }))
    }

    async fn sticky_get(
        &self,
        group: &str,
        session: &str,
    ) -> Result<Option<AccountId>, BackendError> {
        Ok(self.with_state(|state, now| {
            state
                .sticky
                .get(&(group.to_owned(), session.to_owned()), now)
        }))
    }

    async fn sticky_set(
        &self,
        group: &str,
        session: &str,
        id: AccountId,
        ttl_ms: u64,
    ) -> Result<Option<AccountId>, BackendError> {
        Ok(self.with_state(|state, now| {
            state
                .sticky
                .set((group.to_owned(), session.to_owned()), id, now, ttl_ms)
        }))
    }

    async fn sticky_touch(
        &self,
        group: &str,
        session: &str,
        ttl_ms: u64,
    ) -> Result<(), BackendError> {
        self.with_state(|state, now| {
            state
                .sticky
                .touch(&(group.to_owned(), session.to_owned()), now, ttl_ms)
        });
        Ok(())
    }

    async fn sticky_drop(&self, group: &str, session: &str) -> Result<bool, BackendError> {
        Ok(self.with_state(|state, now| {
            state
                .sticky
                .remove(&(group.to_owned(), session.to_owned()), now)
        }))
    }

    async fn response_get(&self, response_id: &str) -> Result<Option<AccountId>, BackendError> {
        Ok(self.with_state(|state, now| state.responses.get(&response_id.to_owned(), now)))
    }

    async fn response_set(
        &self,
        response_id: &str,
        id: AccountId,
        ttl_ms: u64,
    ) -> Result<(), BackendError> {
        self.with_state(|state, now| state.responses.set(response_id.to_owned(), id, now, ttl_ms));
        Ok(())
    }

    async fn lock_confirm(
        &self,
        id: AccountId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, BackendError> {
        Ok(self.with_account(id, |account, now| {
            lock(&mut account.confirm_lock, now, owner, ttl_ms)
        }))
    }

    async fn unlock_confirm(&self, id: AccountId, owner: &str) -> Result<(), BackendError> {
        self.with_account(id, |account, now| {
            delete_if(&mut account.confirm_lock, now, owner)
        });
        Ok(())
    }

    async fn linger_confirm(
        &self,
        id: AccountId,
        owner: &str,
        ms: u64,
    ) -> Result<(), BackendError> {
        self.with_account(id, |account, now| {
            if let Some(lock) = account
                .confirm_lock
                .as_mut()
                .filter(|lock| lock.until > now && lock.value == owner)
            {
                *lock = Expiring::new(owner.to_owned(), now, ms);
            }
        });
        Ok(())
    }

    async fn confirm_state(&self, id: AccountId) -> Result<Option<String>, BackendError> {
        Ok(self.with_account(id, |account, now| {
            live(&account.confirm_lock, now).map(|lock| lock.value.clone())
        }))
    }

    async fn swap_confirm(
        &self,
        id: AccountId,
        from: &str,
        to: &str,
        ttl_ms: u64,
    ) -> Result<bool, BackendError> {
        Ok(self.with_account(id, |account, now| {
            if live(&account.confirm_lock, now).is_some_and(|lock| lock.value == from) {
                account.confirm_lock = Some(Expiring::new(to.to_owned(), now, ttl_ms));
                true
            } else {
                false
            }
        }))
    }

    async fn block_confirming(
        &self,
        id: AccountId,
        ttl_ms: u64,
        class: &str,
        status: u16,
        owner: &str,
    ) -> Result<String, BackendError> {
        let value = block_value(class, status, &format!("confirming {owner}"));
        self.hard(id, ttl_ms, value.clone()).await?;
        Ok(value)
    }

    async fn unblock_confirming(&self, id: AccountId, value: &str) -> Result<(), BackendError> {
        let _order = self.cooldown_writes.lock().await;
        let lifted = self.with_account(id, |account, now| delete_if(&mut account.hard, now, value));
        if lifted {
            self.admission.clear_cooldown(id).await?;
        }
        Ok(())
    }

    async fn lock_refresh(
        &self,
        id: AccountId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, BackendError> {
        Ok(self.with_account(id, |account, now| {
            lock(&mut account.refresh_lock, now, owner, ttl_ms)
        }))
    }

    async fn unlock_refresh(&self, id: AccountId, owner: &str) -> Result<(), BackendError> {
        self.with_account(id, |account, now| {
            delete_if(&mut account.refresh_lock, now, owner)
        });
        Ok(())
    }
}
