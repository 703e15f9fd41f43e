//! The `divided` share: this replica's part of each limit while degraded, and the transition
//! after a recovery during which it keeps to its outage share of each concurrency limit.

use poolgate_core::lease::{Denial, DenyReason, LeaseTerms, UserLimit};
use tokio::sync::MutexGuard;

use super::PolicyBackend;
use super::registry::RegistryView;
use super::settings::FailurePolicy;

/// See `PolicyBackend::transition`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Transition {
    pub(super) until: tokio::time::Instant,
    /// The registry as it was during the outage (Redis may have come back empty, without it).
    pub(super) view: RegistryView,
}

impl PolicyBackend {
    /// This replica's share of `limit` under `divided`; `limit` itself otherwise.
    pub(super) fn share(&self, limit: i32) -> i32 {
        if limit <= 0 || self.settings.policy != FailurePolicy::Divided {
            return limit;
        }
        let view = *self.registry.lock().unwrap_or_else(|p| p.into_inner());
        Self::share_of(view, limit)
    }

    fn share_of(view: RegistryView, limit: i32) -> i32 {
        let replicas = view.replicas.max(1) as i32;
        let base = limit / replicas;
        let extra = match view.rank {
            Some(rank) if (rank as i32) < limit % replicas => 1,
            _ => 0,
        };
        base + extra
    }

    /// The terms a `divided` fallback acquire runs under: each limit cut to this replica's
    /// share, or the denial when a share is 0.
    pub(super) fn divided_terms(&self, terms: &LeaseTerms) -> Result<LeaseTerms, Denial> {
        let concurrency = self.share(terms.concurrency_limit);
        let rpm = self.share(terms.rpm_limit);
        if terms.concurrency_limit > 0 && concurrency == 0 {
            return Err(Denial::new(DenyReason::Concurrency, 0));
        }
        if terms.rpm_limit > 0 && rpm == 0 {
            return Err(Denial::new(DenyReason::Rpm, 1000));
        }
        let user = match &terms.user {
            Some(user) if user.rpm_limit > 0 => {
                let share = self.share(user.rpm_limit);
                if share == 0 {
                    return Err(Denial::new(DenyReason::UserRpm, 1000));
                }
                Some(UserLimit {
                    rpm_limit: share,
                    ..user.clone()
                })
            }
            other => other.clone(),
        };
        Ok(LeaseTerms {
            concurrency_limit: concurrency,
            rpm_limit: rpm,
            user,
            ..terms.clone()
        })
    }

    /// Starts the `divided` transition after a recovery (see `transition`), remembering the
    /// registry as it was during the outage. Nothing under the other policies.
    pub(super) fn start_transition(&self, outage_view: RegistryView) {
        if self.settings.policy != FailurePolicy::Divided {
            return;
        }
        *self.transition.lock().unwrap_or_else(|p| p.into_inner()) = Some(Transition {
            until: tokio::time::Instant::now() + self.settings.registry_ttl,
            view: outage_view,
        });
    }

    /// While the transition lasts, Redis may not hold the other replicas' fallback leases yet,
    /// so an acquire also keeps to this replica's outage share, counted over the leases its
    /// streams hold. Returns the guard that serializes those acquires (count, then grant: hold
    /// it until the grant is recorded), or the denial; `None` outside the transition.
    pub(super) async fn enter_transition(
        &self,
        terms: &LeaseTerms,
    ) -> Result<Option<MutexGuard<'_, ()>>, Denial> {
        match self.transition_view() {
            Some(view) if terms.concurrency_limit > 0 && !self.is_degraded() => {
                let serial = self.transition_gate.lock().await;
                if self.held_on(terms.account_id)
                    >= Self::share_of(view, terms.concurrency_limit).max(0) as usize
                {
                    return Err(Denial::new(DenyReason::Concurrency, 0));
                }
                Ok(Some(serial))
            }
            _ => Ok(None),
        }
    }

    /// The outage's registry view while the `divided` transition after a recovery lasts.
    fn transition_view(&self) -> Option<RegistryView> {
        let mut transition = self.transition.lock().unwrap_or_else(|p| p.into_inner());
        match *transition {
            Some(t) if t.until > tokio::time::Instant::now() => Some(t.view),
            Some(_) => {
                *transition = None;
                None
            }
            None => None,
        }
    }
}
