//! What an acquire leaves behind if it ends early, undone on drop: a user RPM charge made
//! apart from the account's gates, and a waiter registered on an account.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backend::LeaseBackend;
use crate::metrics::Metrics;
use poolgate_core::AccountId;

/// A user RPM charge made apart from the account gates (a Cluster): refunded unless the
/// acquire it was made for got a lease; dropped while armed (the caller went away), the refund
/// runs detached.
pub(super) struct UserCharge {
    pub(super) backend: Arc<dyn LeaseBackend>,
    pub(super) user_id: String,
    pub(super) event_id: String,
    pub(super) armed: bool,
}

impl UserCharge {
    pub(super) fn keep(mut self) {
        self.armed = false;
    }

    pub(super) async fn refund(mut self) {
        self.armed = false;
        if let Err(error) = self
            .backend
            .refund_user(&self.user_id, &self.event_id)
            .await
        {
            tracing::warn!(%error, "user rpm refund failed; the event ages out within the rpm window");
        }
    }
}

impl Drop for UserCharge {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let backend = self.backend.clone();
        let user_id = std::mem::take(&mut self.user_id);
        let event_id = std::mem::take(&mut self.event_id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = backend.refund_user(&user_id, &event_id).await {
                    tracing::debug!(%error, "user rpm refund failed; the event ages out");
                }
            });
        }
    }
}

/// Removes a registered waiter when the wait ends for any reason (granted, refused, or the
/// client went away and the future was dropped).
pub(super) struct WaiterGuard {
    pub(super) backend: Arc<dyn LeaseBackend>,
    pub(super) account_id: AccountId,
    pub(super) waiter_id: String,
    pub(super) metrics: Metrics,
    pub(super) local_waiting: Arc<Mutex<HashMap<AccountId, usize>>>,
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        self.metrics.waiters.dec();
        {
            let mut waiting = self.local_waiting.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(count) = waiting.get_mut(&self.account_id) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    waiting.remove(&self.account_id);
                }
            }
        }
        let backend = self.backend.clone();
        let account_id = self.account_id;
        let waiter_id = std::mem::take(&mut self.waiter_id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = backend.remove_waiter(account_id, &waiter_id).await {
                    tracing::debug!(%error, "waiter removal failed; the entry expires by itself");
                }
            });
        }
    }
}
