//! The usage windows' intake (docs/DESIGN.md §5, "Spending what expires first"): what an
//! upstream answer said about an account's windows, stored for every replica's selection. One
//! entry for both transports (the relay's reports, the gRPC service) and the selector's probes.

use poolgate_core::AccountId;
use poolgate_core::windows::WindowReading;

use super::{Selector, SelectorError};

/// Most readings one answer can carry (the known families are about twenty); more is not an
/// upstream's answer.
pub const MAX_WINDOW_READINGS: usize = 64;

/// The furthest a window's reset may lie ahead: a week, and a day of slack.
const MAX_RESET_AHEAD_MS: i64 = 8 * 24 * 3_600_000;

impl Selector {
    /// Stores the readings of one answer of `account_id`'s (the newest per window wins); an
    /// empty list writes nothing.
    pub async fn record_windows(
        &self,
        account_id: AccountId,
        readings: Vec<WindowReading>,
    ) -> Result<(), SelectorError> {
        if readings.is_empty() {
            return Ok(());
        }
        if readings.len() > MAX_WINDOW_READINGS {
            return Err(SelectorError::invalid(
                "readings",
                format!("at most {MAX_WINDOW_READINGS} per answer"),
            ));
        }
        if readings
            .iter()
            .any(|r| r.utilization.is_some_and(|u| !(0.0..=1.0).contains(&u)))
        {
            return Err(SelectorError::invalid(
                "readings.utilization",
                "a share between 0 and 1",
            ));
        }
        // The newest reading per window wins, by when it was observed, and relays stamp that with
        // their own clocks: one ahead would pin its reading over every later answer. A stamp past
        // this selector's now counts as now. A reset further out than the longest upstream
        // window (a week) is no upstream's answer: refused, not kept as a block for months.
        let now = self.clock.wall_ms();
        if readings
            .iter()
            .any(|r| r.reset_at_ms > now + MAX_RESET_AHEAD_MS)
        {
            return Err(SelectorError::invalid(
                "readings.reset_at_ms",
                "at most eight days ahead",
            ));
        }
        let readings: Vec<WindowReading> = readings
            .into_iter()
            .map(|reading| WindowReading {
                observed_at_ms: reading.observed_at_ms.min(now),
                ..reading
            })
            .collect();
        self.health
            .store_windows(account_id, &readings)
            .await
            .map_err(|e| SelectorError::Unavailable(e.to_string()))?;
        // This replica reads its own write at its next select; others within a cache period.
        self.windows_cache.forget(account_id);
        Ok(())
    }
}
