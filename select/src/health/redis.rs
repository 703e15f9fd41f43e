//! Account health in Redis, shared by every selector replica at once: hard blocks (written to
//! admission's cooldown key, so admission refuses the account in the same script that takes a
//! slot), soft blocks, circuit breakers, sticky and response bindings, confirmation and
//! token-refresh locks; the live lease count is read from admission's lease keys.
//!
//! Key names come from `poolgate_runtime::keys`; time inside decisions is Redis `TIME`.

use std::sync::Arc;

use async_trait::async_trait;
use poolgate_runtime::clock::{RedisClock, TIME_PRELUDE};
use poolgate_runtime::keys::{self, AccountKeys};
use poolgate_runtime::redis::RedisHandle;
use redis::Script;

use super::{
    AccountHealth, BackendError, BlockInfo, Breaker, BreakerChange, HealthStore, block_value,
    breaker_reason, parse_block_value,
};
use poolgate_core::{AccountId, now_ms};

/// One account's pipelined reads: live leases, hard block PTTL, soft block PTTL,
/// (breaker open_until, breaker failures).
type HealthRow = (u32, i64, i64, (Option<i64>, Option<u32>));

/// KEYS: block key. ARGV: ttl ms, value. Keeps the later deadline. Returns {applied ttl, now}.
const BLOCK: &str = r#"
local ttl = tonumber(ARGV[1])
local left = redis.call('PTTL', KEYS[1])
if left >= ttl then return {left, now} end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
return {ttl, now}
"#;

/// KEYS: breaker hash, probe key. ARGV: threshold, first open ms, max open ms.
/// Returns {change, value, now}.
const BREAKER_FAILURE: &str = r#"
local h = redis.call('HMGET', KEYS[1], 'failures', 'open_until', 'open_ms')
local failures = tonumber(h[1] or '0') + 1
local open_until = tonumber(h[2] or '0')
local open_ms = tonumber(h[3] or '0')
local keep = 86400000
if open_until > 0 then
  if now >= open_until then
    open_ms = math.min(open_ms * 2, tonumber(ARGV[3]))
    redis.call('HSET', KEYS[1], 'failures', failures, 'open_until', now + open_ms, 'open_ms', open_ms)
    redis.call('PEXPIRE', KEYS[1], keep + open_ms)
    redis.call('DEL', KEYS[2])
    return {'reopened', open_ms, now}
  end
  redis.call('HSET', KEYS[1], 'failures', failures)
  return {'open', open_until - now, now}
end
if failures >= tonumber(ARGV[1]) then
  open_ms = tonumber(ARGV[2])
  redis.call('HSET', KEYS[1], 'failures', failures, 'open_until', now + open_ms, 'open_ms', open_ms)
  redis.call('PEXPIRE', KEYS[1], keep + open_ms)
  return {'opened', open_ms, now}
end
redis.call('HSET', KEYS[1], 'failures', failures)
redis.call('PEXPIRE', KEYS[1], keep)
return {'counted', failures, now}
"#;

/// KEYS: events ZSET. ARGV: event id, window ms. Returns {count in window, now}.
const COUNT_EVENT: &str = r#"
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - window))
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], window)
return {redis.call('ZCARD', KEYS[1]), now}
"#;

/// KEYS: a lock or block. ARGV: its value. Deletes the key only if it still holds that value.
const UNLOCK: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return {0, now}
"#;

/// KEYS: lock. ARGV: owner, ms. Shortens the lock to `ms` only if this owner holds it.
const LINGER: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return {0, now}
"#;

/// KEYS: lock. ARGV: from, to, ms. Replaces the value `from` with `to` for `ms`.
const SWAP: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return {1, now}
end
return {0, now}
"#;

struct Scripts {
    block: Script,
    breaker_failure: Script,
    count_event: Script,
    unlock: Script,
    linger: Script,
    swap: Script,
}

