//! The Redis backend: every decision is one Lua script on the account's hash slot, timed by
//! Redis `TIME` (never a replica clock), so any number of admission replicas share one count.
//!
//! Only this module and `poolgate_runtime::keys` know Redis key names.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use poolgate_runtime::keys::{self, AccountKeys};
use redis::Script;

use crate::backend::{AcquireLimits, LeaseBackend};
use crate::memory::FallbackSnapshot;
use poolgate_core::AccountId;
use poolgate_core::lease::{
    Denial, DenyReason, LeaseId, LeaseTerms, LostReason, Renewal, Resumption,
};
use poolgate_runtime::clock::{RedisClock, TIME_PRELUDE};
use poolgate_runtime::error::BackendError;
use poolgate_runtime::redis::{Conn, RedisHandle};

/// Shared Lua prelude (after the clock's): a PEXPIRE that only ever lengthens, the RPM check.
const PRELUDE: &str = r#"
local function extend(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end
local function rpm_full(key, limit, window)
  if limit <= 0 then return nil end
  local since = now - window
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. since)
  if redis.call('ZCOUNT', key, since, '+inf') < limit then return nil end
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local retry = 1
  if oldest[2] then retry = math.max(1, tonumber(oldest[2]) + window - now) end
  return retry
end
local function add_spend(key, micros, window)
  local w = redis.call('HMGET', key, 'start', 'spend')
  local start = tonumber(w[1])
  if (not start) or now >= start + window then
    redis.call('HSET', key, 'start', now, 'spend', micros)
    redis.call('PEXPIRE', key, window)
    return micros
  end
  return redis.call('HINCRBY', key, 'spend', micros)
end
"#;

/// KEYS: leases, rpm, cooldown, window, user rpm (on a Cluster, where the user's key is in
/// another slot, the account rpm key again with a user limit of 0).
/// ARGV: lease id, ttl ms, concurrency limit, rpm limit, window limit (micro-USD, 0 = none),
/// rpm window ms, session window ms, ignore cooldown (1/0), user rpm limit (0 = none).
/// Returns {reason, retry_ms, now}; reason 'granted' when the lease and the RPM events (account
/// and user, member = lease id) were added. A refusal at any gate writes nothing, so a refused
/// acquire is this one round trip.
const ACQUIRE: &str = r#"
local user_limit = tonumber(ARGV[9])
if user_limit > 0 then
  local user_retry = rpm_full(KEYS[5], user_limit, tonumber(ARGV[6]))
  if user_retry then return {'user_rpm', user_retry, now} end
end
if ARGV[8] ~= '1' then
  local cool = redis.call('PTTL', KEYS[3])
  if cool ~= -2 then return {'cooling', math.max(cool, 0), now} end
end
local ttl = tonumber(ARGV[2])
local concurrency = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
if concurrency > 0 and redis.call('ZCOUNT', KEYS[1], now, '+inf') >= concurrency then
  return {'concurrency', 0, now}
end
local rpm = tonumber(ARGV[4])
local rpm_window = tonumber(ARGV[6])
local retry = rpm_full(KEYS[2], rpm, rpm_window)
if retry then return {'rpm', retry, now} end
local window_limit = tonumber(ARGV[5])
if window_limit > 0 then
  local w = redis.call('HMGET', KEYS[4], 'start', 'spend')
  local start = tonumber(w[1])
  local window = tonumber(ARGV[7])
  if start and now < start + window and tonumber(w[2] or '0') >= window_limit then
    return {'session_window', start + window - now, now}
  end
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
extend(KEYS[1], ttl)
if rpm > 0 then
  redis.call('ZADD', KEYS[2], now, ARGV[1])
  extend(KEYS[2], rpm_window)
end
if user_limit > 0 then
  redis.call('ZADD', KEYS[5], now, ARGV[1])
  extend(KEYS[5], rpm_window)
end
return {'granted', 0, now}
"#;

/// KEYS: an RPM ZSET (account or user). ARGV: event id, limit, window ms.
/// Returns {charged (1/0), retry_ms, now}. Idempotent by event id: an event already charged
/// answers charged and counts once.
const CHARGE_RPM: &str = r#"
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {1, 0, now} end
local limit = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local retry = rpm_full(KEYS[1], limit, window)
if retry then return {0, retry, now} end
redis.call('ZADD', KEYS[1], now, ARGV[1])
extend(KEYS[1], window)
return {1, 0, now}
"#;

