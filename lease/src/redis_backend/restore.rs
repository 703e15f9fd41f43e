//! Writing back into Redis what a replica admitted on its own while Redis was away (the failure
//! policy's recovery, docs/DESIGN.md §4).

use poolgate_runtime::error::StateError;
use poolgate_runtime::redis_keys::{self, AccountKeys};

use super::{RedisBackend, recount};
use crate::memory::FallbackSnapshot;

impl RedisBackend {
    /// Writes leases and RPM events admitted without Redis back into Redis (one script per
    /// account, one `ZADD` per user), keeping the later expiry where a lease is already there.
    pub async fn restore(&self, snapshot: &FallbackSnapshot) -> Result<(), StateError> {
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
            // What this replica admitted is back: the account's state is kept again (a Redis
            // that came back empty has no marker; `recount.rs`).
            let mut conn = self.redis.conn().await?;
            self.redis
                .bounded(
                    redis::cmd("SET")
                        .arg(&keys.kept)
                        .arg(0)
                        .arg("NX")
                        .arg("PX")
                        .arg(recount::KEPT_MS)
                        .query_async::<Option<String>>(&mut conn),
                )
                .await?;
        }
        for (api_key_id, leases) in &snapshot.keys {
            // The key's slot of the fallback's keyed leases: the restore script with the key's
            // leases as both keys and no RPM events.
            let key_leases =
                poolgate_runtime::redis_keys::ClientKeyKeys::slot_only(*api_key_id).leases;
            let mut invocation = self.scripts.restore.key(&key_leases);
            invocation.key(&key_leases).arg(leases.len());
            for (id, ttl) in leases {
                invocation.arg(id).arg(*ttl);
            }
            let (_, now): (i64, i64) = self.script(&invocation).await?;
            self.learn_clock(now);
        }
        for (user, events) in &snapshot.users {
            let now = self.redis_now().await?;
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(redis_keys::user_rpm(user));
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
}
