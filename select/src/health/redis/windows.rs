//! `Windows` in Redis: one hash per account (`redis_keys::usage_windows`), merged by a script so
//! replicas writing the same account at once keep the newest reading per window.

use async_trait::async_trait;
use poolgate_runtime::redis_keys;

use super::RedisHealth;
use crate::health::{StateError, WINDOWS_KEPT_PAST_RESET_MS, WINDOWS_TTL_MS, Windows, window_kept};
use poolgate_core::AccountId;
use poolgate_core::windows::WindowReading;

/// The readings one account's hash holds; a value that does not read is skipped (the next
/// write of that window replaces it), never an error for the whole read.
fn readings_of(id: AccountId, values: Vec<String>, now: i64) -> Vec<WindowReading> {
    values
        .iter()
        .filter_map(|value| match serde_json::from_str::<WindowReading>(value) {
            Ok(reading) => Some(reading),
            Err(error) => {
                tracing::debug!(account_id = id, %error, "unreadable usage window skipped");
                None
            }
        })
        .filter(|reading| window_kept(reading, now))
        .collect()
}

#[async_trait]
impl Windows for RedisHealth {
    async fn store_windows(
        &self,
        id: AccountId,
        readings: &[WindowReading],
    ) -> Result<(), StateError> {
        if readings.is_empty() {
            return Ok(());
        }
        let mut invocation = self
            .scripts
            .store_windows
            .key(redis_keys::usage_windows(id));
        invocation
            .arg(WINDOWS_TTL_MS)
            .arg(WINDOWS_KEPT_PAST_RESET_MS);
        for reading in readings {
            let field = serde_json::to_string(&(reading.kind, &reading.scope))
                .map_err(|e| StateError::Failed(format!("usage window field: {e}")))?;
            let value = serde_json::to_string(reading)
                .map_err(|e| StateError::Failed(format!("usage window value: {e}")))?;
            invocation.arg(field).arg(value);
        }
        let mut conn = self.redis.conn().await?;
        let (_, now): (i64, i64) = self
            .redis
            .bounded(invocation.invoke_async(&mut conn))
            .await?;
        self.learn_clock(now);
        Ok(())
    }

    /// Every account's hash in ONE pipeline (one round trip; on a cluster, one per account,
    /// concurrently, as `read_batch`).
    async fn read_windows(&self, ids: &[AccountId]) -> Result<Vec<Vec<WindowReading>>, StateError> {
        if ids.is_empty() {
            // An empty pipeline is an error in the client, not an empty answer.
            return Ok(Vec::new());
        }
        let now = self.redis_now().await?;
        let values: Vec<Vec<String>> = if self.redis.is_cluster() {
            let reads = ids.iter().map(|&id| async move {
                let mut conn = self.redis.conn().await?;
                let one: Vec<String> = self
                    .redis
                    .bounded(
                        redis::cmd("HVALS")
                            .arg(redis_keys::usage_windows(id))
                            .query_async(&mut conn),
                    )
                    .await?;
                Ok::<_, StateError>(one)
            });
            futures_util::future::try_join_all(reads).await?
        } else {
            let mut pipeline = redis::pipe();
            for &id in ids {
                pipeline.cmd("HVALS").arg(redis_keys::usage_windows(id));
            }
            let mut conn = self.redis.conn().await?;
            self.redis.bounded(pipeline.query_async(&mut conn)).await?
        };
        if values.len() != ids.len() {
            return Err(StateError::Failed(
                "usage windows reply has the wrong length".into(),
            ));
        }
        Ok(ids
            .iter()
            .zip(values)
            .map(|(&id, values)| readings_of(id, values, now))
            .collect())
    }
}
