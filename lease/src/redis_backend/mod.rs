//! The Redis backend: every decision is one Lua script on the account's hash slot, timed by
//! Redis `TIME` (never a replica clock), so any number of admission replicas share one count.
//! This file holds `RedisBackend` and its `LeaseBackend` impl; the scripts are in `scripts.rs`,
//! reading their replies in `reply.rs`, the cleanup after a timed-out script in `uncertain.rs`,
//! and the failure policy's own operations in `registry.rs` and `restore.rs`.
//!
//! Only this module and `poolgate_runtime::redis_keys` know Redis key names.

mod key_slot;
mod recount;
mod registry;
mod reply;
mod restore;
mod scripts;
mod uncertain;
pub mod wake;

use std::sync::Arc;

use async_trait::async_trait;
use poolgate_core::AccountId;
use poolgate_core::lease::{
    Denial, DenyReason, LeaseId, LeaseTerms, LostReason, Renewal, Resumption,
};
use poolgate_core::status::AdmissionReport;
use poolgate_runtime::clock::RedisClock;
use poolgate_runtime::error::StateError;
use poolgate_runtime::redis::RedisHandle;
use poolgate_runtime::redis_keys::{self, AccountKeys, ClientKeyKeys};

use crate::backend::{AcquireLimits, KeyCharge, KeyGate, LeaseBackend};
pub use registry::{OwnReport, REPORTS_KEPT_MS};
use scripts::Scripts;

/// LeaseEngine state in Redis.
#[derive(Clone)]
pub struct RedisBackend {
    redis: RedisHandle,
    scripts: Arc<Scripts>,
    /// Learned from every script's `now`, so reads outside scripts (Inflight) use Redis time
    /// too.
    clock: RedisClock,
    /// Names this backend's releases in the wake messages they publish, so its own
    /// subscription skips them (its waiters were woken in process already).
    wake_tag: String,
    /// The accounts' `kept` markers this replica saw, and the losses it noticed (`recount.rs`).
    recount: Arc<recount::Recount>,
}

/// How long an account recounts after Redis lost its state, unless set
/// ([`RedisBackend::with_recount`]).
pub const DEFAULT_RECOUNT: std::time::Duration = std::time::Duration::from_secs(3);

impl RedisBackend {
    pub fn new(redis: RedisHandle) -> Self {
        RedisBackend {
            redis,
            scripts: Arc::new(Scripts::new()),
            clock: RedisClock::default(),
            wake_tag: wake::new_tag(),
            recount: Arc::new(recount::Recount::new(DEFAULT_RECOUNT)),
        }
    }

    /// How long an account recounts after Redis lost its state: longer than every replica takes
    /// to notice the loss and put its holders' leases back (the server passes three registry
    /// intervals, at least two seconds: longer than the selector takes to notice the wipe and
    /// rebuild the budget counters).
    pub fn with_recount(mut self, window: std::time::Duration) -> Self {
        self.recount = Arc::new(recount::Recount::new(window));
        self
    }

    /// The tag this backend's wake messages carry (`wake::listen` skips them).
    pub fn wake_tag(&self) -> &str {
        &self.wake_tag
    }

    pub fn handle(&self) -> &RedisHandle {
        &self.redis
    }

    fn learn_clock(&self, redis_now: i64) {
        self.clock.learn(redis_now);
    }

    async fn redis_now(&self) -> Result<i64, StateError> {
        self.clock.now(&self.redis).await
    }

    /// Runs a script. Every script's reply ends with Redis' `now`, which callers pass to
    /// [`Self::learn_clock`].
    async fn script<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StateError> {
        let mut conn = self.redis.conn().await?;
        self.redis.bounded(invocation.invoke_async(&mut conn)).await
    }
}

