//! Coming back from an outage: what the fallback admitted is written into Redis, Redis serves
//! again, then the releases and spend recorded during the outage are replayed.

use std::sync::atomic::Ordering;

use poolgate_core::AccountId;
use poolgate_core::lease::LeaseId;

use super::PolicyBackend;
use crate::backend::{KeyCharge, LeaseBackend};

/// Work done on the fallback during an outage that Redis must see when it returns.
pub(super) enum OutageRecord {
    Release {
        lease_id: LeaseId,
        spend_micros: i64,
        session_window_ms: u64,
        fence_ms: u64,
        key: Option<KeyCharge>,
    },
    Spend {
        account_id: AccountId,
        spend_micros: i64,
        session_window_ms: u64,
    },
}

impl PolicyBackend {
    /// Writes what the fallback admitted into Redis, resumes Redis, then replays the outage's
    /// releases and spend. Any failure leaves the replica degraded for the next tick. Returns
    /// whether this call recovered.
    pub(super) async fn recover(&self) -> bool {
        // No fallback operation runs until the switch is complete (see `adoption`).
        let _recovering = self.adoption.write().await;
        if !self.is_degraded() {
            return false;
        }
        let snapshot = self.fallback.snapshot(self.rpm_window_ms);
        if let Err(error) = self.redis.restore(&snapshot).await {
            tracing::warn!(%error, "redis answers again but the fallback leases could not be written; staying degraded");
            return false;
        }
        self.fallback.forget(&snapshot);
        self.degraded.store(false, Ordering::SeqCst);
        self.metrics.degraded.set(0);
        // A safety net: with the gate held no fallback operation ran since the snapshot.
        let late = self.fallback.snapshot(self.rpm_window_ms);
        if !late.is_empty() {
            match self.redis.restore(&late).await {
                Ok(()) => self.fallback.forget(&late),
                Err(error) => {
                    tracing::warn!(%error, "late fallback leases not written; they expire by themselves")
                }
            }
        }
        let records: Vec<OutageRecord> =
            std::mem::take(&mut *self.outage.lock().unwrap_or_else(|p| p.into_inner()));
        let mut failed = Vec::new();
        for record in records {
            let result = match &record {
                OutageRecord::Release {
                    lease_id,
                    spend_micros,
                    session_window_ms,
                    fence_ms,
                    key,
                } => self
                    .redis
                    .release_charged(
                        lease_id,
                        *spend_micros,
                        *session_window_ms,
                        *fence_ms,
                        key.as_ref(),
                    )
                    .await
                    .map(|_| ()),
                OutageRecord::Spend {
                    account_id,
                    spend_micros,
                    session_window_ms,
                } => self
                    .redis
                    .record_spend(*account_id, *spend_micros, *session_window_ms)
                    .await
                    .map(|_| ()),
            };
            if result.is_err() {
                failed.push(record);
            }
        }
        let unreplayed = failed.len();
        self.outage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(failed);
        self.metrics.degraded.set(0);
        tracing::info!(
            restored_accounts = snapshot.accounts.len(),
            unreplayed,
            "redis is back; fallback leases written, global enforcement resumed"
        );
        true
    }

    pub(super) fn push_outage(&self, record: OutageRecord) {
        self.outage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record);
    }
}
