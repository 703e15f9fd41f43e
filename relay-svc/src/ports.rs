//! What the relay needs from the selector and from admission, as two small traits. Each has a
//! gRPC-client implementation (`remote.rs`: many replicas) and an in-process one
//! (`standalone.rs`: one process, memory backends, a YAML account file).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::account::{Platform, Secret};
use poolgate_core::classify::Classified;
use poolgate_core::keys::{KeyAccess, KeyDescription, KeyRefusal};
use poolgate_core::lease::{Denial, DenyReason, KeyLimits, LeaseTerms};
use poolgate_core::windows::WindowReading;
use poolgate_proto::convert::ConvertError;

/// A backend that did not answer usefully. The relay degrades (or answers 503), never panics;
/// the variant keeps what a caller may act on (the gRPC code decides whether another replica is
/// worth a try).
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// The backend answered with a gRPC error.
    #[error("{code:?}: {message}")]
    Status { code: tonic::Code, message: String },
    /// The backend's answer holds a value this relay cannot read (an unknown enum value): an
    /// error of that backend, never a guess at what it meant.
    #[error("unreadable answer: {0}")]
    Convert(#[from] ConvertError),
    /// The in-process engine's storage failed (standalone mode).
    #[error(transparent)]
    Storage(#[from] poolgate_runtime::error::StateError),
    /// The in-process selection engine refused or failed (standalone mode).
    #[error(transparent)]
    Selection(#[from] poolgate_select::engine::SelectorError),
    /// The call ended without an answer.
    #[error("no answer: {0}")]
    NoAnswer(&'static str),
}

impl From<tonic::Status> for BackendError {
    fn from(status: tonic::Status) -> Self {
        BackendError::Status {
            code: status.code(),
            message: status.message().to_owned(),
        }
    }
}

/// The authenticated client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub api_key_id: i64,
    pub user: String,
    pub group: String,
    pub user_rpm_limit: i32,
    /// What the key may reach (docs/DESIGN.md §6, "What a client key reaches"): every request
    /// is checked against it with the relay's clock before any account is asked.
    pub access: KeyAccess,
    /// What admission counts for the key (docs/DESIGN.md §4, "Client key limits"): its leases
    /// carry them when any is set (`KeyLimits::any`). `api_key_id` is the key's.
    pub limits: KeyLimits,
}

impl Caller {
    /// The key's limits for a lease's terms: `None` when the key has none (its leases are the
    /// ones they were before key limits existed).
    pub fn key_limits(&self) -> Option<KeyLimits> {
        self.limits.any().then(|| KeyLimits {
            api_key_id: self.api_key_id,
            ..self.limits.clone()
        })
    }
}

/// The selector's answer for a client key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyCheck {
    /// A key that may be used (its model and endpoint lists are checked per request).
    Known(Caller),
    /// A key that exists but is refused as a whole: disabled, or expired.
    Refused(KeyRefused),
    /// Unknown or revoked.
    Unknown,
}

impl KeyCheck {
    /// The caller of a key that may be used.
    pub fn caller(self) -> Option<Caller> {
        match self {
            KeyCheck::Known(caller) => Some(caller),
            KeyCheck::Refused(_) | KeyCheck::Unknown => None,
        }
    }
}

/// A key's request refused before any account is asked: why (which decides the status, the
/// error type and the metric label) and the words the client reads, which name the reason and
/// never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRefused {
    pub reason: RefusedFor,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefusedFor {
    Disabled,
    Expired,
    Endpoint,
    /// The model the client asked for.
    Model(String),
}

impl RefusedFor {
    /// The label of `relay_key_refusals_total` (bounded: never the model or the key).
    pub fn as_str(&self) -> &'static str {
        match self {
            RefusedFor::Disabled => "disabled",
            RefusedFor::Expired => "expired",
            RefusedFor::Endpoint => "endpoint",
            RefusedFor::Model(_) => "model",
        }
    }
}

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

impl From<KeyRefusal> for KeyRefused {
    fn from(refusal: KeyRefusal) -> Self {
        let message = refusal.message();
        let reason = match refusal {
            KeyRefusal::Disabled => RefusedFor::Disabled,
            KeyRefusal::Expired { .. } => RefusedFor::Expired,
            KeyRefusal::EndpointNotAllowed(_) => RefusedFor::Endpoint,
            KeyRefusal::ModelNotAllowed(model) => RefusedFor::Model(model),
        };
        KeyRefused { reason, message }
    }
}

