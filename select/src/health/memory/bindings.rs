//! `Bindings` in memory: sticky sessions and response ids, each a map of deadlines pruned as
//! it grows.

use std::collections::HashMap;

use async_trait::async_trait;

use super::{Expiring, InProcessHealth};
use crate::health::{Bindings, StateError};
use poolgate_core::AccountId;

/// Bindings are pruned of expired entries when their map grows past this (and then past twice
/// what was left), so pruning stays amortized however many live bindings there are.
const PRUNE_FLOOR: usize = 10_000;

/// Bindings with amortized pruning of expired entries.
#[derive(Debug)]
pub(super) struct BindingMap<K> {
    entries: HashMap<K, Expiring<AccountId>>,
    prune_at: usize,
}

impl<K: std::hash::Hash + Eq> BindingMap<K> {
    pub(super) fn new() -> Self {
        BindingMap {
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

#[async_trait]
impl Bindings for InProcessHealth {
    /// The process's bindings live as long as it does.
    async fn kept_since_ms(&self, _now_ms: i64) -> Result<i64, StateError> {
        Ok(self.started_ms)
    }

    async fn sticky_get(
        &self,
        group: &str,
        session: &str,
    ) -> Result<Option<AccountId>, StateError> {
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
    ) -> Result<Option<AccountId>, StateError> {
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
    ) -> Result<(), StateError> {
        self.with_state(|state, now| {
            state
                .sticky
                .touch(&(group.to_owned(), session.to_owned()), now, ttl_ms)
        });
        Ok(())
    }

    async fn sticky_drop(&self, group: &str, session: &str) -> Result<bool, StateError> {
        Ok(self.with_state(|state, now| {
            state
                .sticky
                .remove(&(group.to_owned(), session.to_owned()), now)
        }))
    }

    async fn response_get(&self, response_id: &str) -> Result<Option<AccountId>, StateError> {
        Ok(self.with_state(|state, now| state.responses.get(&response_id.to_owned(), now)))
    }

    async fn response_set(
        &self,
        response_id: &str,
        id: AccountId,
        ttl_ms: u64,
    ) -> Result<(), StateError> {
        self.with_state(|state, now| state.responses.set(response_id.to_owned(), id, now, ttl_ms));
        Ok(())
    }
}
