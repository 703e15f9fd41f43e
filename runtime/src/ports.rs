//! The ports through which the selection engine reaches the lease engine: a lease for the
//! selector's own probe, and the hard block that is admission's cooldown. `poolgate-lease`
//! implements both for its engine; the composition roots (the selector's `server.rs`, the
//! relay's standalone mode) wire them, so neither engine depends on the other.

use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::AccountId;
use poolgate_core::lease::{LeaseId, LeaseTerms};

use crate::error::BackendError;

/// Leases for the selector's confirmation probe, counted against the account like the relays'
/// leases (so a probe never exceeds the account's concurrency).
#[async_trait]
pub trait ProbeLeases: Send + Sync {
    /// A lease on `terms.account_id` within `wait`; `Ok(None)`: no slot came free in time.
    async fn acquire_probe(
        &self,
        terms: &LeaseTerms,
        wait: Duration,
    ) -> Result<Option<LeaseId>, BackendError>;

    /// Frees the probe's lease. A release the backend cannot take now is the lease engine's to
    /// retry; the caller is done either way.
    async fn release_probe(&self, lease_id: &LeaseId, terms: &LeaseTerms);
}

/// The in-process health store's coupling to admission: a hard block is admission's cooldown
/// (so the lease engine refuses the account in the same step that takes a slot), and the load
/// selection reads is the lease engine's count of live leases.
#[async_trait]
pub trait Cooldowns: Send + Sync {
    async fn set_cooldown(
        &self,
        account_id: AccountId,
        duration: Duration,
    ) -> Result<(), BackendError>;
    async fn clear_cooldown(&self, account_id: AccountId) -> Result<(), BackendError>;
    /// Live leases per account, in the order of `account_ids`.
    async fn inflight(&self, account_ids: &[AccountId]) -> Result<Vec<u32>, BackendError>;
}
