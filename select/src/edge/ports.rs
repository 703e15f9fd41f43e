//! The selection engine's ports over an [`EdgeView`] (docs/DESIGN.md §2, "Selection at the
//! edge"): health, windows and bindings read from the view, every write the selector owns
//! refused, the confirmation lock never taken, no account source and no probe leases.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use super::*;

/// The engine over a view: plans, key checks and model lists from the relay's copy, with the
/// relay's clock and metrics. Its background tasks are never started (the selector runs them).
pub fn edge_selector(
    view: Arc<EdgeView>,
    settings: SelectorSettings,
    metrics: Metrics,
    clock: Clock,
) -> Selector {
    Selector::new(SelectorParts {
        snapshot: view.snapshot.clone(),
        source: Arc::new(ReadOnly),
        health: Arc::new(ViewHealth(view)),
        leases: Arc::new(ReadOnly),
        settings,
        metrics,
        clock,
    })
}

/// Why a write at the edge fails.
const READ_ONLY: &str = "the relay's view is read-only: the selector owns this write";

fn read_only() -> StateError {
    StateError::Failed(READ_ONLY.into())
}

/// The engine's health store at the edge: the view's readings and the relay's bindings.
pub(super) struct ViewHealth(pub(super) Arc<EdgeView>);

#[async_trait]
impl Health for ViewHealth {
    async fn now(&self) -> Result<i64, StateError> {
        Ok(poolgate_core::now_ms())
    }

    async fn read_batch(&self, ids: &[AccountId]) -> Result<Vec<AccountHealth>, StateError> {
        let now = Instant::now();
        let states = self.0.states.read().unwrap_or_else(|p| p.into_inner());
        Ok(ids
            .iter()
            .map(|id| {
                states
                    .get(id)
                    .and_then(|held| held.health(now))
                    .unwrap_or(UNKNOWN)
            })
            .collect())
    }

    async fn read_one(&self, id: AccountId) -> Result<AccountHealth, StateError> {
        Ok(self
            .0
            .held(id)
            .and_then(|held| held.health(Instant::now()))
            .unwrap_or(UNKNOWN))
    }

    async fn hard_block(
        &self,
        _: AccountId,
        _: u64,
        _: &str,
        _: u16,
        _: &str,
    ) -> Result<u64, StateError> {
        Err(read_only())
    }

    async fn soft_block(
        &self,
        _: AccountId,
        _: u64,
        _: &str,
        _: u16,
        _: &str,
    ) -> Result<u64, StateError> {
        Err(read_only())
    }

    async fn breaker_failure(
        &self,
        _: AccountId,
        _: u32,
        _: u64,
        _: u64,
    ) -> Result<BreakerChange, StateError> {
        Err(read_only())
    }

    async fn breaker_success(&self, _: AccountId) -> Result<bool, StateError> {
        Err(read_only())
    }

    async fn count_unauthorized(&self, _: AccountId, _: u64) -> Result<u32, StateError> {
        Err(read_only())
    }

    async fn clear(&self, _: AccountId) -> Result<(), StateError> {
        Err(read_only())
    }

    async fn list_blocks(&self, _: &[AccountId]) -> Result<Vec<BlockInfo>, StateError> {
        Err(read_only())
    }

    async fn hard_blocks(&self, ids: &[AccountId]) -> Result<Vec<HardBlock>, StateError> {
        let now = Instant::now();
        let states = self.0.states.read().unwrap_or_else(|p| p.into_inner());
        Ok(ids
            .iter()
            .map(|id| match states.get(id) {
                Some(held) if held.health(now).is_some_and(|h| h.hard_block_ms > 0) => {
                    if held.state.confirming {
                        HardBlock::Confirming
                    } else {
                        HardBlock::Other
                    }
                }
                _ => HardBlock::None,
            })
            .collect())
    }

    async fn block_confirming(
        &self,
        _: AccountId,
        _: u64,
        _: &str,
        _: u16,
        _: &str,
    ) -> Result<String, StateError> {
        Err(read_only())
    }

    async fn unblock_confirming(&self, _: AccountId, _: &str) -> Result<(), StateError> {
        Err(read_only())
    }
}

#[async_trait]
impl Windows for ViewHealth {
    async fn store_windows(
        &self,
        id: AccountId,
        readings: &[WindowReading],
    ) -> Result<(), StateError> {
        self.0.note_windows(id, readings);
        Ok(())
    }

    async fn read_windows(&self, ids: &[AccountId]) -> Result<Vec<Vec<WindowReading>>, StateError> {
        let states = self.0.states.read().unwrap_or_else(|p| p.into_inner());
        Ok(ids
            .iter()
            .map(|id| {
                states
                    .get(id)
                    .map(|held| held.state.windows.clone())
                    .unwrap_or_default()
            })
            .collect())
    }
}

