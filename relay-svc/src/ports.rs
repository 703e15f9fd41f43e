//! What the relay holds of the two engines: the selection API and the lease API
//! (`poolgate_select::api::SelectionApi`, `poolgate_lease::api::LeaseApi`), implemented by the
//! engines in this process (standalone) or by their gRPC clients (`poolgate-client`); the relay
//! does not know which. Here only what is the relay's own: which of a key's limits refused a
//! request, and the linger before a dropped lease is released.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::api::ApiError;
use poolgate_core::lease::{DenyReason, LeaseTerms};

pub use poolgate_core::caller::{Caller, KeyCheck, KeyRefused, RefusedFor};
pub use poolgate_core::plan::PlannedAccount;
pub use poolgate_lease::api::{Acquired, Lease, LeaseApi};
pub use poolgate_select::api::{Plan, PlanRequest, SelectionApi, UsageRecord};

/// The two APIs a relay runs on.
pub type Backends = (Arc<dyn SelectionApi>, Arc<dyn LeaseApi>);

/// A key's own admission limit that refused its request (docs/DESIGN.md §4, "Client key
/// limits"): about the key, not the account, so the request neither fails over nor blocks
/// anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLimit {
    /// Requests in flight at once (after waiting like for an account).
    Concurrency,
    /// Tokens over the rolling minute.
    Tpm,
    /// A spend budget (total, day, week, month) used up.
    Budget,
}

impl KeyLimit {
    /// The label of `relay_key_refusals_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyLimit::Concurrency => "concurrency",
            KeyLimit::Tpm => "tpm",
            KeyLimit::Budget => "budget",
        }
    }

    /// The key limit an admission denial names; `None` for the account's own gates.
    pub fn of(reason: DenyReason) -> Option<KeyLimit> {
        match reason {
            DenyReason::KeyConcurrency => Some(KeyLimit::Concurrency),
            DenyReason::KeyTpm => Some(KeyLimit::Tpm),
            DenyReason::KeyBudget => Some(KeyLimit::Budget),
            DenyReason::Concurrency
            | DenyReason::Rpm
            | DenyReason::UserRpm
            | DenyReason::SessionWindow
            | DenyReason::Cooling
            | DenyReason::QueueFull
            | DenyReason::BackendUnavailable
            | DenyReason::LeaseUnknown => None,
        }
    }
}

/// Leases whose holder went away (the client disconnected, the request future was dropped)
/// are released after `linger` instead of at once: the upstream call was cancelled by closing
/// its connection, and the upstream counts the request until it notices, which it does at its
/// next write. Reusing the slot before then would put one request too many on the account.
pub struct Lingering {
    inner: Arc<dyn LeaseApi>,
    linger: Duration,
}

impl Lingering {
    pub fn new(inner: Arc<dyn LeaseApi>, linger: Duration) -> Self {
        Lingering { inner, linger }
    }
}

#[async_trait]
impl LeaseApi for Lingering {
    async fn acquire(&self, terms: LeaseTerms, wait: Duration) -> Result<Acquired, ApiError> {
        Ok(match self.inner.acquire(terms, wait).await? {
            Acquired::Granted(lease) => Acquired::Granted(Box::new(LingeringLease {
                inner: Some(lease),
                linger: self.linger,
            })),
            denied => denied,
        })
    }
}

struct LingeringLease {
    inner: Option<Box<dyn Lease>>,
    linger: Duration,
}

#[async_trait]
impl Lease for LingeringLease {
    async fn attempt(&mut self) -> bool {
        match self.inner.as_mut() {
            Some(lease) => lease.attempt().await,
            None => false,
        }
    }

    async fn release(mut self: Box<Self>, spend_usd: f64, tokens: u64) {
        if let Some(lease) = self.inner.take() {
            lease.release(spend_usd, tokens).await;
        }
    }

    fn lost(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.inner.as_ref().and_then(|lease| lease.lost())
    }
}

impl Drop for LingeringLease {
    fn drop(&mut self) {
        let Some(lease) = self.inner.take() else {
            return;
        };
        let linger = self.linger;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(linger).await;
                    lease.release(0.0, 0).await;
                });
            }
            // No runtime (the process is ending): the inner lease's own drop releases it.
            Err(_) => drop(lease),
        }
    }
}
