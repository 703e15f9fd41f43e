//! Account health in this process's memory, for the relay's standalone mode: the semantics of
//! the Redis store (`redis/`) in one map behind a `Mutex`.
//!
//! The coupling with admission is kept too: a hard block is also the in-process admission
//! engine's cooldown (so admission refuses the account in the same step that takes a slot, and
//! the probe's `ignore_cooldown` lease still goes through), and the live lease count is
//! admission's. Admission keeps only a deadline, so the block's class and reason live here.
//!
//! Time is the [`Clock`]'s monotonic time counted from its wall time at construction; the
//! standalone relay gives admission's memory backend the same clock, so both agree on when a
//! block ends, and tests advance a manual clock instead of sleeping.
//!
//! This file holds the store, its per-account state and the clock; `blocks.rs` implements
//! `Health`, `windows.rs` `Windows`, `bindings.rs` `Bindings`, `locks.rs` `Locks`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use std::time::Instant;

use poolgate_runtime::ports::Cooldowns;

use super::{AccountHealth, Breaker};
use bindings::BindingMap;
use poolgate_core::windows::WindowReading;
use poolgate_core::{AccountId, Clock};

mod bindings;
mod blocks;
mod locks;
mod windows;

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
    usage_lock: Option<Expiring<String>>,
    /// The usage windows' newest readings (`Windows`).
    windows: Option<Expiring<Vec<WindowReading>>>,
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

/// Deletes the entry only if it still holds `value`.
fn delete_if(slot: &mut Option<Expiring<String>>, now: i64, value: &str) -> bool {
    if live(slot, now).is_some_and(|entry| entry.value == value) {
        *slot = None;
        return true;
    }
    false
}

struct State {
    accounts: HashMap<AccountId, AccountState>,
    sticky: BindingMap<(String, String)>,
    responses: BindingMap<String>,
    /// Bumped on every window reading stored, so the state file's writer can tell whether there
    /// is anything new to keep (`windows.rs`).
    windows_version: u64,
}

/// Health in memory, coupled to the in-process admission engine.
pub struct InProcessHealth {
    admission: Arc<dyn Cooldowns>,
    state: Mutex<State>,
    /// Held across a hard-block change and the admission cooldown write that mirrors it, so two
    /// changes cannot reach admission in the other order than they were made here (a clear
    /// overtaken by the block it cleared would leave admission refusing an unblocked account).
    cooldown_writes: tokio::sync::Mutex<()>,
    clock: Clock,
    started: Instant,
    started_ms: i64,
}

impl InProcessHealth {
    /// Health over `admission`, the engine the process's leases are taken from (its memory
    /// backend: hard blocks become its cooldowns, its leases are the load), on `clock`.
    pub fn new(admission: Arc<dyn Cooldowns>, clock: Clock) -> Self {
        InProcessHealth {
            admission,
            state: Mutex::new(State {
                accounts: HashMap::new(),
                sticky: BindingMap::new(),
                responses: BindingMap::new(),
                windows_version: 0,
            }),
            cooldown_writes: tokio::sync::Mutex::new(()),
            started: clock.now(),
            started_ms: clock.wall_ms(),
            clock,
        }
    }

    fn clock(&self) -> i64 {
        let elapsed = i64::try_from(self.clock.since(self.started).as_millis()).unwrap_or(i64::MAX);
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
}
