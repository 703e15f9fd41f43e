//! The lease engine behind the ports of `poolgate_runtime::ports`, which the selection engine
//! uses for its probe's leases and for hard blocks that are admission's cooldown.

use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::AccountId;
use poolgate_core::lease::{LeaseId, LeaseTerms};
use poolgate_runtime::error::BackendError;
use poolgate_runtime::ports::{Cooldowns, ProbeLeases};
use tokio_util::sync::CancellationToken;

use crate::engine::{AcquireOutcome, LeaseEngine};

#[async_trait]
impl ProbeLeases for LeaseEngine {
    async fn acquire_probe(
        &self,
        terms: &LeaseTerms,
        wait: Duration,
    ) -> Result<Option<LeaseId>, BackendError> {
        let cancel = CancellationToken::new();
        match self.acquire(terms, wait, &cancel, |_| {}).await? {
            AcquireOutcome::Granted(lease_id) => Ok(Some(lease_id)),
            AcquireOutcome::Denied(_) | AcquireOutcome::Cancelled => Ok(None),
        }
    }

    async fn release_probe(&self, lease_id: &LeaseId, terms: &LeaseTerms) {
        self.release(lease_id, Some(terms), 0).await;
    }
}

#[async_trait]
impl Cooldowns for LeaseEngine {
    async fn set_cooldown(
        &self,
        account_id: AccountId,
        duration: Duration,
    ) -> Result<(), BackendError> {
        LeaseEngine::set_cooldown(self, account_id, duration).await
    }

    async fn clear_cooldown(&self, account_id: AccountId) -> Result<(), BackendError> {
        LeaseEngine::clear_cooldown(self, account_id).await
    }

    async fn inflight(&self, account_ids: &[AccountId]) -> Result<Vec<u32>, BackendError> {
        LeaseEngine::inflight(self, account_ids).await
    }
}
