//! `Locks` in Redis: the confirmation lock and the token-refresh lock, each one key taken with
//! `SET NX PX` and changed only by the owner it names.

use async_trait::async_trait;
use poolgate_runtime::redis_keys;

use super::RedisHealth;
use crate::health::{Locks, StateError};
use poolgate_core::AccountId;

#[async_trait]
impl Locks for RedisHealth {
    /// Takes the cluster-wide confirmation lock of an account (see `confirmations.rs`).
    async fn lock_confirm(
        &self,
        id: AccountId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, StateError> {
        self.lock(redis_keys::confirm_lock(id), owner, ttl_ms).await
    }

    async fn unlock_confirm(&self, id: AccountId, owner: &str) -> Result<(), StateError> {
        self.delete_if(redis_keys::confirm_lock(id), owner).await
    }

    async fn linger_confirm(&self, id: AccountId, owner: &str, ms: u64) -> Result<(), StateError> {
        let mut conn = self.redis.conn().await?;
        let _: (i64, i64) = self
            .redis
            .bounded(
                self.scripts
                    .linger
                    .key(redis_keys::confirm_lock(id))
                    .arg(owner)
                    .arg(ms.max(1))
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(())
    }

    async fn confirm_state(&self, id: AccountId) -> Result<Option<String>, StateError> {
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::cmd("GET")
                    .arg(redis_keys::confirm_lock(id))
                    .query_async(&mut conn),
            )
            .await
    }

    async fn swap_confirm(
        &self,
        id: AccountId,
        from: &str,
        to: &str,
        ttl_ms: u64,
    ) -> Result<bool, StateError> {
        let mut conn = self.redis.conn().await?;
        let (swapped, _now): (i64, i64) = self
            .redis
            .bounded(
                self.scripts
                    .swap
                    .key(redis_keys::confirm_lock(id))
                    .arg(from)
                    .arg(to)
                    .arg(ttl_ms.max(1))
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(swapped == 1)
    }

    /// Takes the cluster-wide token-refresh lock for an account.
    async fn lock_refresh(
        &self,
        id: AccountId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, StateError> {
        self.lock(redis_keys::token_refresh_lock(id), owner, ttl_ms)
            .await
    }

    async fn unlock_refresh(&self, id: AccountId, owner: &str) -> Result<(), StateError> {
        self.delete_if(redis_keys::token_refresh_lock(id), owner)
            .await
    }

    async fn lock_usage_read(
        &self,
        id: AccountId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, StateError> {
        self.lock(redis_keys::usage_read_lock(id), owner, ttl_ms)
            .await
    }
}
