//! Account health in Redis, shared by every selector replica at once: hard blocks (written to
//! admission's cooldown key, so admission refuses the account in the same script that takes a
//! slot), soft blocks, circuit breakers, sticky and response bindings, confirmation and
//! token-refresh locks; the live lease count is read from admission's lease keys.
//!
//! Key names come from `poolgate_runtime::redis_keys`; time inside decisions is Redis `TIME`. This
//! file holds the store, its scripts and the writes they share; `blocks.rs` implements
//! `Health`, `windows.rs` `Windows`, `bindings.rs` `Bindings`, `locks.rs` `Locks`.

use std::sync::Arc;

use poolgate_runtime::clock::{RedisClock, TIME_PRELUDE};
use poolgate_runtime::redis::RedisHandle;
use redis::Script;

use super::StateError;

mod bindings;
mod blocks;
mod locks;
mod windows;

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

/// KEYS: the account's windows hash. ARGV: ttl ms, kept past reset ms, then pairs of (window,
/// reading JSON). Per window a reading replaces the stored one as `windows::supersedes` says
/// (a later period, or further along in the same one; a per-minute limit: observed last);
/// readings whose reset passed longer ago than kept are dropped; the hash lives ttl ms from this
/// write. A stored value that does not decode is replaced or dropped, never a script error.
const STORE_WINDOWS: &str = r#"
local function decoded(json)
  local ok, value = pcall(cjson.decode, json)
  if ok and type(value) == 'table' then return value end
  return nil
end
local function number(value)
  if type(value) == 'number' then return value end
  return nil
end
local rank = {Unknown = 0, Allowed = 1, AllowedWarning = 2, Rejected = 3}
local function supersedes(new, old)
  local observed_later = (number(new.observed_at_ms) or 0) >= (number(old.observed_at_ms) or 0)
  if type(new.kind) ~= 'string' then return observed_later end
  local tolerance = 60000
  local length = number(new.length_ms)
  if length then tolerance = math.max(0, math.min(60000, math.floor(length / 10))) end
  local reset, old_reset = number(new.reset_at_ms) or 0, number(old.reset_at_ms) or 0
  if reset > old_reset + tolerance then return true end
  if reset + tolerance < old_reset then return false end
  local status, old_status = rank[new.status] or 0, rank[old.status] or 0
  if status ~= old_status then return status > old_status end
  local used, old_used = number(new.utilization) or -1, number(old.utilization) or -1
  if used ~= old_used then return used > old_used end
  return observed_later
end
local kept = tonumber(ARGV[2])
for i = 3, #ARGV - 1, 2 do
  local field, value = ARGV[i], ARGV[i + 1]
  local old = redis.call('HGET', KEYS[1], field)
  local old_reading = old and decoded(old)
  local new_reading = decoded(value)
  if (not old_reading) or (new_reading and supersedes(new_reading, old_reading)) then
    redis.call('HSET', KEYS[1], field, value)
  end
end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all - 1, 2 do
  local reading = decoded(all[i + 1])
  local reset = reading and number(reading.reset_at_ms)
  if not reset or reset + kept <= now then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
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
    store_windows: Script,
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
                store_windows: script(STORE_WINDOWS),
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
    pub async fn redis_now(&self) -> Result<i64, StateError> {
        self.clock.now(&self.redis).await
    }

    async fn block(&self, key: String, ttl_ms: u64, value: String) -> Result<u64, StateError> {
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
    async fn lock(&self, key: String, owner: &str, ttl_ms: u64) -> Result<bool, StateError> {
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

    async fn delete_if(&self, key: String, value: &str) -> Result<(), StateError> {
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
