//! `Health` in memory: hard blocks (mirrored into admission's cooldown) and soft blocks,
//! breakers, unauthorized counts, and the reads selection makes (the load is admission's).

use std::time::Duration;

use async_trait::async_trait;

use super::{BreakerState, Expiring, InProcessHealth, delete_if, live};
use crate::health::{
    AccountHealth, BlockInfo, BreakerChange, Health, StateError, block_value, breaker_reason,
    parse_block_value,
};
use poolgate_core::AccountId;

/// How long a breaker's count is kept after its last change (Redis: the hash's expiry).
const BREAKER_KEEP_MS: i64 = 86_400_000;

/// Sets a block unless a later one is there; returns the block left and whether it was set.
fn block(slot: &mut Option<Expiring<String>>, now: i64, ttl_ms: u64, value: String) -> (u64, bool) {
    let ttl_ms = ttl_ms.max(1);
    if let Some(left) = live(slot, now).and_then(|b| b.left(now))
        && left >= ttl_ms
    {
        return (left, false);
    }
    *slot = Some(Expiring::new(value, now, ttl_ms));
    (ttl_ms, true)
}

impl InProcessHealth {
    /// A hard block, here and as admission's cooldown. Returns the block left.
    async fn hard(&self, id: AccountId, ttl_ms: u64, value: String) -> Result<u64, StateError> {
        let _order = self.cooldown_writes.lock().await;
        let (left, set) = self.with_account(id, |account, now| {
            block(&mut account.hard, now, ttl_ms, value)
        });
        if set {
            self.admission
                .set_cooldown(id, Duration::from_millis(left))
                .await?;
        }
        Ok(left)
    }

    async fn reads(&self, ids: &[AccountId]) -> Result<Vec<AccountHealth>, StateError> {
        let inflight = self.admission.inflight(ids).await?;
        if inflight.len() != ids.len() {
            return Err(StateError::Failed(
                "admission answered the wrong number of lease counts".into(),
            ));
        }
        Ok(self.with_state(|state, now| {
            ids.iter()
                .zip(inflight)
                .map(|(id, inflight)| match state.accounts.get(id) {
                    Some(account) => account.health(now, inflight),
                    None => AccountHealth {
                        inflight: Some(inflight),
                        ..AccountHealth::HEALTHY
                    },
                })
                .collect()
        }))
    }
}

#[async_trait]
impl Health for InProcessHealth {
    async fn now(&self) -> Result<i64, StateError> {
        Ok(self.clock())
    }

    async fn read_batch(&self, ids: &[AccountId]) -> Result<Vec<AccountHealth>, StateError> {
        self.reads(ids).await
    }

    async fn read_one(&self, id: AccountId) -> Result<AccountHealth, StateError> {
        self.reads(&[id])
            .await?
            .pop()
            .ok_or_else(|| StateError::Failed("no reading".into()))
    }

    async fn hard_block(
        &self,
        id: AccountId,
        ttl_ms: u64,
        class: &str,
        status: u16,
        reason: &str,
    ) -> Result<u64, StateError> {
        self.hard(id, ttl_ms, block_value(class, status, reason))
            .await
    }

    async fn soft_block(
        &self,
        id: AccountId,
        ttl_ms: u64,
        class: &str,
        status: u16,
        reason: &str,
    ) -> Result<u64, StateError> {
        let value = block_value(class, status, reason);
        Ok(self.with_account(id, |account, now| {
            block(&mut account.soft, now, ttl_ms, value).0
        }))
    }

