//! The admission state behind one small trait, with a memory implementation (one process: the
//! embedded default and the Redis fallback) and a Redis implementation (many replicas). Both
//! keep the same semantics and run the same test suite.

use async_trait::async_trait;

use poolgate_core::AccountId;
use poolgate_core::lease::{Denial, LeaseId, LeaseTerms, Renewal, Resumption};
use poolgate_core::status::AdmissionReport;
use poolgate_runtime::error::StateError;

/// Everything admission keeps per account. Every method is one round trip on Redis.
///
/// Durations are passed per call (from [`crate::domain::Settings`]) so one backend serves
/// replicas configured alike without knowing the settings struct.
#[async_trait]
pub trait LeaseBackend: Send + Sync + 'static {
    /// Charges one event to the user's rolling-minute RPM. `None` = charged.
    async fn charge_user(
        &self,
        user_id: &str,
        rpm_limit: i32,
        event_id: &str,
        window_ms: u64,
    ) -> Result<Option<Denial>, StateError>;

    /// Removes a user RPM event again (the account refused the acquire it was charged for).
    /// Idempotent: removing an event that is not there does nothing.
    async fn refund_user(&self, user_id: &str, event_id: &str) -> Result<(), StateError>;

    /// Whether `acquire` checks and charges the user RPM in the same step as the account gates
    /// (one node, or one process). On a Redis Cluster the user's key lives in another slot, so
    /// the engine charges the user once per acquire (`charge_user`, idempotent by event id) and
    /// refunds when no lease came of it.
    fn joins_user_gate(&self) -> bool {
        true
    }

    /// Checks the user RPM (when `terms.user` is set), the client key's gates (`key`: budgets,
    /// TPM, concurrency), cooldown, concurrency, account RPM and the session window, and only if
    /// all pass adds the lease (to the account's and, for a keyed lease id, the key's slots) and
    /// the RPM events (account and user, both with the lease id as event id). `None` = granted.
    /// A refusal writes nothing (on a Redis Cluster the key's slot is charged first and refunded
    /// when the account refuses). Never called for untracked terms, and with `terms.user` only
    /// when [`Self::joins_user_gate`].
    async fn acquire_keyed(
        &self,
        terms: &LeaseTerms,
        lease_id: &LeaseId,
        limits: AcquireLimits,
        key: Option<&KeyGate>,
    ) -> Result<Option<Denial>, StateError>;

    /// `acquire_keyed` without key gates (a lease id without a key).
    async fn acquire(
        &self,
        terms: &LeaseTerms,
        lease_id: &LeaseId,
        limits: AcquireLimits,
    ) -> Result<Option<Denial>, StateError> {
        self.acquire_keyed(terms, lease_id, limits, None).await
    }

    /// Sets a live lease's expiry to now + ttl. A lease the backend no longer has is `Lost`
    /// (released while its release fence is up), or re-added when `restore_within` is
    /// `Some(limit)` and the account has room (fewer than `limit` live leases; <= 0: unlimited)
    /// and so has its key (fewer than `key_limit` live leases of the key, for a keyed lease id),
    /// or `Lost` (no room; expired when `restore_within` is `None`). The key's slot follows the
    /// account's.
    async fn renew(
        &self,
        lease_id: &LeaseId,
        ttl_ms: u64,
        restore_within: Option<i32>,
        key_limit: i32,
    ) -> Result<Renewal, StateError>;

    /// Like `renew`, but only for a lease that is still live, and the caller becomes its holder
    /// (a new holder epoch, also when the lease already was resumed: the last `Resume` holds it).
    /// A keyed lease's key slot is renewed with it (`key_limit` matters only where the key's slot
    /// lost the lease on its own: another Cluster node).
    async fn resume(
        &self,
        lease_id: &LeaseId,
        ttl_ms: u64,
        key_limit: i32,
    ) -> Result<Resumption, StateError>;

    /// Charges account RPM again for a same-account retry on a held lease. `None` = charged.
    async fn attempt(
        &self,
        lease_id: &LeaseId,
        rpm_limit: i32,
        event_id: &str,
        window_ms: u64,
    ) -> Result<Option<Denial>, StateError>;

    /// Removes the lease and adds `spend_micros` (if > 0) to the session window, in one step,
    /// and raises the lease's release fence for `fence_ms`: until it falls no renewal or resume
    /// brings the lease back. For a keyed lease id the same happens on the key's slot, and `key`
    /// charges the key's TPM and budgets once per lease (a retried or repeated release charges
    /// nothing more). Returns whether a live lease was removed.
    async fn release_charged(
        &self,
        lease_id: &LeaseId,
        spend_micros: i64,
        session_window_ms: u64,
        fence_ms: u64,
        key: Option<&KeyCharge>,
    ) -> Result<bool, StateError>;

    /// `release_charged` without a key charge.
    async fn release(
        &self,
        lease_id: &LeaseId,
        spend_micros: i64,
        session_window_ms: u64,
        fence_ms: u64,
    ) -> Result<bool, StateError> {
        self.release_charged(lease_id, spend_micros, session_window_ms, fence_ms, None)
            .await
    }

    /// Sets a client key's budget counter for `period_id` to `micros` only if the backend does
    /// not have it (lost in a flush or a restart): the hook through which the usage ledger
    /// rebuilds budgets. `expires_in_ms` 0: never (the total). Returns whether it was set.
    async fn seed_budget(
        &self,
        api_key_id: i64,
        period_id: &str,
        micros: i64,
        expires_in_ms: u64,
    ) -> Result<bool, StateError>;

    /// The time budgets' calendar periods are computed from: Redis time where the backend is
    /// Redis (from the offset learned from script replies), the backend's clock in memory.
    async fn wall_now_ms(&self) -> Result<i64, StateError>;

    /// Cuts a lease's expiry to now + grace (never lengthens it), only if `holder_epoch` is still
    /// the lease's holder (0: the stream that acquired it; a resume makes a new holder). So a
    /// stream whose end is noticed after its lease was resumed elsewhere does not cut it.
    /// Raises the release fence from the lease's new expiry for `fence_ms` (a `Resume` within
    /// the grace lowers it again), so the orphan reaper's release is fenced like the others.
    async fn orphan(
        &self,
        lease_id: &LeaseId,
        grace_ms: u64,
        holder_epoch: u64,
        fence_ms: u64,
    ) -> Result<(), StateError>;

    /// Live lease counts, in the order asked.
    async fn inflight(&self, account_ids: &[AccountId]) -> Result<Vec<u32>, StateError>;

    /// Live lease counts of client keys' slots (their keyed leases across every account), in
    /// the order asked.
    async fn key_inflight(&self, api_key_ids: &[i64]) -> Result<Vec<u32>, StateError>;

    /// What accounts used of their rate limits, in the order asked: (RPM events in the rolling
    /// `rpm_window_ms`, spend in the current session window of `session_window_ms`, micro-USD).
    /// For the operator's status view; 0 where nothing was counted.
    async fn usage(
        &self,
        account_ids: &[AccountId],
        rpm_window_ms: u64,
        session_window_ms: u64,
    ) -> Result<Vec<(u32, i64)>, StateError>;

    /// Admission's state as the operator's status view shows it (see
    /// `poolgate_runtime::ports::ProbeLeases::admission_status`).
    async fn admission_status(&self) -> AdmissionReport;

    /// Adds spend to the session window; returns the window's spend afterwards (micro-USD).
    async fn record_spend(
        &self,
        account_id: AccountId,
        spend_micros: i64,
        session_window_ms: u64,
    ) -> Result<i64, StateError>;

    /// Hard-blocks the account for `ttl_ms` (keeping a later existing deadline).
    async fn set_cooldown(&self, account_id: AccountId, ttl_ms: u64) -> Result<(), StateError>;

    /// Lifts the account's hard block, whatever its deadline (an operator cleared it, or the
    /// in-process selector lifted a block it set).
    async fn clear_cooldown(&self, account_id: AccountId) -> Result<(), StateError>;

    /// Registers a waiter, bounded by `max_waiting`. Returns its position, or `None` when the
    /// queue is full. The entry expires after `ttl_ms`.
    async fn register_waiter(
        &self,
        account_id: AccountId,
        waiter_id: &str,
        max_waiting: u32,
        ttl_ms: u64,
    ) -> Result<Option<u32>, StateError>;

    async fn remove_waiter(&self, account_id: AccountId, waiter_id: &str)
    -> Result<(), StateError>;
}

