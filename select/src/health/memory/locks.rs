//! `Locks` in memory: the confirmation lock and the token-refresh lock, per account, each
//! taken only when free and changed only by the owner it names.

use async_trait::async_trait;

use super::{Expiring, InProcessHealth, delete_if, live};
use crate::health::{Locks, StateError};
use poolgate_core::AccountId;

/// `SET NX PX`: whether `owner` took the lock.
fn lock(slot: &mut Option<Expiring<String>>, now: i64, owner: &str, ttl_ms: u64) -> bool {
    if live(slot, now).is_some() {
        return false;
    }
    *slot = Some(Expiring::new(owner.to_owned(), now, ttl_ms));
    true
}

#[async_trait]
impl Locks for InProcessHealth {
    async fn lock_confirm(
        &self,
        id: AccountId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, StateError> {
        Ok(self.with_account(id, |account, now| {
            lock(&mut account.confirm_lock, now, owner, ttl_ms)
        }))
    }

    async fn unlock_confirm(&self, id: AccountId, owner: &str) -> Result<(), StateError> {
        self.with_account(id, |account, now| {
            delete_if(&mut account.confirm_lock, now, owner)
        });
        Ok(())
    }

    async fn linger_confirm(&self, id: AccountId, owner: &str, ms: u64) -> Result<(), StateError> {
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

    async fn confirm_state(&self, id: AccountId) -> Result<Option<String>, StateError> {
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
    ) -> Result<bool, StateError> {
        Ok(self.with_account(id, |account, now| {
            if live(&account.confirm_lock, now).is_some_and(|lock| lock.value == from) {
                account.confirm_lock = Some(Expiring::new(to.to_owned(), now, ttl_ms));
                true
            } else {
                false
            }
        }))
    }

    async fn lock_refresh(
        &self,
        id: AccountId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, StateError> {
        Ok(self.with_account(id, |account, now| {
            lock(&mut account.refresh_lock, now, owner, ttl_ms)
        }))
    }

    async fn unlock_refresh(&self, id: AccountId, owner: &str) -> Result<(), StateError> {
        self.with_account(id, |account, now| {
            delete_if(&mut account.refresh_lock, now, owner)
        });
        Ok(())
    }

    async fn lock_usage_read(
        &self,
        id: AccountId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, StateError> {
        Ok(self.with_account(id, |account, now| {
            lock(&mut account.usage_lock, now, owner, ttl_ms)
        }))
    }
}
