//! `Windows` in memory: each account's readings in its state, with the Redis key's lifetime, and
//! what the standalone state file needs to keep them across a restart (a version that moves on
//! every write, a copy of every account's readings, and their restore at start).

use async_trait::async_trait;

use super::{AccountState, Expiring, InProcessHealth, live};
use crate::health::{StateError, WINDOWS_TTL_MS, Windows, merge_windows, window_kept};
use poolgate_core::AccountId;
use poolgate_core::windows::WindowReading;

/// Merges `readings` into the account's, as [`Windows::store_windows`] says.
fn merge_into(account: &mut AccountState, readings: &[WindowReading], now: i64) {
    let mut stored = live(&account.windows, now)
        .map(|entry| entry.value.clone())
        .unwrap_or_default();
    merge_windows(&mut stored, readings, now);
    account.windows = Some(Expiring::new(stored, now, WINDOWS_TTL_MS));
}

/// The account's readings as a read answers them.
fn kept(account: &AccountState, now: i64) -> Vec<WindowReading> {
    live(&account.windows, now)
        .map(|entry| {
            entry
                .value
                .iter()
                .filter(|reading| window_kept(reading, now))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[async_trait]
impl Windows for InProcessHealth {
    async fn store_windows(
        &self,
        id: AccountId,
        readings: &[WindowReading],
    ) -> Result<(), StateError> {
        if readings.is_empty() {
            // As in Redis: nothing written, the account's lifetime not renewed.
            return Ok(());
        }
        self.with_state(|state, now| {
            merge_into(state.accounts.entry(id).or_default(), readings, now);
            state.windows_version += 1;
        });
        Ok(())
    }

    async fn read_windows(&self, ids: &[AccountId]) -> Result<Vec<Vec<WindowReading>>, StateError> {
        Ok(self.with_state(|state, now| {
            ids.iter()
                .map(|id| {
                    state
                        .accounts
                        .get(id)
                        .map(|account| kept(account, now))
                        .unwrap_or_default()
                })
                .collect()
        }))
    }
}

impl InProcessHealth {
    /// Moves on every reading stored (never on a restore): whoever keeps the readings elsewhere
    /// compares it with the version it last kept.
    pub fn windows_version(&self) -> u64 {
        self.with_state(|state, _| state.windows_version)
    }

    /// Every account's readings as [`Windows::read_windows`] answers them, accounts without any
    /// left out, with the version they are as of.
    pub fn all_windows(&self) -> (u64, Vec<(AccountId, Vec<WindowReading>)>) {
        self.with_state(|state, now| {
            let readings = state
                .accounts
                .iter()
                .map(|(&id, account)| (id, kept(account, now)))
                .filter(|(_, readings)| !readings.is_empty())
                .collect();
            (state.windows_version, readings)
        })
    }

    /// Puts back readings kept before a restart, merged as [`Windows::store_windows`] merges
    /// (a newer reading already stored wins). The version does not move: they are kept already.
    pub fn restore_windows(&self, saved: Vec<(AccountId, Vec<WindowReading>)>) {
        self.with_state(|state, now| {
            for (id, readings) in saved {
                if !readings.is_empty() {
                    merge_into(state.accounts.entry(id).or_default(), &readings, now);
                }
            }
        });
    }
}