/// Health in Redis.
#[derive(Clone)]
pub struct RedisHealth {
    redis: RedisHandle,
    scripts: Arc<Scripts>,
    clock: RedisClock,
}

impl RedisHealth {
    pub fn new(redis: RedisHandle) -> Self {
        let script = |body: &str| Script::new(&format!("{TIME_PRELUDE}{body}"));
        RedisHealth {
            redis,
            scripts: Arc::new(Scripts {
                block: script(BLOCK),
                breaker_failure: script(BREAKER_FAILURE),
                count_event: script(COUNT_EVENT),
                unlock: script(UNLOCK),
                linger: script(LINGER),
                swap: script(SWAP),
            }),
            clock: RedisClock::default(),
        }
    }

    pub fn handle(&self) -> &RedisHandle {
        &self.redis
    }

    fn learn_clock(&self, redis_now: i64) {
        self.clock.learn(redis_now);
    }

    /// Redis time in ms (learned offset; one `TIME` the first time).
    pub async fn redis_now(&self) -> Result<i64, BackendError> {
        self.clock.now(&self.redis).await
    }

    fn add_reads(pipeline: &mut redis::Pipeline, id: AccountId, now: i64) {
        let keys = AccountKeys::new(id);
        pipeline
            .cmd("ZCOUNT")
            .arg(&keys.leases)
            .arg(now)
            .arg("+inf")
            .cmd("PTTL")
            .arg(&keys.cooldown)
            .cmd("PTTL")
            .arg(keys::soft_block(id))
            .cmd("HMGET")
            .arg(keys::breaker(id))
            .arg("open_until")
            .arg("failures");
    }

    fn health_of(values: HealthRow, now: i64) -> AccountHealth {
        let (inflight, hard, soft, (open_until, failures)) = values;
        let breaker = match open_until {
            None | Some(0) => Breaker::Closed,
            Some(until) if until > now => Breaker::Open((until - now) as u64),
            Some(_) => Breaker::HalfOpen,
        };
        AccountHealth {
            inflight: Some(inflight),
            hard_block_ms: hard.max(0) as u64,
            soft_block_ms: soft.max(0) as u64,
            breaker,
            failures: failures.unwrap_or(0),
        }
    }

    async fn block(&self, key: String, ttl_ms: u64, value: String) -> Result<u64, BackendError> {
        let mut conn = self.redis.conn().await?;
        let (applied, now): (u64, i64) = self
            .redis
            .bounded(
                self.scripts
                    .block
                    .key(key)
                    .arg(ttl_ms.max(1))
                    .arg(value)
                    .invoke_async(&mut conn),
            )
            .await?;
        self.learn_clock(now);
        Ok(applied)
    }

    /// `SET key owner NX PX ttl`: whether this owner took the lock.
    async fn lock(&self, key: String, owner: &str, ttl_ms: u64) -> Result<bool, BackendError> {
        let mut conn = self.redis.conn().await?;
        let taken: Option<String> = self
            .redis
            .bounded(
                redis::cmd("SET")
                    .arg(key)
                    .arg(owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms.max(1))
                    .query_async(&mut conn),
            )
            .await?;
        Ok(taken.is_some())
    }

    async fn delete_if(&self, key: String, value: &str) -> Result<(), BackendError> {
        let mut conn = self.redis.conn().await?;
        let _: (i64, i64) = self
            .redis
            .bounded(
                self.scripts
                    .unlock
                    .key(key)
                    .arg(value)
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(())
    }
}

#[async_trait]
impl HealthStore for RedisHealth {
    async fn now(&self) -> Result<i64, BackendError> {
        self.redis_now().await
    }