impl RedisBackend {
    /// The renew script on the lease's account (and on one node its key's) slot: its state
    /// (`scripts/renew.lua`). A loss it finds (state 6) is noticed.
    async fn renew_state(
        &self,
        lease_id: &LeaseId,
        ttl_ms: u64,
        mode: &str,
        limit: i32,
        key_limit: i32,
    ) -> Result<i64, StateError> {
        let account_id = lease_id.account_id();
        let keys = AccountKeys::new(account_id);
        let key_keys = lease_id.api_key_id().map(ClientKeyKeys::slot_only);
        let mut invocation = self.scripts.renew.key(&keys.leases);
        invocation.key(&keys.released).key(&keys.kept);
        if !self.redis.is_cluster()
            && let Some(key_keys) = &key_keys
        {
            invocation.key(&key_keys.leases).key(&key_keys.released);
        }
        // The holder of a lease saw its account's marker: this replica granted or renewed it.
        let recount = u64::try_from(self.recount.window.as_millis()).unwrap_or(u64::MAX);
        invocation
            .arg(lease_id.as_str())
            .arg(ttl_ms)
            .arg(mode)
            .arg(limit)
            .arg(key_limit)
            .arg(1)
            .arg(recount);
        let (state, now): (i64, i64) = self.script(&invocation).await?;
        self.learn_clock(now);
        self.recount.saw(account_id);
        if state == 6 {
            tracing::warn!(
                account_id,
                recount_ms = recount,
                "Redis lost this account's state: its leases are put back before new acquires"
            );
            self.recount.notice();
        }
        Ok(state)
    }
}