#[async_trait]
impl Bindings for ViewHealth {
    async fn sticky_get(
        &self,
        group: &str,
        session: &str,
    ) -> Result<Option<AccountId>, StateError> {
        let sessions = self.0.sessions.lock().unwrap_or_else(|p| p.into_inner());
        Ok(sessions
            .get(&(group.to_owned(), session.to_owned()))
            .map(|bound| bound.account))
    }

    async fn sticky_set(
        &self,
        group: &str,
        session: &str,
        id: AccountId,
        _ttl_ms: u64,
    ) -> Result<Option<AccountId>, StateError> {
        let mut sessions = self.0.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let before = sessions
            .get(&(group.to_owned(), session.to_owned()))
            .map(|bound| bound.account);
        hold(&mut sessions, (group.to_owned(), session.to_owned()), id);
        Ok(before)
    }

    async fn sticky_touch(&self, _: &str, _: &str, _: u64) -> Result<(), StateError> {
        // The selector keeps the binding alive: the relay writes it through on success.
        Ok(())
    }

    async fn sticky_drop(&self, group: &str, session: &str) -> Result<bool, StateError> {
        let mut sessions = self.0.sessions.lock().unwrap_or_else(|p| p.into_inner());
        Ok(sessions
            .remove(&(group.to_owned(), session.to_owned()))
            .is_some())
    }

    async fn response_get(&self, response_id: &str) -> Result<Option<AccountId>, StateError> {
        Ok(self.0.response(response_id))
    }

    async fn response_set(
        &self,
        response_id: &str,
        id: AccountId,
        _: u64,
    ) -> Result<(), StateError> {
        self.0.learn_response(response_id, id);
        Ok(())
    }
}

#[async_trait]
impl Locks for ViewHealth {
    async fn lock_confirm(&self, _: AccountId, _: &str, _: u64) -> Result<bool, StateError> {
        // Never taken at the edge: the selector's timer starts half-open checks.
        Ok(false)
    }

    async fn unlock_confirm(&self, _: AccountId, _: &str) -> Result<(), StateError> {
        Ok(())
    }

    async fn linger_confirm(&self, _: AccountId, _: &str, _: u64) -> Result<(), StateError> {
        Ok(())
    }

    async fn confirm_state(&self, _: AccountId) -> Result<Option<String>, StateError> {
        Ok(None)
    }

    async fn swap_confirm(
        &self,
        _: AccountId,
        _: &str,
        _: &str,
        _: u64,
    ) -> Result<bool, StateError> {
        Ok(false)
    }

    async fn lock_refresh(&self, _: AccountId, _: &str, _: u64) -> Result<bool, StateError> {
        Ok(false)
    }

    async fn unlock_refresh(&self, _: AccountId, _: &str) -> Result<(), StateError> {
        Ok(())
    }

    async fn lock_usage_read(&self, _: AccountId, _: &str, _: u64) -> Result<bool, StateError> {
        Ok(false)
    }
}

/// The engine's config source and probe leases at the edge: the view is the config, and every
/// write or probe is the selector's.
struct ReadOnly;

#[async_trait]
impl AccountSource for ReadOnly {
    async fn load_snapshot(&self) -> Result<Snapshot, StoreError> {
        Err(StoreError::Unavailable(READ_ONLY.into()))
    }

    async fn load_account(&self, id: AccountId) -> Result<Account, StoreError> {
        Err(StoreError::NotFound(format!("account {id} (at the edge)")))
    }

    async fn set_status(&self, _: AccountId, _: AccountStatus, _: &str) -> Result<(), StoreError> {
        Err(StoreError::Unavailable(READ_ONLY.into()))
    }

    async fn store_tokens(
        &self,
        _: AccountId,
        _: &Secret,
        _: &Secret,
        _: i64,
    ) -> Result<(), StoreError> {
        Err(StoreError::Unavailable(READ_ONLY.into()))
    }

    async fn insert_usage(&self, _: &[UsageInput]) -> Result<u64, StoreError> {
        Err(StoreError::Unavailable(READ_ONLY.into()))
    }

    async fn read_usage(&self, _: i64, _: i64, _: i64) -> Result<UsageTotals, StoreError> {
        Err(StoreError::Unavailable(READ_ONLY.into()))
    }

    async fn read_model_usage(
        &self,
        _: i64,
        _: i64,
        _: i64,
    ) -> Result<Vec<ModelUsage>, StoreError> {
        Err(StoreError::Unavailable(READ_ONLY.into()))
    }
}

#[async_trait]
impl ProbeLeases for ReadOnly {
    async fn acquire_probe(
        &self,
        _: &LeaseTerms,
        _: Duration,
    ) -> Result<Option<LeaseId>, StateError> {
        Err(read_only())
    }

    async fn release_probe(&self, _: &LeaseId, _: &LeaseTerms) {}
}
