//! The leases this replica's streams hold, wherever they were granted: the fallback adopts them
//! when Redis goes away, and the `divided` transition counts them.

use poolgate_core::AccountId;
use poolgate_core::lease::LeaseId;

use super::PolicyBackend;
use crate::backend::LeaseBackend;

impl PolicyBackend {
    /// Moves the leases this replica holds into the fallback (see `held`).
    pub(super) async fn adopt_held(&self) {
        let held: Vec<(LeaseId, u64)> = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(lease, ttl)| (lease.clone(), *ttl))
            .collect();
        for (lease, ttl_ms) in &held {
            // The memory backend cannot fail; a lease released meanwhile is removed again by
            // its release, which now runs on the fallback. Adopted whatever the limit: these
            // requests are already running.
            let _ = self.fallback.renew(lease, *ttl_ms, Some(0), 0).await;
        }
        if !held.is_empty() {
            tracing::info!(
                leases = held.len(),
                "leases held by this replica counted by the fallback"
            );
        }
    }

    /// Records a lease this replica now holds. Granted by Redis just as Redis went away (after
    /// the adoption read `held`), it is adopted here: either the adoption saw it, or this sees
    /// the degraded flag the adoption set first.
    pub(super) async fn hold(&self, lease_id: &LeaseId, ttl_ms: u64) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(lease_id.clone(), ttl_ms);
        if self.is_degraded() {
            let _ = self.fallback.renew(lease_id, ttl_ms, Some(0), 0).await;
        }
    }

    /// Forgets a lease this replica's stream held but lost (see `held`).
    pub fn forget_held(&self, lease_id: &LeaseId) {
        self.unhold(lease_id);
    }

    /// How many leases this replica's streams hold (for tests and debugging).
    pub fn held_count(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub(super) fn unhold(&self, lease_id: &LeaseId) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(lease_id);
    }

    /// Leases of `account_id` this replica's streams hold.
    pub(super) fn held_on(&self, account_id: AccountId) -> usize {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|lease| lease.account_id() == account_id)
            .count()
    }
}

impl PolicyBackend {
    /// Leases of client key `api_key_id` this replica's streams hold.
    pub(super) fn held_on_key(&self, api_key_id: i64) -> usize {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|lease| lease.api_key_id() == Some(api_key_id))
            .count()
    }
}
