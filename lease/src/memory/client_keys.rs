//! A client key's state in the in-process backend: its leases across accounts, their release
//! fences, the tokens of the rolling minute (TPM) and the budget counters.

use std::collections::{HashMap, VecDeque};

use super::fences::Fences;
use crate::backend::{KeyCharge, KeyGate};
use poolgate_core::lease::{Denial, DenyReason};

/// A client key's slot and counters: its leases (mirroring the account's for keyed leases), their
/// release fences, the tokens of the rolling minute and the budget counters.
#[derive(Default)]
pub(super) struct KeyState {
    /// lease id -> expiry (ms)
    pub(super) leases: HashMap<String, u64>,
    pub(super) released: Fences,
    /// (time ms, tokens), oldest first.
    pub(super) tokens: VecDeque<(u64, u64)>,
    /// period id -> (micro-USD, expiry ms; 0 = never)
    pub(super) spend: HashMap<String, (i64, u64)>,
    /// Leases whose release charged the key already.
    pub(super) billed: Fences,
}

impl KeyState {
    pub(super) fn live_leases(&mut self, now: u64) -> usize {
        self.leases.retain(|_, expiry| *expiry >= now);
        self.leases.len()
    }

    pub(super) fn is_fenced(&mut self, lease_id: &str, now: u64) -> bool {
        self.released.prune(now);
        self.released.contains(lease_id, now)
    }

    pub(super) fn fence(&mut self, lease_id: &str, until: u64) {
        self.released.raise(lease_id, until);
    }

    pub(super) fn spent(&mut self, period_id: &str, now: u64) -> i64 {
        self.spend
            .retain(|_, (_, expiry)| *expiry == 0 || *expiry >= now);
        self.spend.get(period_id).map_or(0, |(micros, _)| *micros)
    }

    /// The key's gates, in the order the Redis script checks them: budgets, TPM, concurrency.
    pub(super) fn check(&mut self, gate: &KeyGate, now: u64) -> Option<Denial> {
        for budget in &gate.budgets {
            if budget.limit_micros > 0 && self.spent(&budget.period_id, now) >= budget.limit_micros
            {
                return Some(Denial::new(DenyReason::KeyBudget, budget.resets_in_ms));
            }
        }
        if gate.tpm_limit > 0
            && let Some(retry) = tpm_full(&mut self.tokens, now, gate.tpm_limit, gate.tpm_window_ms)
        {
            return Some(Denial::new(DenyReason::KeyTpm, retry));
        }
        let held = self.live_leases(now);
        if gate.concurrency_limit > 0 && held >= gate.concurrency_limit as usize {
            return Some(Denial::new(DenyReason::KeyConcurrency, 0));
        }
        None
    }

    /// Charges a finished lease's tokens and spend, once per lease.
    pub(super) fn charge(&mut self, lease_id: &str, charge: &KeyCharge, now: u64, billed_ms: u64) {
        self.billed.prune(now);
        if self.billed.contains(lease_id, now) {
            return;
        }
        self.billed.raise(lease_id, now + billed_ms);
        if charge.tokens > 0 {
            self.tokens.push_back((now, charge.tokens));
        }
        if charge.spend_micros > 0 {
            for (period_id, ttl_ms) in &charge.periods {
                self.spent(period_id, now);
                let expiry = if *ttl_ms == 0 { 0 } else { now + ttl_ms };
                let counter = self.spend.entry(period_id.clone()).or_insert((0, expiry));
                counter.0 += charge.spend_micros;
                if counter.1 != 0 {
                    counter.1 = counter.1.max(expiry);
                }
            }
        }
    }
}

/// The rolling window's tokens: `None` below the limit, else how long until enough of them age
/// out to go below it.
fn tpm_full(
    tokens: &mut VecDeque<(u64, u64)>,
    now: u64,
    limit: i64,
    window_ms: u64,
) -> Option<u64> {
    let since = now.saturating_sub(window_ms);
    while tokens.front().is_some_and(|(at, _)| *at < since) {
        tokens.pop_front();
    }
    let mut sum: i64 = tokens.iter().map(|(_, n)| *n as i64).sum();
    if sum < limit {
        return None;
    }
    for (at, n) in tokens.iter() {
        sum -= *n as i64;
        if sum < limit {
            return Some((at + window_ms).saturating_sub(now).max(1));
        }
    }
    Some(window_ms.max(1))
}
