//! The Redis backend: every decision is one Lua script on the account's hash slot, timed by
//! Redis `TIME` (never a replica clock), so any number of admission replicas share one count.
//! This file holds `RedisBackend` and its `LeaseBackend` impl; the scripts are in `scripts.rs`,
//! reading their replies in `reply.rs`, the cleanup after a timed-out script in `uncertain.rs`,
//! and the failure policy's own operations in `registry.rs` and `restore.rs`.
//!
//! Only this module and `poolgate_runtime::keys` know Redis key names.

mod registry;
mod reply;
mod restore;
mod scripts;
mod uncertain;

use std::sync::Arc;

use async_trait::async_trait;
use poolgate_core::AccountId;
use poolgate_core::lease::{Denial, DenyReason, LeaseId, LeaseTerms, Renewal, Resumption};
use poolgate_runtime::clock::RedisClock;
use poolgate_runtime::error::BackendError;
use poolgate_runtime::keys::{self, AccountKeys};
use poolgate_runtime::redis::RedisHandle;

use crate::backend::{AcquireLimits, LeaseBackend};
use scripts::Scripts;

/// LeaseEngine state in Redis.
#[derive(Clone)]
pub struct RedisBackend {
    redis: RedisHandle,
    scripts: Arc<Scripts>,
    /// Learned from every script's `now`, so reads outside scripts (Inflight) use Redis time
    /// too.
    clock: RedisClock,
}

impl RedisBackend {
    pub fn new(redis: RedisHandle) -> Self {
        RedisBackend {
            redis,
            scripts: Arc::new(Scripts::new()),
            clock: RedisClock::default(),
        }
    }

    pub fn handle(&self) -> &RedisHandle {
        &self.redis
    }

    fn learn_clock(&self, redis_now: i64) {
        self.clock.learn(redis_now);
    }

    async fn redis_now(&self) -> Result<i64, BackendError> {
        self.clock.now(&self.redis).await
    }

    /// Runs a script. Every script's reply ends with Redis' `now`, which callers pass to
    /// [`Self::learn_clock`].
    async fn script<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, BackendError> {
        let mut conn = self.redis.conn().await?;
        self.redis.bounded(invocation.invoke_async(&mut conn)).await
    }
}

#[async_trait]
impl LeaseBackend for RedisBackend {
    fn joins_user_gate(&self) -> bool {
        !self.redis.is_cluster()
    }

    async fn charge_user(
        &self,
        user_id: &str,
        rpm_limit: i32,
        event_id: &str,
        window_ms: u64,
    ) -> Result<Option<Denial>, BackendError> {
        let key = keys::user_rpm(user_id);
        let mut invocation = self.scripts.charge_rpm.key(&key);
        invocation.arg(event_id).arg(rpm_limit).arg(window_ms);
        let mut conn = self.redis.conn().await?;
        let reply = tokio::time::timeout(
            self.redis.timeout(),
            invocation.invoke_async::<(i64, u64, i64)>(&mut conn),
        )
        .await;
        match reply {
            Ok(Ok((charged, retry, now))) => {
                self.learn_clock(now);
                Ok(reply::charge_denial(charged, retry, DenyReason::UserRpm))
            }
            Ok(Err(error)) => Err(BackendError::from(error)),
            Err(_) => {
                // The charge may have landed: take it back on the same connection (after it).
                uncertain::refund_uncertain_charge(key, event_id, conn);
                Err(BackendError::Timeout)
            }
        }
    }