    /// Reads load, blocks and breakers of `ids` in ONE pipeline (one round trip).
    async fn read_batch(&self, ids: &[AccountId]) -> Result<Vec<AccountHealth>, BackendError> {
        if ids.is_empty() {
            // An empty pipeline is an error in the client, not an empty answer.
            return Ok(Vec::new());
        }
        let now = self.redis_now().await?;
        let mut pipeline = redis::pipe();
        for &id in ids {
            Self::add_reads(&mut pipeline, id, now);
        }
        let mut conn = self.redis.conn().await?;
        let values: Vec<HealthRow> = if self.redis.is_cluster() {
            // A cluster pipeline must stay on one slot: one concurrent pipeline per account.
            let reads = ids.iter().map(|&id| async move {
                let mut pipeline = redis::pipe();
                Self::add_reads(&mut pipeline, id, now);
                let mut conn = self.redis.conn().await?;
                let one: HealthRow = self.redis.bounded(pipeline.query_async(&mut conn)).await?;
                Ok::<_, BackendError>(one)
            });
            futures_util::future::try_join_all(reads).await?
        } else {
            let flat: Vec<redis::Value> =
                self.redis.bounded(pipeline.query_async(&mut conn)).await?;
            let mut out = Vec::with_capacity(ids.len());
            for chunk in flat.chunks(4) {
                let tuple: HealthRow = redis::from_redis_value(redis::Value::Array(chunk.to_vec()))
                    .map_err(|e| BackendError::Failed(format!("health reply: {e}")))?;
                out.push(tuple);
            }
            out
        };
        if values.len() != ids.len() {
            return Err(BackendError::Failed(
                "health reply has the wrong length".into(),
            ));
        }
        Ok(values
            .into_iter()
            .map(|v| Self::health_of(v, now))
            .collect())
    }

    /// Reads one account (the fallback when a batch pipeline fails).
    async fn read_one(&self, id: AccountId) -> Result<AccountHealth, BackendError> {
        let now = self.redis_now().await?;
        let mut pipeline = redis::pipe();
        Self::add_reads(&mut pipeline, id, now);
        let mut conn = self.redis.conn().await?;
        let values: HealthRow = self.redis.bounded(pipeline.query_async(&mut conn)).await?;
        Ok(Self::health_of(values, now))
    }

    /// Hard block: the admission cooldown key, keeping a later deadline. Returns the block left.
    async fn hard_block(
        &self,
        id: AccountId,
        ttl_ms: u64,
        class: &str,
        status: u16,
        reason: &str,
    ) -> Result<u64, BackendError> {
        self.block(
            AccountKeys::new(id).cooldown,
            ttl_ms,
            block_value(class, status, reason),
        )
        .await
    }

    /// Soft block: reorders only.
    async fn soft_block(
        &self,
        id: AccountId,
        ttl_ms: u64,
        class: &str,
        status: u16,
        reason: &str,
    ) -> Result<u64, BackendError> {
        self.block(
            keys::soft_block(id),
            ttl_ms,
            block_value(class, status, reason),
        )
        .await
    }

    async fn breaker_failure(
        &self,
        id: AccountId,
        threshold: u32,
        open_ms: u64,
        max_open_ms: u64,
    ) -> Result<BreakerChange, BackendError> {
        let mut conn = self.redis.conn().await?;
        let (change, value, now): (String, u64, i64) = self
            .redis
            .bounded(
                self.scripts
                    .breaker_failure
                    .key(keys::breaker(id))
                    .key(keys::breaker_probe(id))
                    .arg(threshold)
                    .arg(open_ms)
                    .arg(max_open_ms)
                    .invoke_async(&mut conn),
            )
            .await?;
        self.learn_clock(now);
        Ok(match change.as_str() {
            "opened" => BreakerChange::Opened(value),
            "reopened" => BreakerChange::Reopened(value),
            "open" => BreakerChange::StillOpen,
            _ => BreakerChange::Counted(value as u32),
        })
    }

