//! The admission replica registry in Redis: each replica heartbeats its member in, and reads
//! who is live (the failure policy's `divided` shares and its Redis probe, docs/DESIGN.md §4).

use poolgate_runtime::error::BackendError;
use poolgate_runtime::keys;

use super::RedisBackend;

impl RedisBackend {
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
