//! `Windows` in memory: each account's readings in its state, with the Redis key's lifetime.

use async_trait::async_trait;

use super::{Expiring, InProcessHealth, live};
use crate::health::{BackendError, WINDOWS_TTL_MS, Windows, merge_windows, window_kept};
use poolgate_core::AccountId;
use poolgate_core::windows::WindowReading;

#[async_trait]
impl Windows for InProcessHealth {
    async fn store_windows(
        &self,
        id: AccountId,
        readings: &[WindowReading],
    ) -> Result<(), BackendError> {
        if readings.is_empty() {
            // As in Redis: nothing written, the account's lifetime not renewed.
            return Ok(());
        }
        self.with_account(id, |account, now| {
            let mut stored = live(&account.windows, now)
                .map(|entry| entry.value.clone())
                .unwrap_or_default();
            merge_windows(&mut stored, readings, now);
            account.windows = Some(Expiring::new(stored, now, WINDOWS_TTL_MS));
        });
        Ok(())
    }

    async fn read_windows(
        &self,
        ids: &[AccountId],
    ) -> Result<Vec<Vec<WindowReading>>, BackendError> {
        Ok(self.with_state(|state, now| {
            ids.iter()
                .map(|id| {
                    state
                        .accounts
                        .get(id)
                        .and_then(|account| live(&account.windows, now))
                        .map(|entry| {
                            entry
                                .value
                                .iter()
                                .filter(|reading| window_kept(reading, now))
                                .cloned()
                                .collect()
                        })
                        .unwrap_or_default()
                })
                .collect()
        }))
    }
}
