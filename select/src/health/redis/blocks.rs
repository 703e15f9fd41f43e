//! `Health` in Redis: the pipelined reads selection makes, hard blocks (admission's cooldown
//! key) and soft blocks, breakers, unauthorized counts, and the blocks operators list and clear.

use async_trait::async_trait;
use poolgate_runtime::redis_keys::{self, AccountKeys};

use super::RedisHealth;
use crate::health::{
    AccountHealth, BlockInfo, Breaker, BreakerChange, HardBlock, Health, StateError, block_value,
    breaker_reason, parse_block_value,
};
use poolgate_core::health::is_confirming_reason;
use poolgate_core::{AccountId, now_ms};

/// One account's pipelined reads: live leases, hard block PTTL, soft block PTTL,
/// (breaker open_until, breaker failures).
type HealthRow = (u32, i64, i64, (Option<i64>, Option<u32>));

impl RedisHealth {
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
            .arg(redis_keys::soft_block(id))
            .cmd("HMGET")
            .arg(redis_keys::breaker(id))
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
}

#[async_trait]
impl Health for RedisHealth {
    async fn now(&self) -> Result<i64, StateError> {
        self.redis_now().await
    }

    /// Reads load, blocks and breakers of `ids` in ONE pipeline (one round trip).
    async fn read_batch(&self, ids: &[AccountId]) -> Result<Vec<AccountHealth>, StateError> {
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
                Ok::<_, StateError>(one)
            });
            futures_util::future::try_join_all(reads).await?
        } else {
            let flat: Vec<redis::Value> =
                self.redis.bounded(pipeline.query_async(&mut conn)).await?;
            let mut out = Vec::with_capacity(ids.len());
            for chunk in flat.chunks(4) {
                let tuple: HealthRow = redis::from_redis_value(redis::Value::Array(chunk.to_vec()))
                    .map_err(|e| StateError::Failed(format!("health reply: {e}")))?;
                out.push(tuple);
            }
            out
        };
        if values.len() != ids.len() {
            return Err(StateError::Failed(
                "health reply has the wrong length".into(),
            ));
        }
        Ok(values
            .into_iter()
            .map(|v| Self::health_of(v, now))
            .collect())
    }

    /// Reads one account (the fallback when a batch pipeline fails).
    async fn read_one(&self, id: AccountId) -> Result<AccountHealth, StateError> {
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
    ) -> Result<u64, StateError> {
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
    ) -> Result<u64, StateError> {
        self.block(
            redis_keys::soft_block(id),
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
    ) -> Result<BreakerChange, StateError> {
        let mut conn = self.redis.conn().await?;
        let (change, value, now): (String, u64, i64) = self
            .redis
            .bounded(
                self.scripts
                    .breaker_failure
                    .key(redis_keys::breaker(id))
                    .key(redis_keys::breaker_probe(id))
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

    async fn breaker_success(&self, id: AccountId) -> Result<bool, StateError> {
        let mut conn = self.redis.conn().await?;
        let (was_open, _): (Option<i64>, i64) = self
            .redis
            .bounded(
                redis::pipe()
                    .cmd("HGET")
                    .arg(redis_keys::breaker(id))
                    .arg("open_until")
                    .cmd("DEL")
                    .arg(redis_keys::breaker(id))
                    .arg(redis_keys::breaker_probe(id))
                    .query_async(&mut conn),
            )
            .await?;
        Ok(was_open.unwrap_or(0) > 0)
    }

    async fn count_unauthorized(&self, id: AccountId, window_ms: u64) -> Result<u32, StateError> {
        let event = format!("{}-{}", now_ms(), fastrand::u32(..));
        let mut conn = self.redis.conn().await?;
        let (count, now): (u32, i64) = self
            .redis
            .bounded(
                self.scripts
                    .count_event
                    .key(redis_keys::unauthorized_events(id))
                    .arg(event)
                    .arg(window_ms)
                    .invoke_async(&mut conn),
            )
            .await?;
        self.learn_clock(now);
        Ok(count)
    }

    async fn clear(&self, id: AccountId) -> Result<(), StateError> {
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
            redis_keys::soft_block(id),
            redis_keys::breaker(id),
            redis_keys::breaker_probe(id),
            redis_keys::unauthorized_events(id),
        ] {
            let _: i64 = self
                .redis
                .bounded(redis::cmd("DEL").arg(key).query_async(&mut conn))
                .await?;
        }
        Ok(())
    }

    async fn list_blocks(&self, ids: &[AccountId]) -> Result<Vec<BlockInfo>, StateError> {
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
            let soft_key = redis_keys::soft_block(id);
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
                        .arg(redis_keys::breaker(id))
                        .arg("open_until")
                        .cmd("HGET")
                        .arg(redis_keys::breaker(id))
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

    async fn hard_blocks(&self, ids: &[AccountId]) -> Result<Vec<HardBlock>, StateError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let of = |value: Option<String>| match value {
            None => HardBlock::None,
            Some(value) if is_confirming_reason(&parse_block_value(&value).2) => {
                HardBlock::Confirming
            }
            Some(_) => HardBlock::Other,
        };
        let values: Vec<Option<String>> = if self.redis.is_cluster() {
            // A cluster pipeline must stay on one slot: one concurrent read per account.
            let reads = ids.iter().map(|&id| async move {
                let mut conn = self.redis.conn().await?;
                let value: Option<String> = self
                    .redis
                    .bounded(
                        redis::cmd("GET")
                            .arg(AccountKeys::new(id).cooldown)
                            .query_async(&mut conn),
                    )
                    .await?;
                Ok::<_, StateError>(value)
            });
            futures_util::future::try_join_all(reads).await?
        } else {
            let mut pipeline = redis::pipe();
            for &id in ids {
                pipeline.cmd("GET").arg(AccountKeys::new(id).cooldown);
            }
            let mut conn = self.redis.conn().await?;
            self.redis.bounded(pipeline.query_async(&mut conn)).await?
        };
        if values.len() != ids.len() {
            return Err(StateError::Failed(
                "hard block reply has the wrong length".into(),
            ));
        }
        Ok(values.into_iter().map(of).collect())
    }

    async fn block_confirming(
        &self,
        id: AccountId,
        ttl_ms: u64,
        class: &str,
        status: u16,
        owner: &str,
    ) -> Result<String, StateError> {
        let value = block_value(
            class,
            status,
            &format!("{}{owner}", poolgate_core::health::CONFIRMING_REASON_PREFIX),
        );
        self.block(AccountKeys::new(id).cooldown, ttl_ms, value.clone())
            .await?;
        Ok(value)
    }

    async fn unblock_confirming(&self, id: AccountId, value: &str) -> Result<(), StateError> {
        self.delete_if(AccountKeys::new(id).cooldown, value).await
    }
}
