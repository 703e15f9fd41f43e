//! The leases this replica's streams hold, wherever they were granted: the fallback adopts them
//! when Redis goes away, and the `divided` transition counts them.

use std::time::Instant;

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
            .map(|(lease, held)| (lease.clone(), held.ttl_ms))
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
    pub(super) async fn hold(&self, lease_id: &LeaseId, ttl_ms: u64, key_limit: i32) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(lease_id.clone(), Held::new(ttl_ms, key_limit));
        if self.is_degraded() {
            let _ = self.fallback.renew(lease_id, ttl_ms, Some(0), 0).await;
        }
    }

    /// A lease this replica holds was renewed (its holder is alive).
    pub(super) fn renewed(&self, lease_id: &LeaseId) {
        if let Some(held) = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(lease_id)
        {
            held.renewed_at = Instant::now();
        }
    }

    /// After Redis lost state (this replica found a marker or its registry entry gone): puts
    /// back every lease this replica holds whose holder renewed it within its ttl (for what is left
    /// of it), where its
    /// account recounts (`RedisBackend::restore_held`), so the recount ends with every running
    /// request counted. Entries not renewed for two ttls are dropped (a holder that vanished
    /// without a release). Returns how many leases Redis holds after the pass.
    pub(super) async fn restore_held_leases(&self) -> usize {
        let now = Instant::now();
        let held: Vec<(LeaseId, u64, i32)> = {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.retain(|_, lease| now.duration_since(lease.renewed_at) < 2 * lease.ttl());
            // Put back for what is left of its ttl since its holder's last renewal, as if Redis
            // had kept it.
            held.iter()
                .filter_map(|(id, lease)| {
                    let left = lease
                        .ttl()
                        .checked_sub(now.duration_since(lease.renewed_at))?;
                    let left_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
                    (left_ms > 0).then(|| (id.clone(), left_ms, lease.key_limit))
                })
                .collect()
        };
        let mut kept = 0;
        for (lease_id, ttl_ms, key_limit) in &held {
            match self.redis.restore_held(lease_id, *ttl_ms, *key_limit).await {
                Ok(true) => kept += 1,
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%error, lease_id = %lease_id, "a held lease was not put back; its holder's next heartbeat tries again");
                }
            }
        }
        tracing::info!(
            held = held.len(),
            in_redis = kept,
            "Redis lost state: the leases this replica holds were put back"
        );
        kept
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

/// A lease this replica holds: its ttl, its key's limit, and when its holder last renewed it.
pub(super) struct Held {
    pub(super) ttl_ms: u64,
    /// Its client key's concurrency limit when it was granted (0: none or no key).
    key_limit: i32,
    renewed_at: Instant,
}

impl Held {
    fn new(ttl_ms: u64, key_limit: i32) -> Self {
        Held {
            ttl_ms,
            key_limit,
            renewed_at: Instant::now(),
        }
    }

    fn ttl(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ttl_ms)
    }
}