    async fn breaker_success(&self, id: AccountId) -> Result<bool, BackendError> {
        let mut conn = self.redis.conn().await?;
        let (was_open, _): (Option<i64>, i64) = self
            .redis
            .bounded(
                redis::pipe()
                    .cmd("HGET")
                    .arg(keys::breaker(id))
                    .arg("open_until")
                    .cmd("DEL")
                    .arg(keys::breaker(id))
                    .arg(keys::breaker_probe(id))
                    .query_async(&mut conn),
            )
            .await?;
        Ok(was_open.unwrap_or(0) > 0)
    }

    async fn count_unauthorized(&self, id: AccountId, window_ms: u64) -> Result<u32, BackendError> {
        let event = format!("{}-{}", now_ms(), fastrand::u32(..));
        let mut conn = self.redis.conn().await?;
        let (count, now): (u32, i64) = self
            .redis
            .bounded(
                self.scripts
                    .count_event
                    .key(keys::unauthorized_events(id))
                    .arg(event)
                    .arg(window_ms)
                    .invoke_async(&mut conn),
            )
            .await?;
        self.learn_clock(now);
        Ok(count)
    }

    async fn clear(&self, id: AccountId) -> Result<(), BackendError> {
        let mut conn = self.redis.conn().await?;
        // The cooldown key is on the account's slot; the selector keys are not, so they are two
        // separate commands on a cluster.
        let _: i64 = self
            .redis
            .bounded(
                redis::cmd("DEL")
                    .arg(AccountKeys::new(id).cooldown)
                    .query_async(&mut conn),
            )
            .await?;
        for key in [
            keys::soft_block(id),
            keys::breaker(id),
            keys::breaker_probe(id),
            keys::unauthorized_events(id),
        ] {
            let _: i64 = self
                .redis
                .bounded(redis::cmd("DEL").arg(key).query_async(&mut conn))
                .await?;
        }
        Ok(())
    }

    async fn list_blocks(&self, ids: &[AccountId]) -> Result<Vec<BlockInfo>, BackendError> {
        let now = self.redis_now().await?;
        let mut blocks = Vec::new();
        for &id in ids {
            let mut conn = self.redis.conn().await?;
            let cooldown = AccountKeys::new(id).cooldown;
            let (hard_ms, hard_value): (i64, Option<String>) = self
                .redis
                .bounded(
                    redis::pipe()
                        .cmd("PTTL")
                        .arg(&cooldown)
                        .cmd("GET")
                        .arg(&cooldown)
                        .query_async(&mut conn),
                )
                .await?;
            let soft_key = keys::soft_block(id);
            let (soft_ms, soft_value, open_until, failures): (
                i64,
                Option<String>,
                Option<i64>,
                Option<u32>,
            ) = self
                .redis
                .bounded(
                    redis::pipe()
                        .cmd("PTTL")
                        .arg(&soft_key)
                        .cmd("GET")
                        .arg(&soft_key)
                        .cmd("HGET")
                        .arg(keys::breaker(id))
                        .arg("open_until")
                        .cmd("HGET")
                        .arg(keys::breaker(id))
                        .arg("failures")
                        .query_async(&mut conn),
                )
                .await?;
            for (kind, ms, value) in [("hard", hard_ms, hard_value), ("soft", soft_ms, soft_value)]
            {
                if ms > 0 {
                    let (class, status, reason) = parse_block_value(value.as_deref().unwrap_or(""));
                    blocks.push(BlockInfo {
                        account_id: id,
                        kind,
                        class,
                        status,
                        reason,
                        remaining_ms: ms as u64,
                    });
                }
            }
            if let Some(until) = open_until.filter(|until| *until > 0) {
                blocks.push(BlockInfo {
                    account_id: id,
                    kind: "breaker",
                    class: "broken".into(),
                    status: 0,
                    reason: breaker_reason(failures.unwrap_or(0)),
                    remaining_ms: (until - now).max(0) as u64,
                });
            }
        }
        Ok(blocks)
    }