impl RedisBackend {
    /// Live members (`ZCOUNT now +inf`) of lease ZSETs, in the order given.
    async fn live_counts(&self, leases: &[String]) -> Result<Vec<u32>, StateError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let now = self.redis_now().await?;
        let count_cmd = |key: &str| {
            let mut cmd = redis::cmd("ZCOUNT");
            cmd.arg(key).arg(now).arg("+inf");
            cmd
        };
        if self.redis.is_cluster() {
            // A cluster pipeline must stay on one slot; the reads go out concurrently instead,
            // multiplexed over the cluster connection.
            let reads = leases.iter().map(|key| async move {
                let mut conn = self.redis.conn().await?;
                self.redis
                    .bounded(count_cmd(key).query_async::<u32>(&mut conn))
                    .await
            });
            return futures_util::future::try_join_all(reads).await;
        }
        let mut pipeline = redis::pipe();
        for key in leases {
            pipeline.add_command(count_cmd(key));
        }
        let mut conn = self.redis.conn().await?;
        self.redis.bounded(pipeline.query_async(&mut conn)).await
    }

    /// One account's usage reads: its RPM events since `since`, its session window's spend. The
    /// window hash expires with the window (`record_spend.lua`), so a present one is current.
    fn add_usage_reads(pipeline: &mut redis::Pipeline, id: AccountId, since: i64) {
        let keys = AccountKeys::new(id);
        pipeline
            .cmd("ZCOUNT")
            .arg(&keys.rpm)
            .arg(since)
            .arg("+inf")
            .cmd("HGET")
            .arg(&keys.window)
            .arg("spend");
    }

    /// [`LeaseBackend::usage`]: one pipeline on one node; on a Cluster, one per account (each
    /// account's keys share a slot), sent concurrently.
    async fn read_usage(
        &self,
        account_ids: &[AccountId],
        rpm_window_ms: u64,
    ) -> Result<Vec<(u32, i64)>, StateError> {
        if account_ids.is_empty() {
            return Ok(Vec::new());
        }
        let since = self
            .redis_now()
            .await?
            .saturating_sub(i64::try_from(rpm_window_ms).unwrap_or(i64::MAX));
        let read = |(rpm, spend): (u32, Option<i64>)| (rpm, spend.unwrap_or(0).max(0));
        if self.redis.is_cluster() {
            let reads = account_ids.iter().map(|&id| async move {
                let mut pipeline = redis::pipe();
                Self::add_usage_reads(&mut pipeline, id, since);
                let mut conn = self.redis.conn().await?;
                let one: (u32, Option<i64>) =
                    self.redis.bounded(pipeline.query_async(&mut conn)).await?;
                Ok::<_, StateError>(read(one))
            });
            return futures_util::future::try_join_all(reads).await;
        }
        let mut pipeline = redis::pipe();
        for &id in account_ids {
            Self::add_usage_reads(&mut pipeline, id, since);
        }
        let mut conn = self.redis.conn().await?;
        let flat: Vec<redis::Value> = self.redis.bounded(pipeline.query_async(&mut conn)).await?;
        if flat.len() != 2 * account_ids.len() {
            return Err(StateError::Failed(
                "usage reply has the wrong length".into(),
            ));
        }
        flat.chunks(2)
            .map(|pair| {
                redis::from_redis_value::<(u32, Option<i64>)>(redis::Value::Array(pair.to_vec()))
                    .map(read)
                    .map_err(|e| StateError::Failed(format!("usage reply: {e}")))
            })
            .collect()
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
    ) -> Result<Option<Denial>, StateError> {
        let key = redis_keys::user_rpm(user_id);
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
            Ok(Err(error)) => Err(StateError::from(error)),
            Err(_) => {
                // The charge may have landed: take it back on the same connection (after it).
                uncertain::refund_uncertain_charge(key, event_id, conn);
                Err(StateError::Timeout)
            }
        }
    }

    async fn refund_user(&self, user_id: &str, event_id: &str) -> Result<(), StateError> {
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::cmd("ZREM")
                    .arg(redis_keys::user_rpm(user_id))
                    .arg(event_id)
                    .query_async::<i64>(&mut conn),
            )
            .await?;
        Ok(())
    }

    async fn acquire_keyed(
        &self,
        terms: &LeaseTerms,
        lease_id: &LeaseId,
        limits: AcquireLimits,
        key: Option<&KeyGate>,
    ) -> Result<Option<Denial>, StateError> {
        let keys = AccountKeys::new(terms.account_id);
        let cluster = self.redis.is_cluster();
        // On a Cluster the engine charges the user separately (see `joins_user_gate`).
        let user = terms
            .user
            .as_ref()
            .filter(|user| user.rpm_limit > 0 && !cluster);
        let user_rpm = user.map(|user| redis_keys::user_rpm(&user.user_id));
        // The key's slot: joined to this script on one node; on a Cluster (another hash slot)
        // charged first by its own script and refunded below when the account refuses.
        let key_slot = lease_id.api_key_id().zip(key).map(|(_, gate)| gate);
        let key_keys = key_slot.map(key_slot::for_gate);
        if cluster
            && let (Some(gate), Some(key_keys)) = (key_slot, &key_keys)
            && let Some(denial) = self.charge_key(gate, key_keys, lease_id, limits).await?
        {
            return Ok(Some(denial));
        }
        let joined = !cluster && key_keys.is_some();
        let mut invocation = self.scripts.acquire.key(&keys.leases);
        invocation
            .key(&keys.rpm)
            .key(&keys.cooldown)
            .key(&keys.window)
            .key(user_rpm.as_deref().unwrap_or(&keys.rpm))
            .key(&keys.kept);
        if joined && let Some(key_keys) = &key_keys {
            key_slot::push(key_keys, &mut invocation);
        }
        invocation
            .arg(lease_id.as_str())
            .arg(limits.ttl_ms)
            .arg(terms.concurrency_limit)
            .arg(terms.rpm_limit)
            .arg(limits.window_limit_micros)
            .arg(limits.rpm_window_ms)
            .arg(limits.session_window_ms)
            .arg(u8::from(terms.ignore_cooldown))
            .arg(user.map_or(0, |user| user.rpm_limit))
            .arg(u8::from(joined))
            .arg(self.recount.for_account(terms.account_id));
        if joined && let Some(gate) = key_slot {
            key_slot::gate_args(&mut invocation, gate);
        }
        let mut conn = self.redis.conn().await?;
        let reply = tokio::time::timeout(
            self.redis.timeout(),
            invocation.invoke_async::<(String, u64, i64)>(&mut conn),
        )
        .await;
        let answer = match reply {
            Ok(Ok((reason, retry, now))) => {
                self.learn_clock(now);
                self.recount.saw(terms.account_id);
                if reason == "wiped" {
                    tracing::warn!(
                        account_id = terms.account_id,
                        recount_ms = retry,
                        "Redis lost this account's state: new acquires wait while the holders put their leases back"
                    );
                    self.recount.notice();
                }
                reply::acquire_denial(&reason, retry)
            }
            Ok(Err(error)) => Err(StateError::from(error)),
            Err(_) => {
                let key_leases = joined
                    .then(|| key_keys.as_ref().map(|keys| keys.leases.clone()))
                    .flatten();
                uncertain::remove_uncertain_lease(lease_id, user_rpm, key_leases, conn);
                Err(StateError::Timeout)
            }
        };
        if cluster
            && !matches!(answer, Ok(None))
            && let Some(key_keys) = &key_keys
        {
            // No lease came of the key's charge: give the slot back (after a timeout the
            // account's lease may exist and is cleaned up by itself; the key's slot is freed
            // here, so at worst the key is under-counted, never over).
            self.refund_key(key_keys, lease_id).await;
        }
        answer
    }

    async fn renew(
        &self,
        lease_id: &LeaseId,
        ttl_ms: u64,
        restore_within: Option<i32>,
        key_limit: i32,
    ) -> Result<Renewal, StateError> {
        let key_keys = lease_id.api_key_id().map(ClientKeyKeys::slot_only);
        let cluster = self.redis.is_cluster();
        let mode = if restore_within.is_some() { "1" } else { "0" };
        let state = self
            .renew_state(
                lease_id,
                ttl_ms,
                mode,
                restore_within.unwrap_or(0),
                key_limit,
            )
            .await?;
        let renewal = reply::renewal(state)?;
        if cluster
            && let Some(key_keys) = &key_keys
            && matches!(renewal, Renewal::Renewed | Renewal::Restored)
        {
            // The key's slot follows on its own node (the same script, the key's keys standing
            // in for an account's). The key's release fence applies there too (the account's
            // node may have lost its own), and a restore needs the key's room as well as the
            // account's: either refusal takes the account's part back. A lease still live on
            // the account whose key node alone lost it, without room there, keeps running
            // uncounted on the key (at most one lease over, until it ends).
            match self
                .renew_key_slot(key_keys, lease_id, ttl_ms, key_limit)
                .await?
            {
                Renewal::Lost(LostReason::Released) => {
                    self.drop_account_part(lease_id).await?;
                    return Ok(Renewal::Lost(LostReason::Released));
                }
                Renewal::Lost(LostReason::NoRoom) if renewal == Renewal::Restored => {
                    self.drop_account_part(lease_id).await?;
                    return Ok(Renewal::Lost(LostReason::NoRoom));
                }
                Renewal::Lost(LostReason::NoRoom) => {
                    tracing::warn!(lease_id = %lease_id, "the key's node lost this lease and the key has no room; it runs uncounted there");
                }
                _ => {}
            }
        }
        Ok(renewal)
    }

    async fn resume(
        &self,
        lease_id: &LeaseId,
        ttl_ms: u64,
        key_limit: i32,
    ) -> Result<Resumption, StateError> {
        let keys = AccountKeys::new(lease_id.account_id());
        let key_keys = lease_id.api_key_id().map(ClientKeyKeys::slot_only);
        let cluster = self.redis.is_cluster();
        let mut invocation = self.scripts.resume.key(&keys.leases);
        invocation.key(&keys.holders).key(&keys.released);
        if !cluster && let Some(key_keys) = &key_keys {
            invocation.key(&key_keys.leases).key(&key_keys.released);
        }
        invocation.arg(lease_id.as_str()).arg(ttl_ms);
        let (epoch, now): (i64, i64) = self.script(&invocation).await?;
        self.learn_clock(now);
        let resumption = reply::resumption(epoch)?;
        if cluster
            && let Some(key_keys) = &key_keys
            && matches!(resumption, Resumption::Resumed { .. })
        {
            match self
                .renew_key_slot(key_keys, lease_id, ttl_ms, key_limit)
                .await?
            {
                // Released on the key's node (its fence is up): released for the holder too.
                Renewal::Lost(LostReason::Released) => {
                    self.drop_account_part(lease_id).await?;
                    return Ok(Resumption::Released);
                }
                Renewal::Lost(LostReason::NoRoom) => {
                    tracing::warn!(lease_id = %lease_id, "the key's node lost this lease and the key has no room; it runs uncounted there");
                }
                _ => {}
            }
        }
        Ok(resumption)
    }

    async fn attempt(
        &self,
        lease_id: &LeaseId,
        rpm_limit: i32,
        event_id: &str,
        window_ms: u64,
    ) -> Result<Option<Denial>, StateError> {
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

    async fn release_charged(
        &self,
        lease_id: &LeaseId,
        spend_micros: i64,
        session_window_ms: u64,
        fence_ms: u64,
        key: Option<&KeyCharge>,
    ) -> Result<bool, StateError> {
        let keys = AccountKeys::new(lease_id.account_id());
        let key_keys = lease_id
            .api_key_id()
            .map(|api_key_id| key_slot::for_charge(api_key_id, key));
        let cluster = self.redis.is_cluster();
        if cluster && let Some(key_keys) = &key_keys {
            // The key's slot first, on its own node: its charge is once per lease, so the retry
            // of a release whose account part failed charges nothing twice.
            let mut invocation = self.scripts.key_release.prepare_invoke();
            key_slot::push(key_keys, &mut invocation);
            invocation
                .arg(lease_id.as_str())
                .arg("release")
                .arg(fence_ms.max(1));
            key_slot::charge_args(&mut invocation, key);
            let (_, now): (i64, i64) = self.script(&invocation).await?;
            self.learn_clock(now);
        }
        let mut invocation = self.scripts.release.key(&keys.leases);
        invocation
            .key(&keys.window)
            .key(&keys.holders)
            .key(&keys.released)
            .key(&keys.waiters);
        if !cluster && let Some(key_keys) = &key_keys {
            key_slot::push(key_keys, &mut invocation);
        }
        invocation
            .arg(lease_id.as_str())
            .arg(spend_micros.max(0))
            .arg(session_window_ms)
            .arg(fence_ms.max(1))
            .arg(&self.wake_tag);
        if !cluster && key_keys.is_some() {
            key_slot::charge_args(&mut invocation, key);
        }
        // Last, wherever the key's arguments end.
        invocation.arg(redis_keys::LEASE_WAKE_CHANNEL);
        let (removed, now): (i64, i64) = self.script(&invocation).await?;
        self.learn_clock(now);
        Ok(removed == 1)
    }

    async fn seed_budget(
        &self,
        api_key_id: i64,
        period_id: &str,
        micros: i64,
        expires_in_ms: u64,
    ) -> Result<bool, StateError> {
        let key = redis_keys::client_key_spend(api_key_id, period_id);
        let (set, now): (i64, i64) = self
            .script(
                self.scripts
                    .seed_budget
                    .key(&key)
                    .arg(micros)
                    .arg(expires_in_ms),
            )
            .await?;
        self.learn_clock(now);
        Ok(set == 1)
    }

    async fn wall_now_ms(&self) -> Result<i64, StateError> {
        self.redis_now().await
    }

    async fn orphan(
        &self,
        lease_id: &LeaseId,
        grace_ms: u64,
        holder_epoch: u64,
        fence_ms: u64,
    ) -> Result<(), StateError> {
        let keys = AccountKeys::new(lease_id.account_id());
        let key_keys = lease_id.api_key_id().map(ClientKeyKeys::slot_only);
        let cluster = self.redis.is_cluster();
        let mut invocation = self.scripts.orphan.key(&keys.leases);
        invocation.key(&keys.holders).key(&keys.released);
        if !cluster && let Some(key_keys) = &key_keys {
            invocation.key(&key_keys.leases).key(&key_keys.released);
        }
        invocation
            .arg(lease_id.as_str())
            .arg(grace_ms)
            .arg(holder_epoch)
            .arg(fence_ms.max(1));
        let (cut, now): (i64, i64) = self.script(&invocation).await?;
        self.learn_clock(now);
        if cluster
            && cut == 1
            && let Some(key_keys) = &key_keys
        {
            // Only the holder's cut follows on the key's node (the holder epoch lives with the
            // account), so a stale stream's end cuts neither.
            let (_, now): (i64, i64) = self
                .script(
                    self.scripts
                        .key_orphan
                        .key(&key_keys.leases)
                        .key(&key_keys.released)
                        .arg(lease_id.as_str())
                        .arg(grace_ms)
                        .arg(fence_ms.max(1)),
                )
                .await?;
            self.learn_clock(now);
        }
        Ok(())
    }

    async fn inflight(&self, account_ids: &[AccountId]) -> Result<Vec<u32>, StateError> {
        let leases: Vec<String> = account_ids
            .iter()
            .map(|&id| AccountKeys::new(id).leases)
            .collect();
        self.live_counts(&leases).await
    }

    async fn usage(
        &self,
        account_ids: &[AccountId],
        rpm_window_ms: u64,
        _session_window_ms: u64,
    ) -> Result<Vec<(u32, i64)>, StateError> {
        self.read_usage(account_ids, rpm_window_ms).await
    }

    async fn admission_status(&self) -> AdmissionReport {
        match self.registry_reports().await {
            Ok(report) => report,
            Err(error) => {
                tracing::debug!(%error, "the replica registry could not be read");
                AdmissionReport::unknown()
            }
        }
    }

    async fn key_inflight(&self, api_key_ids: &[i64]) -> Result<Vec<u32>, StateError> {
        let leases: Vec<String> = api_key_ids
            .iter()
            .map(|&id| ClientKeyKeys::slot_only(id).leases)
            .collect();
        self.live_counts(&leases).await
    }

    async fn record_spend(
        &self,
        account_id: AccountId,
        spend_micros: i64,
        session_window_ms: u64,
    ) -> Result<i64, StateError> {
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

    async fn set_cooldown(&self, account_id: AccountId, ttl_ms: u64) -> Result<(), StateError> {
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

    async fn clear_cooldown(&self, account_id: AccountId) -> Result<(), StateError> {
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
    ) -> Result<Option<u32>, StateError> {
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
    ) -> Result<(), StateError> {
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