/// Shared by the lease scripts: whether a lease is live, and whether its release fence is up.
/// The fence (KEYS `released`: member = lease id, score = fence expiry) is raised by every
/// release path, so no heartbeat or resume brings a released lease back.
const LEASE_PRELUDE: &str = r#"
local function live(key, id)
  local score = redis.call('ZSCORE', key, id)
  return score and tonumber(score) >= now
end
local function fenced(key, id)
  local fence = redis.call('ZSCORE', key, id)
  return fence and tonumber(fence) >= now
end
local function raise_fence(key, id, expires)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. now)
  redis.call('ZADD', key, 'GT', expires, id)
  extend(key, expires - now)
end
"#;

/// KEYS: leases, released. ARGV: lease id, ttl ms, restore ('1': a missing lease may be re-added
/// with room, '0': never), concurrency limit (<= 0: unlimited).
/// Returns {state, now}: 1 = renewed, 2 = restored (was missing or expired, and the account had
/// room), 3 = lost: released (fence up), 4 = lost: no room, 5 = lost: expired (no restore). A
/// lost lease writes nothing.
const RENEW: &str = r#"
local ttl = tonumber(ARGV[2])
if live(KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  extend(KEYS[1], ttl)
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {1, now}
end
if fenced(KEYS[2], ARGV[1]) then return {3, now} end
if ARGV[3] ~= '1' then return {5, now} end
local limit = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
if limit > 0 and redis.call('ZCOUNT', KEYS[1], now, '+inf') >= limit then return {4, now} end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
extend(KEYS[1], ttl)
return {2, now}
"#;

/// KEYS: leases, holders, released. ARGV: lease id, ttl ms.
/// Returns {holder epoch, now}; 0 = the lease is unknown or expired, -1 = it was released (fence
/// up). The caller becomes the lease's holder, so the stream it replaces can no longer orphan
/// it; a resume within the orphan grace lowers the fence the orphaning raised.
const RESUME: &str = r#"
if not live(KEYS[1], ARGV[1]) then
  if fenced(KEYS[3], ARGV[1]) then return {-1, now} end
  return {0, now}
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
extend(KEYS[1], ttl)
redis.call('ZREM', KEYS[3], ARGV[1])
local epoch = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
extend(KEYS[2], ttl)
return {epoch, now}
"#;

/// KEYS: leases, window, holders, released. ARGV: lease id, spend micro-USD, session window ms,
/// fence ms. Returns {removed (1/0), now}. Raises the release fence whether or not the lease was
/// still there: a lease released after it expired must not come back either.
const RELEASE: &str = r#"
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
local removed = 0
if score then
  redis.call('ZREM', KEYS[1], ARGV[1])
  if tonumber(score) >= now then removed = 1 end
  redis.call('HDEL', KEYS[3], ARGV[1])
end
raise_fence(KEYS[4], ARGV[1], now + tonumber(ARGV[4]))
local spend = tonumber(ARGV[2])
if spend > 0 then add_spend(KEYS[2], spend, tonumber(ARGV[3])) end
return {removed, now}
"#;

/// KEYS: leases, holders, released. ARGV: lease id, grace ms, holder epoch, fence ms. Cuts the
/// expiry to now + grace (never lengthens it) if the caller is still the lease's holder, and
/// raises the release fence from that expiry.
const ORPHAN: &str = r#"
local holder = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if holder ~= tonumber(ARGV[3]) then return {0, now} end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not (score and tonumber(score) >= now) then return {0, now} end
local ends = math.min(tonumber(score), now + tonumber(ARGV[2]))
redis.call('ZADD', KEYS[1], 'XX', ends, ARGV[1])
raise_fence(KEYS[3], ARGV[1], ends + tonumber(ARGV[4]))
return {0, now}
"#;

/// KEYS: window. ARGV: spend micro-USD, session window ms. Returns {spend in window, now}.
const RECORD_SPEND: &str = r#"
return {add_spend(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])), now}
"#;

/// KEYS: cooldown. ARGV: ttl ms. Keeps the later of the existing and the new deadline.
const SET_COOLDOWN: &str = r#"
local ttl = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('SET', KEYS[1], 'hard', 'PX', ttl) end
return {0, now}
"#;