    async fn sticky_get(
        &self,
        group: &str,
        session: &str,
    ) -> Result<Option<AccountId>, BackendError> {
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::cmd("GET")
                    .arg(keys::sticky_binding(group, session))
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
    ) -> Result<Option<AccountId>, BackendError> {
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::cmd("SET")
                    .arg(keys::sticky_binding(group, session))
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
    ) -> Result<(), BackendError> {
        let mut conn = self.redis.conn().await?;
        let _: i64 = self
            .redis
            .bounded(
                redis::cmd("PEXPIRE")
                    .arg(keys::sticky_binding(group, session))
                    .arg(ttl_ms.max(1))
                    .query_async(&mut conn),
            )
            .await?;
        Ok(())
    }

    async fn sticky_drop(&self, group: &str, session: &str) -> Result<bool, BackendError> {
        let mut conn = self.redis.conn().await?;
        let removed: i64 = self
            .redis
            .bounded(
                redis::cmd("DEL")
                    .arg(keys::sticky_binding(group, session))
                    .query_async(&mut conn),
            )
            .await?;
        Ok(removed > 0)
    }

    async fn response_get(&self, response_id: &str) -> Result<Option<AccountId>, BackendError> {
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::cmd("GET")
                    .arg(keys::response_binding(response_id))
                    .query_async(&mut conn),
            )
            .await
    }

    async fn response_set(
        &self,
        response_id: &str,
        id: AccountId,
        ttl_ms: u64,
    ) -> Result<(), BackendError> {
        let mut conn = self.redis.conn().await?;
        let _: () = self
            .redis
            .bounded(
                redis::cmd("SET")
                    .arg(keys::response_binding(response_id))
                    .arg(id)
                    .arg("PX")
                    .arg(ttl_ms.max(1))
                    .query_async(&mut conn),
            )
            .await?;
        Ok(())
    }

    /// Takes the cluster-wide confirmation lock of an account (see `confirm.rs`).
    async fn lock_confirm(
        &self,
        id: AccountId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, BackendError> {
        self.lock(keys::confirm_lock(id), owner, ttl_ms).await
    }

    async fn unlock_confirm(&self, id: AccountId, owner: &str) -> Result<(), BackendError> {
        self.delete_if(keys::confirm_lock(id), owner).await
    }

    async fn linger_confirm(
        &self,
        id: AccountId,
        owner: &str,
        ms: u64,
    ) -> Result<(), BackendError> {
        let mut conn = self.redis.conn().await?;
        let _: (i64, i64) = self
            .redis
            .bounded(
                self.scripts
                    .linger
                    .key(keys::confirm_lock(id))
                    .arg(owner)
                    .arg(ms.max(1))
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(())
    }

    async fn confirm_state(&self, id: AccountId) -> Result<Option<String>, BackendError> {
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::cmd("GET")
                    .arg(keys::confirm_lock(id))
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
    ) -> Result<bool, BackendError> {
        let mut conn = self.redis.conn().await?;
        let (swapped, _now): (i64, i64) = self
            .redis
            .bounded(
                self.scripts
                    .swap
                    .key(keys::confirm_lock(id))
                    .arg(from)
                    .arg(to)
                    .arg(ttl_ms.max(1))
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(swapped == 1)
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
        self.block(AccountKeys::new(id).cooldown, ttl_ms, value.clone())
            .await?;
        Ok(value)
    }

    async fn unblock_confirming(&self, id: AccountId, value: &str) -> Result<(), BackendError> {
        self.delete_if(AccountKeys::new(id).cooldown, value).await
    }

    /// Takes the cluster-wide token-refresh lock for an account.
    async fn lock_refresh(
        &self,
        id: AccountId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, BackendError> {
        self.lock(keys::token_refresh_lock(id), owner, ttl_ms).await
    }

    async fn unlock_refresh(&self, id: AccountId, owner: &str) -> Result<(), BackendError> {
        self.delete_if(keys::token_refresh_lock(id), owner).await
    }
}
