//! The usage windows' intake (docs/DESIGN.md §5, "Spending what expires first"): what an
//! upstream answer said about an account's windows, stored for every replica's selection. One
//! entry for both transports (the relay's reports, the gRPC service) and the selector's probes.

use poolgate_core::AccountId;
use poolgate_core::windows::WindowReading;

use super::{Selector, SelectorError};

/// Most readings one answer can carry (the known families are about twenty); more is not an
/// upstream's answer.
pub const MAX_WINDOW_READINGS: usize = 64;

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
        self.health
            .store_windows(account_id, &readings)
            .await
            .map_err(|e| SelectorError::Unavailable(e.to_string()))?;
        // This replica reads its own write at its next select; others within a cache period.
        self.windows_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&account_id);
        Ok(())
    }
}