/// KEYS: waiters. ARGV: waiter id, max waiting, ttl ms.
/// Returns {position, now}; position 0 = the queue is full. Registration is atomic, so a burst
/// of waiters never registers more than the bound.
const REGISTER_WAITER: &str = r#"
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
local ttl = tonumber(ARGV[3])
local present = redis.call('ZSCORE', KEYS[1], ARGV[1])
local count = redis.call('ZCARD', KEYS[1])
if (not present) and count >= tonumber(ARGV[2]) then return {0, now} end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
extend(KEYS[1], ttl)
if present then return {count, now} end
return {count + 1, now}
"#;

/// KEYS: leases, rpm. ARGV: n leases, then (id, ttl ms) pairs, then (id, age ms) RPM pairs.
/// Writes back what a replica admitted on its own while Redis was away.
const RESTORE: &str = r#"
local n = tonumber(ARGV[1])
local i = 2
local longest = 0
for _ = 1, n do
  local ttl = tonumber(ARGV[i + 1])
  redis.call('ZADD', KEYS[1], 'GT', now + ttl, ARGV[i])
  longest = math.max(longest, ttl)
  i = i + 2
end
if longest > 0 then extend(KEYS[1], longest) end
local events = 0
while i < #ARGV do
  redis.call('ZADD', KEYS[2], now - tonumber(ARGV[i + 1]), ARGV[i])
  events = events + 1
  i = i + 2
end
if events > 0 then extend(KEYS[2], 60000) end
return {n, now}
"#;

/// KEYS: registry. ARGV: member, ttl ms. Heartbeats this replica and returns the live members.
const REGISTRY_HEARTBEAT: &str = r#"
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
extend(KEYS[1], tonumber(ARGV[2]))
return {redis.call('ZRANGE', KEYS[1], 0, -1), now}
"#;

/// The scripts, hashed once.
struct Scripts {
    acquire: Script,
    charge_rpm: Script,
    renew: Script,
    resume: Script,
    release: Script,
    orphan: Script,
    record_spend: Script,
    set_cooldown: Script,
    register_waiter: Script,
    restore: Script,
    registry_heartbeat: Script,
}

impl Scripts {
    fn new() -> Self {
        let script = |body: &str| Script::new(&format!("{TIME_PRELUDE}{PRELUDE}{body}"));
        let lease_script =
            |body: &str| Script::new(&format!("{TIME_PRELUDE}{PRELUDE}{LEASE_PRELUDE}{body}"));
        Scripts {
            acquire: script(ACQUIRE),
            charge_rpm: script(CHARGE_RPM),
            renew: lease_script(RENEW),
            resume: lease_script(RESUME),
            release: lease_script(RELEASE),
            orphan: lease_script(ORPHAN),
            record_spend: script(RECORD_SPEND),
            set_cooldown: script(SET_COOLDOWN),
            register_waiter: script(REGISTER_WAITER),
            restore: script(RESTORE),
            registry_heartbeat: script(REGISTRY_HEARTBEAT),
        }
    }
}

/// How long the detached cleanup of an uncertain acquire may take (seed 001 item 7).
const UNCERTAIN_CLEANUP_TIMEOUT: Duration = Duration::from_millis(500);

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

    /// After an acquire that timed out (the script may have committed), removes the lease and
    /// its RPM events (account, and user when `user_rpm` is given) once, detached and bounded by
    /// 500 ms, so no ghost slot or charge stays. Not retried.
    ///
    /// The `ZREM`s go out on the *same* connection as the timed-out script: Redis answers one
    /// connection's commands in order, so the removal cannot overtake the script it cleans up
    /// after (on another connection it could run first and remove nothing).
    fn remove_uncertain_lease(&self, lease_id: &LeaseId, user_rpm: Option<String>, mut conn: Conn) {
        let keys = AccountKeys::new(lease_id.account_id());
        let member = lease_id.as_str().to_owned();
        tokio::spawn(async move {
            let mut cleanup = redis::pipe();
            cleanup
                .cmd("ZREM")
                .arg(&keys.leases)
                .arg(&member)
                .cmd("ZREM")
                .arg(&keys.rpm)
                .arg(&member);
            if let Some(user_rpm) = &user_rpm {
                cleanup.cmd("ZREM").arg(user_rpm).arg(&member);
            }
            let cleanup = cleanup.query_async::<Vec<i64>>(&mut conn);
            match tokio::time::timeout(UNCERTAIN_CLEANUP_TIMEOUT, cleanup).await {
                Ok(Ok(_)) => tracing::debug!(lease_id = %member, "uncertain acquire cleaned up"),
                _ => {
                    tracing::warn!(lease_id = %member, "uncertain acquire cleanup failed; the lease expires at its ttl")
                }
            }
        });
    }
}

