//! The ports through which the selection engine reaches the lease engine: a lease for the
//! selector's own probe, and the hard block that is admission's cooldown. `poolgate-lease`
//! implements both for its engine; the composition roots (the selector's `server.rs`, the
//! relay's standalone mode) wire them, so neither engine depends on the other.

use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::AccountId;
use poolgate_core::keys::UsagePeriod;
use poolgate_core::lease::{LeaseId, LeaseTerms};
use poolgate_core::status::AdmissionReport;

use crate::error::StateError;

/// Leases for the selector's confirmation probe, counted against the account like the relays'
/// leases (so a probe never exceeds the account's concurrency).
#[async_trait]
pub trait ProbeLeases: Send + Sync {
    /// A lease on `terms.account_id` within `wait`; `Ok(None)`: no slot came free in time.
    async fn acquire_probe(
        &self,
        terms: &LeaseTerms,
        wait: Duration,
    ) -> Result<Option<LeaseId>, StateError>;

    /// Frees the probe's lease. A release the backend cannot take now is the lease engine's to
    /// retry; the caller is done either way.
    async fn release_probe(&self, lease_id: &LeaseId, terms: &LeaseTerms);

    /// Admission's state as the operator's status view shows it: the failure policy and whether
    /// admission serves degraded, from the replica registry on Redis (the in-process engine: its
    /// own). An implementation that cannot tell answers unknown.
    async fn admission_status(&self) -> AdmissionReport {
        AdmissionReport::unknown()
    }

    /// What accounts used of their rate limits, as admission counts them (the operator's status
    /// view), in the order asked: (requests admitted in the rolling RPM window, spend in the
    /// current session window in micro-USD). An implementation that does not keep them fails.
    async fn account_usage(
        &self,
        account_ids: &[AccountId],
    ) -> Result<Vec<(u32, i64)>, StateError> {
        let _ = account_ids;
        Err(StateError::Failed("account usage is not kept here".into()))
    }
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
    ) -> Result<(), StateError>;
    async fn clear_cooldown(&self, account_id: AccountId) -> Result<(), StateError>;
    /// Live leases per account, in the order of `account_ids`.
    async fn inflight(&self, account_ids: &[AccountId]) -> Result<Vec<u32>, StateError>;
}

// --- client keys' budgets (docs/DESIGN.md §4, "Client key limits") --------------------------

/// One calendar period of the deployment's budget calendar: the counter's id (as the lease
/// engine names it: `d:2026-12-02`) and the instants it spans, `[start_ms, ends_ms)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetPeriod {
    pub id: String,
    pub start_ms: i64,
    pub ends_ms: i64,
}

/// The periods containing the lease engine's now, and the id of the total's counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetPeriods {
    pub total_id: String,
    pub day: BudgetPeriod,
    pub week: BudgetPeriod,
    pub month: BudgetPeriod,
}

/// What the rebuild needs of admission's budget counters.
#[async_trait]
pub trait BudgetCounters: Send + Sync {
    /// The current periods, from the lease engine's clock and calendar (its time zone and week
    /// start), so the ledger is summed over exactly the periods admission counts.
    async fn budget_periods(&self) -> Result<BudgetPeriods, StateError>;

    /// Raises a key's counter for `period_id` to `micros` where it holds less (absent after a
    /// flush) and never lowers it; whether it was raised.
    async fn seed_budget(
        &self,
        api_key_id: i64,
        period_id: &str,
        micros: i64,
    ) -> Result<bool, StateError>;
}

/// The deployment's budget calendar as the selector engine reads it (its time zone and week
/// start, docs/DESIGN.md §4 "Client key limits"): the calendar period containing an instant.
/// Each composition root wires it to the calendar admission counts by
/// (`poolgate_lease::calendar::Calendar`, from `--budget-time-zone`/`--budget-week-start`), so
/// a key's usage per period is summed over exactly the periods its budgets are counted in.
pub trait BudgetCalendar: Send + Sync + std::fmt::Debug {
    /// The calendar's day, week or month (`period`; never asked for `Total`) containing
    /// `instant_ms`: its id and when it ends, ms since the epoch.
    fn period_at(&self, period: UsagePeriod, instant_ms: i64) -> (String, i64);
}
