//! The lease engine behind the ports of `poolgate_runtime::ports`, which the selection engine
//! uses for its probe's leases and for hard blocks that are admission's cooldown.

use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::AccountId;
use poolgate_core::keys::{UsagePeriod, period_start};
use poolgate_core::lease::{LeaseId, LeaseTerms};
use poolgate_core::status::AdmissionReport;
use poolgate_runtime::error::StateError;
use poolgate_runtime::ports::{
    BudgetCalendar, BudgetCounters, BudgetPeriod, BudgetPeriods, Cooldowns, ProbeLeases,
};
use tokio_util::sync::CancellationToken;

use crate::calendar::{Calendar, Period, TOTAL_PERIOD};
use crate::engine::{AcquireOutcome, LeaseEngine};

#[async_trait]
impl ProbeLeases for LeaseEngine {
    async fn acquire_probe(
        &self,
        terms: &LeaseTerms,
        wait: Duration,
    ) -> Result<Option<LeaseId>, StateError> {
        let cancel = CancellationToken::new();
        match self.acquire(terms, wait, &cancel, |_| {}).await? {
            AcquireOutcome::Granted(lease_id) => Ok(Some(lease_id)),
            AcquireOutcome::Denied(_) | AcquireOutcome::Cancelled => Ok(None),
        }
    }

    async fn release_probe(&self, lease_id: &LeaseId, terms: &LeaseTerms) {
        self.release(lease_id, Some(terms), 0).await;
    }

    async fn admission_status(&self) -> AdmissionReport {
        LeaseEngine::admission_status(self).await
    }

    async fn account_usage(
        &self,
        account_ids: &[AccountId],
    ) -> Result<Vec<(u32, i64)>, StateError> {
        LeaseEngine::usage(self, account_ids).await
    }
}

#[async_trait]
impl Cooldowns for LeaseEngine {
    async fn set_cooldown(
        &self,
        account_id: AccountId,
        duration: Duration,
    ) -> Result<(), StateError> {
        LeaseEngine::set_cooldown(self, account_id, duration).await
    }

    async fn clear_cooldown(&self, account_id: AccountId) -> Result<(), StateError> {
        LeaseEngine::clear_cooldown(self, account_id).await
    }

    async fn inflight(&self, account_ids: &[AccountId]) -> Result<Vec<u32>, StateError> {
        LeaseEngine::inflight(self, account_ids).await
    }
}

/// The budget calendar as the selection engine reads it (its usage periods are the ones this
/// engine counts budgets in).
impl BudgetCalendar for Calendar {
    fn period_at(&self, period: UsagePeriod, instant_ms: i64) -> (String, i64) {
        let periods = self.periods(instant_ms);
        let at = match period {
            UsagePeriod::Day => periods.day,
            UsagePeriod::Week => periods.week,
            UsagePeriod::Month => periods.month,
            UsagePeriod::Total => return (TOTAL_PERIOD.to_owned(), i64::MAX),
        };
        (at.id, at.ends_ms)
    }
}

/// The engine's budget counters as the ledger's rebuild uses them: the current periods from
/// its clock and calendar, and the seed.
#[async_trait]
impl BudgetCounters for LeaseEngine {
    async fn budget_periods(&self) -> Result<BudgetPeriods, StateError> {
        let now = LeaseEngine::budget_periods(self).await?;
        let calendar = self.calendar();
        let period = |current: Period, kind: UsagePeriod| BudgetPeriod {
            start_ms: period_start(current.ends_ms, |instant| calendar.period_at(kind, instant)),
            id: current.id,
            ends_ms: current.ends_ms,
        };
        Ok(BudgetPeriods {
            total_id: TOTAL_PERIOD.to_owned(),
            day: period(now.day, UsagePeriod::Day),
            week: period(now.week, UsagePeriod::Week),
            month: period(now.month, UsagePeriod::Month),
        })
    }

    async fn seed_budget(
        &self,
        api_key_id: i64,
        period_id: &str,
        micros: i64,
    ) -> Result<bool, StateError> {
        LeaseEngine::seed_budget(self, api_key_id, period_id, micros).await
    }
}