#[derive(Debug, Clone)]
pub struct PlanRequest {
    /// The caller's key: session and response bindings are the key's own.
    pub api_key_id: i64,
    pub group: String,
    pub platform: Platform,
    pub model: String,
    pub session_hash: Option<String>,
    pub previous_response_id: Option<String>,
    pub exclude: Vec<i64>,
}

// The plan, what a report applied and a usage record are selection's own types, one each.
pub use poolgate_core::plan::{Plan, PlannedAccount, UsageRecord};

#[async_trait]
pub trait Selection: Send + Sync + 'static {
    /// Checks a client key: a caller, a key refused as a whole (disabled, expired: the
    /// selector's clock in distributed mode, the relay's in standalone), or unknown.
    async fn check_key(&self, api_key: &str) -> Result<KeyCheck, BackendError>;
    /// The caller of a key that may be used; `Ok(None)`: the key is unknown, revoked or refused.
    async fn authenticate(&self, api_key: &str) -> Result<Option<Caller>, BackendError> {
        Ok(self.check_key(api_key).await?.caller())
    }
    /// The key as its holder may see it (the self-service view): its record and its usage per
    /// period. A disabled or expired key is described too (its holder learns why it is
    /// refused); `Ok(None)`: unknown or revoked.
    async fn describe_key(&self, api_key: &str) -> Result<Option<KeyDescription>, BackendError>;
    async fn select(&self, request: &PlanRequest) -> Result<Plan, BackendError>;
    /// Reports a real upstream outcome (never a local refusal). Best effort.
    async fn report(&self, account_id: i64, outcome: Classified, status: u16, reason: &str);
    /// Reports an upstream's refusal of `refused`, the credential the request used (only its
    /// fingerprint leaves the relay). Nothing counts until the selector's probe bears it out.
    /// `Some(token)`: the account's stored OAuth token is another one now (refreshed for this
    /// refusal or before it): retry on the same account with it.
    async fn report_refused(
        &self,
        account_id: i64,
        outcome: Classified,
        status: u16,
        reason: &str,
        refused: &Secret,
    ) -> Option<Secret> {
        let _ = refused;
        self.report(account_id, outcome, status, reason).await;
        None
    }
    /// Binds the session of client key `api_key_id` (sessions are the key's own: see
    /// `session::binding_key`).
    async fn bind_session(&self, group: &str, api_key_id: i64, session_hash: &str, account_id: i64);
    /// Binds a response id for the client key it was made for: only that key continues it.
    async fn bind_response(&self, api_key_id: i64, response_id: &str, account_id: i64);
    /// Queues usage records; they are written in batches.
    fn record_usage(&self, record: UsageRecord);
    /// Records where the account stands in its usage windows, as an upstream answer reported
    /// (docs/DESIGN.md §5). Fire and forget, off the latency path: never awaited by a request,
    /// and a reading lost on the way is reported again by the account's next answer.
    fn record_windows(&self, account_id: i64, readings: Vec<WindowReading>);

    /// Models the group's accounts of `platform` name (allow-lists and mapping keys), for
    /// `/v1/models`. Empty when unknown.
    async fn models(&self, _group: &str, _platform: Platform) -> Vec<String> {
        Vec::new()
    }
}

/// The two backends a relay runs on.
pub type Backends = (std::sync::Arc<dyn Selection>, std::sync::Arc<dyn Leases>);

/// The answer to an acquire.
pub enum Acquired {
    Granted(Box<dyn Lease>),
    Denied(Denial),
}

#[async_trait]
pub trait Leases: Send + Sync + 'static {
    async fn acquire(&self, terms: LeaseTerms, wait: Duration) -> Result<Acquired, BackendError>;
}

/// A held lease. Dropping it without `release` releases it (after the relay's cancel linger:
/// see [`Lingering`]).
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

/// Leases whose holder went away (the client disconnected, the request future was dropped)
/// are released after `linger` instead of at once: the upstream call was cancelled by closing
/// its connection, and the upstream counts the request until it notices, which it does at its
/// next write. Reusing the slot before then would put one request too many on the account.
pub struct Lingering {
    inner: Arc<dyn Leases>,
    linger: Duration,
}

impl Lingering {
    pub fn new(inner: Arc<dyn Leases>, linger: Duration) -> Self {
        Lingering { inner, linger }
    }
}

#[async_trait]
impl Leases for Lingering {
    async fn acquire(&self, terms: LeaseTerms, wait: Duration) -> Result<Acquired, BackendError> {
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
