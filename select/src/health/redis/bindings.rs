//! `Bindings` in Redis: sticky sessions and response ids, one key each with a TTL.

use async_trait::async_trait;
use poolgate_runtime::redis_keys;

use super::RedisHealth;
use crate::health::{Bindings, StateError};
use poolgate_core::AccountId;

#[async_trait]
impl Bindings for RedisHealth {
    async fn sticky_get(
        &self,
        group: &str,
        session: &str,
    ) -> Result<Option<AccountId>, StateError> {
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::cmd("GET")
                    .arg(redis_keys::sticky_binding(group, session))
                    .query_async(&mut conn),
            )
            .await
    }

    async fn sticky_set(
        &self,
        group: &str,
        session: &str,
        id: AccountId,
        ttl_ms: u64,
    ) -> Result<Option<AccountId>, StateError> {
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::cmd("SET")
                    .arg(redis_keys::sticky_binding(group, session))
                    .arg(id)
                    .arg("PX")
                    .arg(ttl_ms.max(1))
                    .arg("GET")
                    .query_async(&mut conn),
            )
            .await
    }

    async fn sticky_touch(
        &self,
        group: &str,
        session: &str,
        ttl_ms: u64,
    ) -> Result<(), StateError> {
        let mut conn = self.redis.conn().await?;
        let _: i64 = self
            .redis
            .bounded(
                redis::cmd("PEXPIRE")
                    .arg(redis_keys::sticky_binding(group, session))
                    .arg(ttl_ms.max(1))
                    .query_async(&mut conn),
            )
            .await?;
        Ok(())
    }

    async fn sticky_drop(&self, group: &str, session: &str) -> Result<bool, StateError> {
        let mut conn = self.redis.conn().await?;
        let removed: i64 = self
            .redis
            .bounded(
                redis::cmd("DEL")
                    .arg(redis_keys::sticky_binding(group, session))
                    .query_async(&mut conn),
            )
            .await?;
        Ok(removed > 0)
    }

    async fn response_get(&self, response_id: &str) -> Result<Option<AccountId>, StateError> {
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::cmd("GET")
                    .arg(redis_keys::response_binding(response_id))
                    .query_async(&mut conn),
            )
            .await
    }

    async fn kept_since_ms(&self, now_ms: i64) -> Result<i64, StateError> {
        let key = redis_keys::bindings_since();
        let mut conn = self.redis.conn().await?;
        // Set once, when the key is missing: at the first start, and after a wipe.
        let _: Option<String> = self
            .redis
            .bounded(
                redis::cmd("SET")
                    .arg(&key)
                    .arg(now_ms)
                    .arg("NX")
                    .query_async(&mut conn),
            )
            .await?;
        let since: Option<i64> = self
            .redis
            .bounded(redis::cmd("GET").arg(&key).query_async(&mut conn))
            .await?;
        Ok(since.unwrap_or(now_ms))
    }

    async fn response_set(
        &self,
        response_id: &str,
        id: AccountId,
        ttl_ms: u64,
    ) -> Result<(), StateError> {
        let mut conn = self.redis.conn().await?;
        let _: () = self
            .redis
            .bounded(
                redis::cmd("SET")
                    .arg(redis_keys::response_binding(response_id))
                    .arg(id)
                    .arg("PX")
                    .arg(ttl_ms.max(1))
                    .query_async(&mut conn),
            )
            .await?;
        Ok(())
    }
}