impl RedisBackend {
    /// Writes leases and RPM events admitted without Redis back into Redis (one script per
    /// account, one `ZADD` per user), keeping the later expiry where a lease is already there.
    pub async fn restore(&self, snapshot: &FallbackSnapshot) -> Result<(), BackendError> {
        for account in &snapshot.accounts {
            let keys = AccountKeys::new(account.account_id);
            let mut invocation = self.scripts.restore.key(&keys.leases);
            invocation.key(&keys.rpm).arg(account.leases.len());
            for (id, ttl) in &account.leases {
                invocation.arg(id).arg(*ttl);
            }
            for (id, age) in &account.rpm_events {
                invocation.arg(id).arg(*age);
            }
            let (_, now): (i64, i64) = self.script(&invocation).await?;
            self.learn_clock(now);
        }
        for (user, events) in &snapshot.users {
            let now = self.redis_now().await?;
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(keys::user_rpm(user));
            for (id, age) in events {
                cmd.arg(now - *age as i64).arg(id);
            }
            let mut conn = self.redis.conn().await?;
            self.redis
                .bounded(cmd.query_async::<i64>(&mut conn))
                .await?;
        }
        Ok(())
    }

    /// Heartbeats `member` into the replica registry; returns the live members, sorted.
    pub async fn registry_heartbeat(
        &self,
        member: &str,
        ttl_ms: u64,
    ) -> Result<Vec<String>, BackendError> {
        let (mut members, now): (Vec<String>, i64) = self
            .script(
                self.scripts
                    .registry_heartbeat
                    .key(keys::admission_replicas())
                    .arg(member)
                    .arg(ttl_ms),
            )
            .await?;
        self.learn_clock(now);
        members.sort();
        Ok(members)
    }

    /// Leaves the registry (graceful shutdown), so the others' shares grow at once.
    pub async fn registry_leave(&self, member: &str) -> Result<(), BackendError> {
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::cmd("ZREM")
                    .arg(keys::admission_replicas())
                    .arg(member)
                    .query_async::<i64>(&mut conn),
            )
            .await?;
        Ok(())
    }
}

fn deny_reason(name: &str) -> DenyReason {
    match name {
        "cooling" => DenyReason::Cooling,
        "rpm" => DenyReason::Rpm,
        "session_window" => DenyReason::SessionWindow,
        "user_rpm" => DenyReason::UserRpm,
        _ => DenyReason::Concurrency,
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
                Ok((charged == 0).then(|| Denial::new(DenyReason::UserRpm, retry)))
            }
            Ok(Err(error)) => Err(BackendError::from(error)),
            Err(_) => {
                // The charge may have landed: take it back on the same connection (after it).
                let member = event_id.to_owned();
                tokio::spawn(async move {
                    let mut zrem = redis::cmd("ZREM");
                    zrem.arg(&key).arg(&member);
                    let refund = zrem.query_async::<i64>(&mut conn);
                    if !matches!(
                        tokio::time::timeout(UNCERTAIN_CLEANUP_TIMEOUT, refund).await,
                        Ok(Ok(_))
                    ) {
                        tracing::warn!(
                            "uncertain user charge not refunded; it ages out within the rpm window"
                        );
                    }
                });
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
                Ok((reason != "granted").then(|| Denial::new(deny_reason(&reason), retry)))
            }
            Ok(Err(error)) => Err(BackendError::from(error)),
            Err(_) => {
                self.remove_uncertain_lease(lease_id, user_rpm, conn);
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
        Ok(match state {
            1 => Renewal::Renewed,
            2 => Renewal::Restored,
            3 => Renewal::Lost(LostReason::Released),
            4 => Renewal::Lost(LostReason::NoRoom),
            _ => Renewal::Lost(LostReason::Expired),
        })
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
        Ok(match epoch {
            epoch if epoch > 0 => Resumption::Resumed {
                holder_epoch: epoch as u64,
            },
            0 => Resumption::Unknown,
            _ => Resumption::Released,
        })
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
        Ok((charged == 0).then(|| Denial::new(DenyReason::Rpm, retry)))
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
