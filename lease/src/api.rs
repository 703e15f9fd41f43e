//! The lease API: what a relay asks of admission, in domain types. The engine implements it in
//! process ([`EngineLeases`]: the lease engine on any backend, a lease renewing itself and
//! released when dropped) and so does the gRPC client (`poolgate-client`'s `AdmissionClient`:
//! leases on lease channels or streams, heartbeats, resumes on another replica), so a caller
//! holds an `Arc<dyn LeaseApi>` and does not know which is behind it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::api::ApiError;
use poolgate_core::lease::{Denial, LeaseId, LeaseTerms};
use poolgate_core::money::usd_to_micros;
use tokio_util::sync::CancellationToken;

use crate::{AcquireOutcome, LeaseEngine};

/// The answer to an acquire.
pub enum Acquired {
    Granted(Box<dyn Lease>),
    Denied(Denial),
}

#[async_trait]
pub trait LeaseApi: Send + Sync + 'static {
    /// A lease on `terms`, waiting at most `wait` for a slot; a denial names its reason.
    /// Dropping the future withdraws the acquire.
    async fn acquire(&self, terms: LeaseTerms, wait: Duration) -> Result<Acquired, ApiError>;
}

/// A held lease. Dropping it without `release` releases it.
#[async_trait]
pub trait Lease: Send + Sync {
    /// Charges account RPM for a same-account retry; `false` when refused (the lease is kept).
    async fn attempt(&mut self) -> bool;
    /// Frees the slot, recording the request's spend and its tokens (input + output as the
    /// upstream reported them, cache reads and writes as input): a keyed lease charges its key's
    /// budgets and TPM with them (docs/DESIGN.md §4).
    async fn release(self: Box<Self>, spend_usd: f64, tokens: u64);
    /// Turns `true` when admission said the lease is gone for good (released by someone else,
    /// no room to restore it, expired): a request that has not sent its first byte fails over.
    /// `None`: this lease cannot be lost that way.
    fn lost(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        None
    }
}

/// The lease engine's own implementation of [`LeaseApi`], in the caller's process.
pub struct EngineLeases {
    engine: Arc<LeaseEngine>,
}

impl EngineLeases {
    pub fn new(engine: Arc<LeaseEngine>) -> Self {
        EngineLeases { engine }
    }
}

#[async_trait]
impl LeaseApi for EngineLeases {
    async fn acquire(&self, terms: LeaseTerms, wait: Duration) -> Result<Acquired, ApiError> {
        let cancel = CancellationToken::new();
        let outcome = self
            .engine
            .acquire(&terms, wait, &cancel, |_| {})
            .await
            .map_err(|error| ApiError::Unavailable(error.to_string()))?;
        match outcome {
            AcquireOutcome::Granted(lease_id) => {
                let renewer =
                    tokio::spawn(renew(self.engine.clone(), lease_id.clone(), terms.clone()));
                Ok(Acquired::Granted(Box::new(EngineLease {
                    engine: self.engine.clone(),
                    lease_id,
                    terms,
                    attempts: AtomicU32::new(0),
                    renewer,
                    released: false,
                })))
            }
            AcquireOutcome::Denied(denial) => Ok(Acquired::Denied(denial)),
            AcquireOutcome::Cancelled => Err(ApiError::NoAnswer("the acquire was cancelled")),
        }
    }
}

/// Renews the lease every ttl/3 until its holder releases or drops it.
async fn renew(engine: Arc<LeaseEngine>, lease_id: LeaseId, terms: LeaseTerms) {
    let every = engine.settings().lease_ttl / 3;
    loop {
        tokio::time::sleep(every).await;
        let _ = engine.renew(&lease_id, &terms).await;
    }
}

struct EngineLease {
    engine: Arc<LeaseEngine>,
    lease_id: LeaseId,
    terms: LeaseTerms,
    attempts: AtomicU32,
    renewer: tokio::task::JoinHandle<()>,
    released: bool,
}

#[async_trait]
impl Lease for EngineLease {
    async fn attempt(&mut self) -> bool {
        let n = self.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        matches!(
            self.engine.attempt(&self.lease_id, &self.terms, n).await,
            Ok(None)
        )
    }

    async fn release(mut self: Box<Self>, spend_usd: f64, tokens: u64) {
        self.released = true;
        self.renewer.abort();
        let micros = usd_to_micros(spend_usd).unwrap_or(0);
        // A keyed lease charges its key's budgets and TPM here, once (docs/DESIGN.md §4).
        self.engine
            .release_with(&self.lease_id, Some(&self.terms), micros, tokens)
            .await;
    }
}

impl Drop for EngineLease {
    fn drop(&mut self) {
        self.renewer.abort();
        if !self.released {
            let (engine, lease_id, terms) = (
                self.engine.clone(),
                self.lease_id.clone(),
                self.terms.clone(),
            );
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    engine.release(&lease_id, Some(&terms), 0).await;
                });
            }
        }
    }
}