    async fn refund_user(&self, user_id: &str, event_id: &str) -> Result<(), BackendError> {
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::cmd("ZREM")
                    .arg(keys::user_rpm(user_id))
                    .arg(event_id)
                    .query_async::<i64>(&mut conn),
            )
            .await?;
        Ok(())
    }

    async fn acquire(
        &self,
        terms: &LeaseTerms,
        lease_id: &LeaseId,
        limits: AcquireLimits,
    ) -> Result<Option<Denial>, BackendError> {
        let keys = AccountKeys::new(terms.account_id);
        // On a Cluster the engine charges the user separately (see `joins_user_gate`).
        let user = terms
            .user
            .as_ref()
            .filter(|user| user.rpm_limit > 0 && !self.redis.is_cluster());
        let user_rpm = user.map(|user| keys::user_rpm(&user.user_id));
        let mut invocation = self.scripts.acquire.key(&keys.leases);
        invocation
            .key(&keys.rpm)
            .key(&keys.cooldown)
            .key(&keys.window)
            .key(user_rpm.as_deref().unwrap_or(&keys.rpm))
            .arg(lease_id.as_str())
            .arg(limits.ttl_ms)
            .arg(terms.concurrency_limit)
            .arg(terms.rpm_limit)
            .arg(limits.window_limit_micros)
            .arg(limits.rpm_window_ms)
            .arg(limits.session_window_ms)
            .arg(u8::from(terms.ignore_cooldown))
            .arg(user.map_or(0, |user| user.rpm_limit));
        let mut conn = self.redis.conn().await?;
        let reply = tokio::time::timeout(
            self.redis.timeout(),
            invocation.invoke_async::<(String, u64, i64)>(&mut conn),
        )
        .await;
        match reply {
            Ok(Ok((reason, retry, now))) => {
                self.learn_clock(now);
                reply::acquire_denial(&reason, retry)
            }
            Ok(Err(error)) => Err(BackendError::from(error)),
            Err(_) => {
                uncertain::remove_uncertain_lease(lease_id, user_rpm, conn);
                Err(BackendError::Timeout)
            }
        }
    }

    async fn renew(
        &self,
        lease_id: &LeaseId,
        ttl_ms: u64,
        restore_within: Option<i32>,
    ) -> Result<Renewal, BackendError> {
        let keys = AccountKeys::new(lease_id.account_id());
        let (state, now): (i64, i64) = self
            .script(
                self.scripts
                    .renew
                    .key(&keys.leases)
                    .key(&keys.released)
                    .arg(lease_id.as_str())
                    .arg(ttl_ms)
                    .arg(u8::from(restore_within.is_some()))
                    .arg(restore_within.unwrap_or(0)),
            )
            .await?;
        self.learn_clock(now);
        reply::renewal(state)
    }

    async fn resume(&self, lease_id: &LeaseId, ttl_ms: u64) -> Result<Resumption, BackendError> {
        let keys = AccountKeys::new(lease_id.account_id());
        let (epoch, now): (i64, i64) = self
            .script(
                self.scripts
                    .resume
                    .key(&keys.leases)
                    .key(&keys.holders)
                    .key(&keys.released)
                    .arg(lease_id.as_str())
                    .arg(ttl_ms),
            )
            .await?;
        self.learn_clock(now);
        reply::resumption(epoch)
    }

    async fn attempt(
        &self,
        lease_id: &LeaseId,
        rpm_limit: i32,
        event_id: &str,
        window_ms: u64,
    ) -> Result<Option<Denial>, BackendError> {
        if rpm_limit <= 0 {
            return Ok(None);
        }
        let keys = AccountKeys::new(lease_id.account_id());
        let (charged, retry, now): (i64, u64, i64) = self
            .script(
                self.scripts
                    .charge_rpm
                    .key(&keys.rpm)
                    .arg(event_id)
                    .arg(rpm_limit)
                    .arg(window_ms),
            )
            .await?;
        self.learn_clock(now);
        Ok(reply::charge_denial(charged, retry, DenyReason::Rpm))
    }

    async fn release(
        &self,
        lease_id: &LeaseId,
        spend_micros: i64,
        session_window_ms: u64,
        fence_ms: u64,
    ) -> Result<bool, BackendError> {
        let keys = AccountKeys::new(lease_id.account_id());
        let mut invocation = self.scripts.release.key(&keys.leases);
        invocation
            .key(&keys.window)
            .key(&keys.holders)
            .key(&keys.released)
            .arg(lease_id.as_str())
            .arg(spend_micros.max(0))
            .arg(session_window_ms)
            .arg(fence_ms.max(1));
        let (removed, now): (i64, i64) = self.script(&invocation).await?;
        self.learn_clock(now);
        Ok(removed == 1)
    }

    async fn orphan(
        &self,
        lease_id: &LeaseId,
        grace_ms: u64,
        holder_epoch: u64,
        fence_ms: u64,
    ) -> Result<(), BackendError> {
        let keys = AccountKeys::new(lease_id.account_id());
        let (_, now): (i64, i64) = self
            .script(
                self.scripts
                    .orphan
                    .key(&keys.leases)
                    .key(&keys.holders)
                    .key(&keys.released)
                    .arg(lease_id.as_str())
                    .arg(grace_ms)
                    .arg(holder_epoch)
                    .arg(fence_ms.max(1)),
            )
            .await?;
        self.learn_clock(now);
        Ok(())
    }

    async fn inflight(&self, account_ids: &[AccountId]) -> Result<Vec<u32>, BackendError> {
        if account_ids.is_empty() {
            return Ok(Vec::new());
        }
        let now = self.redis_now().await?;
        let count_cmd = |id: AccountId| {
            let mut cmd = redis::cmd("ZCOUNT");
            cmd.arg(AccountKeys::new(id).leases).arg(now).arg("+inf");
            cmd
        };
        if self.redis.is_cluster() {
            // A cluster pipeline must stay on one slot; the reads go out concurrently instead,
            // multiplexed over the cluster connection.
            let reads = account_ids.iter().map(|&id| async move {
                let mut conn = self.redis.conn().await?;
                self.redis
                    .bounded(count_cmd(id).query_async::<u32>(&mut conn))
                    .await
            });
            return futures_util::future::try_join_all(reads).await;
        }
        let mut pipeline = redis::pipe();
        for &id in account_ids {
            pipeline.add_command(count_cmd(id));
        }
        let mut conn = self.redis.conn().await?;
        self.redis.bounded(pipeline.query_async(&mut conn)).await
    }

    async fn record_spend(
        &self,
        account_id: AccountId,
        spend_micros: i64,
        session_window_ms: u64,
    ) -> Result<i64, BackendError> {
        let keys = AccountKeys::new(account_id);
        let (spend, now): (i64, i64) = self
            .script(
                self.scripts
                    .record_spend
                    .key(&keys.window)
                    .arg(spend_micros)
                    .arg(session_window_ms),
            )
            .await?;
        self.learn_clock(now);
        Ok(spend)
    }

    async fn set_cooldown(&self, account_id: AccountId, ttl_ms: u64) -> Result<(), BackendError> {
        let keys = AccountKeys::new(account_id);
        let (_, now): (i64, i64) = self
            .script(
                self.scripts
                    .set_cooldown
                    .key(&keys.cooldown)
                    .arg(ttl_ms.max(1)),
            )
            .await?;
        self.learn_clock(now);
        Ok(())
    }

    async fn clear_cooldown(&self, account_id: AccountId) -> Result<(), BackendError> {
        let mut conn = self.redis.conn().await?;
        let _: i64 = self
            .redis
            .bounded(
                redis::cmd("DEL")
                    .arg(AccountKeys::new(account_id).cooldown)
                    .query_async(&mut conn),
            )
            .await?;
        Ok(())
    }

    async fn register_waiter(
        &self,
        account_id: AccountId,
        waiter_id: &str,
        max_waiting: u32,
        ttl_ms: u64,
    ) -> Result<Option<u32>, BackendError> {
        let keys = AccountKeys::new(account_id);
        let (position, now): (u32, i64) = self
            .script(
                self.scripts
                    .register_waiter
                    .key(&keys.waiters)
                    .arg(waiter_id)
                    .arg(max_waiting)
                    .arg(ttl_ms.max(1)),
            )
            .await?;
        self.learn_clock(now);
        Ok((position > 0).then_some(position))
    }

    async fn remove_waiter(
        &self,
        account_id: AccountId,
        waiter_id: &str,
    ) -> Result<(), BackendError> {
        let keys = AccountKeys::new(account_id);
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::cmd("ZREM")
                    .arg(&keys.waiters)
                    .arg(waiter_id)
                    .query_async::<i64>(&mut conn),
            )
            .await?;
        Ok(())
    }
}
