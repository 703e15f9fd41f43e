//! The selection engine's background work, started in one place for both deployments and owned
//! by the engine: the token refresh loop, the pool's status gauges, the usage-endpoint reads,
//! the half-open breakers' checks, and the budget rebuild (once at start for a store nothing can flush, or every period for
//! admission's Redis counters). The tasks hold the engine weakly; the engine aborts them when it
//! is dropped (the last holder let it go) or at [`Selector::stop_tasks`] (shutdown).

use std::sync::Arc;
use std::time::Duration;

use super::{STATUS_GAUGES_EVERY, Selector};
use crate::refresh::{TokenRefresher, refresh_loop};
use crate::source::budgets::BudgetCounters;

/// How often the half-open breakers' checks are started (`view.rs`).
const HALF_OPEN_CHECKS_EVERY: Duration = Duration::from_secs(1);

/// How the budget counters are rebuilt from the usage ledger.
pub enum BudgetRebuild {
    /// Once, at start: the counters live in this process and are never flushed under it.
    Once(Arc<dyn BudgetCounters>),
    /// At start and every period: the counters are shared (Redis) and may be lost.
    Every(Arc<dyn BudgetCounters>, Duration),
}

impl Drop for Selector {
    fn drop(&mut self) {
        self.stop_tasks();
    }
}

impl Selector {
    /// Starts the engine's background tasks: token refreshes every `refresh_every`, the status
    /// gauges, the usage-endpoint reads (at start, then at the engine's cadence) and the budget
    /// rebuild as `budgets` says. The engine owns them.
    pub fn start_tasks(
        self: &Arc<Self>,
        refresher: TokenRefresher,
        refresh_every: Duration,
        budgets: BudgetRebuild,
    ) {
        let engine = Arc::downgrade(self);
        let mut handles = vec![
            tokio::spawn(refresh_loop(refresher, engine.clone(), refresh_every)),
            tokio::spawn(Selector::status_gauges_every(
                engine.clone(),
                STATUS_GAUGES_EVERY,
            )),
            tokio::spawn(Selector::read_usage_every(engine.clone())),
            tokio::spawn(Selector::check_half_open_every(
                engine.clone(),
                HALF_OPEN_CHECKS_EVERY,
            )),
        ];
        handles.push(match budgets {
            BudgetRebuild::Every(counters, period) => {
                tokio::spawn(Selector::rebuild_budgets_every(engine, counters, period))
            }
            BudgetRebuild::Once(counters) => tokio::spawn(async move {
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                match engine.rebuild_budgets(&*counters).await {
                    Ok(seeded) => {
                        tracing::debug!(seeded, "budget counters set from the usage ledger")
                    }
                    Err(error) => {
                        tracing::warn!(%error, "budget counters not rebuilt from the ledger")
                    }
                }
            }),
        });
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(handles);
    }

    /// Aborts the engine's background tasks now.
    pub fn stop_tasks(&self) {
        for handle in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            handle.abort();
        }
    }
}
