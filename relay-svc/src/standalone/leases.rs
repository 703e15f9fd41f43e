//! Admission in this process: the lease engine on its memory backend, built by its one
//! constructor (`poolgate_lease::in_memory`); a lease renews itself and is released when dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::lease::{LeaseId, LeaseTerms, Settings};
use poolgate_core::money::usd_to_micros;
use poolgate_lease::{AcquireOutcome, LeaseEngine};
use tokio_util::sync::CancellationToken;

use crate::ports::{Acquired, BackendError, Lease, Leases};

/// Admission in this process: the engine on its memory backend.
pub struct LocalLeases {
    admission: Arc<LeaseEngine>,
}

impl LocalLeases {
    pub fn new(admission: Arc<LeaseEngine>) -> Self {
        LocalLeases { admission }
    }

    /// The lease engine on its memory backend, with its release-retry task, its metrics in
    /// `registry`, running on `clock`.
    pub fn engine(
        settings: Settings,
        registry: &prometheus::Registry,
        clock: poolgate_core::Clock,
    ) -> Arc<LeaseEngine> {
        poolgate_lease::in_memory(
            settings,
            poolgate_lease::metrics::Metrics::registered_in(registry.clone()),
            clock,
        )
    }
}

#[async_trait]
impl Leases for LocalLeases {
    async fn acquire(&self, terms: LeaseTerms, wait: Duration) -> Result<Acquired, BackendError> {
        let cancel = CancellationToken::new();
        let outcome = self
            .admission
            .acquire(&terms, wait, &cancel, |_| {})
            .await
            .map_err(BackendError::Storage)?;
        match outcome {
            AcquireOutcome::Granted(lease_id) => {
                let renewer = tokio::spawn(renew(
                    self.admission.clone(),
                    lease_id.clone(),
                    terms.clone(),
                ));
                Ok(Acquired::Granted(Box::new(LocalLease {
                    admission: self.admission.clone(),
                    lease_id,
                    terms,
                    attempts: AtomicU32::new(0),
                    renewer,
                    released: false,
                })))
            }
            AcquireOutcome::Denied(denial) => Ok(Acquired::Denied(denial)),
            AcquireOutcome::Cancelled => Err(BackendError::NoAnswer("the acquire was cancelled")),
        }
    }
}

async fn renew(admission: Arc<LeaseEngine>, lease_id: LeaseId, terms: LeaseTerms) {
    let every = admission.settings().lease_ttl / 3;
    loop {
        tokio::time::sleep(every).await;
        let _ = admission.renew(&lease_id, &terms).await;
    }
}

struct LocalLease {
    admission: Arc<LeaseEngine>,
    lease_id: LeaseId,
    terms: LeaseTerms,
    attempts: AtomicU32,
    renewer: tokio::task::JoinHandle<()>,
    released: bool,
}

#[async_trait]
impl Lease for LocalLease {
    async fn attempt(&mut self) -> bool {
        let n = self.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        matches!(
            self.admission.attempt(&self.lease_id, &self.terms, n).await,
            Ok(None)
        )
    }

    async fn release(mut self: Box<Self>, spend_usd: f64, tokens: u64) {
        self.released = true;
        self.renewer.abort();
        let micros = usd_to_micros(spend_usd).unwrap_or(0);
        // A keyed lease charges its key's budgets and TPM here, once (docs/DESIGN.md §4).
        self.admission
            .release_with(&self.lease_id, Some(&self.terms), micros, tokens)
            .await;
    }
}

impl Drop for LocalLease {
    fn drop(&mut self) {
        self.renewer.abort();
        if !self.released {
            let (admission, lease_id, terms) = (
                self.admission.clone(),
                self.lease_id.clone(),
                self.terms.clone(),
            );
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    admission.release(&lease_id, Some(&terms), 0).await;
                });
            }
        }
    }
}