    async fn breaker_failure(
        &self,
        id: AccountId,
        threshold: u32,
        open_ms: u64,
        max_open_ms: u64,
    ) -> Result<BreakerChange, StateError> {
        Ok(self.with_account(id, |account, now| {
            let mut breaker = account.breaker(now).unwrap_or(BreakerState {
                failures: 0,
                open_until: 0,
                open_ms: 0,
                expires: 0,
            });
            breaker.failures = breaker.failures.saturating_add(1);
            let as_ms = |ms: u64| i64::try_from(ms).unwrap_or(i64::MAX);
            let change = if breaker.open_until > 0 {
                if now >= breaker.open_until {
                    breaker.open_ms = breaker.open_ms.saturating_mul(2).min(max_open_ms);
                    breaker.open_until = now.saturating_add(as_ms(breaker.open_ms));
                    breaker.expires = now
                        .saturating_add(BREAKER_KEEP_MS)
                        .saturating_add(as_ms(breaker.open_ms));
                    BreakerChange::Reopened(breaker.open_ms)
                } else {
                    BreakerChange::StillOpen
                }
            } else if breaker.failures >= threshold {
                breaker.open_ms = open_ms;
                breaker.open_until = now.saturating_add(as_ms(open_ms));
                breaker.expires = now
                    .saturating_add(BREAKER_KEEP_MS)
                    .saturating_add(as_ms(open_ms));
                BreakerChange::Opened(open_ms)
            } else {
                breaker.expires = now.saturating_add(BREAKER_KEEP_MS);
                BreakerChange::Counted(breaker.failures)
            };
            account.breaker = Some(breaker);
            change
        }))
    }

    async fn breaker_success(&self, id: AccountId) -> Result<bool, StateError> {
        Ok(self.with_account(id, |account, now| {
            let was_open = account.breaker(now).is_some_and(|b| b.open_until > 0);
            account.breaker = None;
            was_open
        }))
    }

    async fn count_unauthorized(&self, id: AccountId, window_ms: u64) -> Result<u32, StateError> {
        let window = i64::try_from(window_ms).unwrap_or(i64::MAX);
        Ok(self.with_account(id, |account, now| {
            if account.unauthorized_until <= now {
                account.unauthorized.clear();
            }
            let since = now.saturating_sub(window);
            while account.unauthorized.front().is_some_and(|at| *at < since) {
                account.unauthorized.pop_front();
            }
            account.unauthorized.push_back(now);
            account.unauthorized_until = now.saturating_add(window);
            u32::try_from(account.unauthorized.len()).unwrap_or(u32::MAX)
        }))
    }

    async fn clear(&self, id: AccountId) -> Result<(), StateError> {
        let _order = self.cooldown_writes.lock().await;
        self.with_account(id, |account, _| {
            account.hard = None;
            account.soft = None;
            account.breaker = None;
            account.unauthorized.clear();
            account.unauthorized_until = 0;
        });
        self.admission.clear_cooldown(id).await
    }

    async fn list_blocks(&self, ids: &[AccountId]) -> Result<Vec<BlockInfo>, StateError> {
        Ok(self.with_state(|state, now| {
            let mut blocks = Vec::new();
            for id in ids {
                let Some(account) = state.accounts.get(id) else {
                    continue;
                };
                for (kind, slot) in [("hard", &account.hard), ("soft", &account.soft)] {
                    if let Some(entry) = live(slot, now)
                        && let Some(left) = entry.left(now)
                    {
                        let (class, status, reason) = parse_block_value(&entry.value);
                        blocks.push(BlockInfo {
                            account_id: *id,
                            kind,
                            class,
                            status,
                            reason,
                            remaining_ms: left,
                        });
                    }
                }
                if let Some(breaker) = account.breaker(now).filter(|b| b.open_until > 0) {
                    blocks.push(BlockInfo {
                        account_id: *id,
                        kind: "breaker",
                        class: "broken".into(),
                        status: 0,
                        reason: breaker_reason(breaker.failures),
                        remaining_ms: (breaker.open_until - now).max(0) as u64,
                    });
                }
            }
            blocks
        }))
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
        self.hard(id, ttl_ms, value.clone()).await?;
        Ok(value)
    }

    async fn unblock_confirming(&self, id: AccountId, value: &str) -> Result<(), StateError> {
        let _order = self.cooldown_writes.lock().await;
        let lifted = self.with_account(id, |account, now| delete_if(&mut account.hard, now, value));
        if lifted {
            self.admission.clear_cooldown(id).await?;
        }
        Ok(())
    }
}
