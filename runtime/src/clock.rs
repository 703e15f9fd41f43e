//! Redis time. Decisions that several replicas share (lease expiry, blocks, breakers) use the
//! Redis server's clock, never a replica's: every script reads `TIME` through [`TIME_PRELUDE`]
//! and returns it, and [`RedisClock`] keeps the offset to the local clock so reads outside a
//! script need no extra round trip.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::error::StateError;
use crate::redis::RedisHandle;

/// Lua prelude: `now`, the Redis clock in ms.
pub const TIME_PRELUDE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"#;

/// The offset between Redis time and local time, learned from every script's reply.
#[derive(Debug, Clone)]
pub struct RedisClock {
    offset_ms: Arc<AtomicI64>,
}

impl Default for RedisClock {
    fn default() -> Self {
        RedisClock {
            offset_ms: Arc::new(AtomicI64::new(i64::MIN)),
        }
    }
}

impl RedisClock {
    /// Records a Redis `now` just read.
    pub fn learn(&self, redis_now: i64) {
        self.offset_ms
            .store(redis_now - local_ms(), Ordering::Relaxed);
    }

    /// Redis time in ms: from the learned offset, or one `TIME` round trip the first time.
    pub async fn now(&self, redis: &RedisHandle) -> Result<i64, StateError> {
        let offset = self.offset_ms.load(Ordering::Relaxed);
        if offset != i64::MIN {
            return Ok(local_ms() + offset);
        }
        let mut conn = redis.conn().await?;
        let (secs, micros): (i64, i64) = redis
            .bounded(::redis::cmd("TIME").query_async(&mut conn))
            .await?;
        let now = secs * 1000 + micros / 1000;
        self.learn(now);
        Ok(now)
    }
}

/// Local wall-clock ms since the epoch.
pub fn local_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
