//! Freeing leases: a release (with the request's spend and tokens), the queue of releases the
//! backend could not take and their retries, and a lease orphaned by a stream that ended
//! without its release.

use poolgate_core::lease::{LeaseId, LeaseTerms};
use poolgate_core::millis;

use super::{LeaseEngine, untracked};
use crate::backend::KeyCharge;

/// A release the backend did not take; retried in the background so no slot stays until ttl.
pub(super) struct PendingRelease {
    lease_id: LeaseId,
    spend_micros: i64,
    key: Option<KeyCharge>,
}

impl LeaseEngine {
    /// Frees a lease (recording spend when the terms keep a window, or, without terms (the
    /// unary `Release`), whenever it is given). A release the backend cannot take now is queued
    /// and retried; the holder is done either way.
    pub async fn release(
        &self,
        lease_id: &LeaseId,
        terms: Option<&LeaseTerms>,
        spend_micros: i64,
    ) -> bool {
        self.release_with(lease_id, terms, spend_micros, 0).await
    }

    /// `release`, with the request's tokens (input + output as the upstream reported them,
    /// cache reads and writes as input): a keyed lease charges its key's TPM with them, and its
    /// budgets with the spend, once per lease.
    pub async fn release_with(
        &self,
        lease_id: &LeaseId,
        terms: Option<&LeaseTerms>,
        spend_micros: i64,
        tokens: u64,
    ) -> bool {
        if terms.is_some_and(untracked) {
            return true;
        }
        let key = match lease_id.api_key_id() {
            Some(_) => Some(self.key_charge(spend_micros, tokens).await),
            None => None,
        };
        let spend_micros = match terms {
            Some(terms) if terms.session_window_limit_micros <= 0 => 0,
            _ => spend_micros.max(0),
        };
        let session_window_ms = millis(self.settings.session_window);
        match self
            .backend
            .release_charged(
                lease_id,
                spend_micros,
                session_window_ms,
                self.fence_ms(),
                key.as_ref(),
            )
            .await
        {
            Ok(removed) => {
                self.wake_for(lease_id);
                removed
            }
            Err(error) => {
                tracing::warn!(%error, lease_id = %lease_id, "release failed; queued for retry");
                self.metrics.release_retries.inc();
                let mut pending = self
                    .pending_releases
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                pending.push(PendingRelease {
                    lease_id: lease_id.clone(),
                    spend_micros,
                    key,
                });
                false
            }
        }
    }

    /// Retries releases that failed; returns how many are still pending.
    pub async fn retry_pending_releases(&self) -> usize {
        let batch: Vec<PendingRelease> = {
            let mut pending = self
                .pending_releases
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut *pending)
        };
        let session_window_ms = millis(self.settings.session_window);
        let mut failed = Vec::new();
        for release in batch {
            match self
                .backend
                .release_charged(
                    &release.lease_id,
                    release.spend_micros,
                    session_window_ms,
                    self.fence_ms(),
                    release.key.as_ref(),
                )
                .await
            {
                Ok(_) => self.wake_for(&release.lease_id),
                Err(_) => failed.push(release),
            }
        }
        let mut pending = self
            .pending_releases
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        pending.extend(failed);
        pending.len()
    }

    /// The stream that held the lease ended without `Release`: leave the lease resumable for
    /// the orphan grace, then Redis reaps it.
    pub async fn orphan(&self, lease_id: &LeaseId, terms: &LeaseTerms, holder_epoch: u64) {
        if untracked(terms) {
            return;
        }
        self.metrics.orphaned.inc();
        if let Err(error) = self
            .backend
            .orphan(
                lease_id,
                millis(self.settings.orphan_grace),
                holder_epoch,
                self.fence_ms(),
            )
            .await
        {
            tracing::warn!(%error, lease_id = %lease_id, "orphan failed; the lease expires at its ttl");
        }
    }

    /// The holder was told `Lost`: the lease is no longer this replica's (the failure policy
    /// must not adopt it at the next outage).
    pub fn forget_held(&self, lease_id: &LeaseId) {
        if let Some(policy) = &self.policy {
            policy.forget_held(lease_id);
        }
    }
}