/// A client key's gates for one acquire, built by the engine from `LeaseTerms::key` and the
/// budget calendar (docs/DESIGN.md §4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyGate {
    pub api_key_id: i64,
    /// <= 0: unlimited.
    pub concurrency_limit: i32,
    /// <= 0: unlimited.
    pub tpm_limit: i64,
    pub tpm_window_ms: u64,
    /// Total, day, week and month, in that order.
    pub budgets: [Budget; 4],
}

/// One spend budget of a key: the period's counter, its limit, and when it resets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub period_id: String,
    /// <= 0: unlimited.
    pub limit_micros: i64,
    /// Until the period ends (the refusal's retry-after); 0 for the total, which never resets.
    pub resets_in_ms: u64,
}

/// What a finished request charges its key: tokens to the TPM, spend to every budget period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyCharge {
    pub tokens: u64,
    pub spend_micros: i64,
    pub tpm_window_ms: u64,
    /// Total, day, week and month: (period id, counter ttl in ms; 0 = never expires). The ttl
    /// lasts past the period's end.
    pub periods: [(String, u64); 4],
}

/// The per-acquire numbers derived from terms and settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireLimits {
    pub ttl_ms: u64,
    pub rpm_window_ms: u64,
    /// Refuse when the window's spend reached this (0: no window gate).
    pub window_limit_micros: i64,
    pub session_window_ms: u64,
}
