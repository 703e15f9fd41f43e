//! Budgets that survive a Redis flush (docs/DESIGN.md §4, "Client key limits"): admission's
//! budget counters live in Redis, the spend they count in the usage ledger (Postgres). The
//! selector, which has both, rebuilds every counter Redis has lost from the ledger, at start and
//! every [`REBUILD_EVERY`], through the lease engine it already keeps for its probe (the same
//! scripts, the same Redis); the engine only sets absent counters, so nothing is counted twice.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use poolgate_lease::LeaseEngine;
use poolgate_lease::calendar::{Calendar, Period, Periods, TOTAL_PERIOD};
use poolgate_runtime::error::BackendError;
use poolgate_select::source::budgets::{BudgetCounters, BudgetPeriod, BudgetPeriods, period_start};

/// How often lost counters are looked for (and once at start). A charge that lands on a lost
/// counter before the rebuild recreates it, and the rebuild then leaves it: the spend before
/// the flush is forgotten for that period. A short interval keeps that window small.
pub const REBUILD_EVERY: Duration = Duration::from_secs(30);

/// A lease engine's budget counters with the calendar it counts by (built from the same
/// settings, so the periods' starts are the engine's).
pub struct LeaseBudgets {
    engine: Arc<LeaseEngine>,
    calendar: Calendar,
}

impl LeaseBudgets {
    pub fn new(
        engine: Arc<LeaseEngine>,
        settings: &poolgate_core::lease::Settings,
    ) -> Result<Self, String> {
        let calendar = Calendar::new(&settings.budget_time_zone, settings.budget_week_start)?;
        Ok(LeaseBudgets { engine, calendar })
    }
}

#[async_trait]
impl BudgetCounters for LeaseBudgets {
    async fn budget_periods(&self) -> Result<BudgetPeriods, BackendError> {
        let now = self.engine.budget_periods().await?;
        let period = |current: Period, pick: fn(Periods) -> Period| BudgetPeriod {
            start_ms: period_start(current.ends_ms, |instant| {
                let at = pick(self.calendar.periods(instant));
                (at.id, at.ends_ms)
            }),
            id: current.id,
            ends_ms: current.ends_ms,
        };
        Ok(BudgetPeriods {
            total_id: TOTAL_PERIOD.to_owned(),
            day: period(now.day, |p| p.day),
            week: period(now.week, |p| p.week),
            month: period(now.month, |p| p.month),
        })
    }

    async fn seed_budget(
        &self,
        api_key_id: i64,
        period_id: &str,
        micros: i64,
    ) -> Result<bool, BackendError> {
        self.engine.seed_budget(api_key_id, period_id, micros).await
    }
}
