//! The `divided` share: this replica's part of each limit while degraded, and the transition
//! after a recovery during which it keeps to its outage share of each concurrency limit.

use poolgate_core::lease::{Denial, DenyReason, LeaseTerms, UserLimit};
use tokio::sync::MutexGuard;

use super::PolicyBackend;
use super::registry::RegistryView;
use super::settings::FailurePolicy;
use crate::backend::{Budget, KeyGate};

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

    /// A key's gates under `divided`: its concurrency, TPM and every budget cut to this
    /// replica's share (so the shares add up to the key's limits), or the denial when a share
    /// is 0. The fallback counts only this replica's spend and tokens.
    pub(super) fn divided_key(&self, gate: &KeyGate) -> Result<KeyGate, Denial> {
        let concurrency = self.share(gate.concurrency_limit);
        if gate.concurrency_limit > 0 && concurrency == 0 {
            return Err(Denial::new(DenyReason::KeyConcurrency, 0));
        }
        let share64 = |limit: i64| -> i64 {
            if limit <= 0 {
                return limit;
            }
            let view = *self.registry.lock().unwrap_or_else(|p| p.into_inner());
            let replicas = i64::from(view.replicas.max(1));
            let extra = match view.rank {
                Some(rank) if i64::from(rank) < limit % replicas => 1,
                _ => 0,
            };
            limit / replicas + extra
        };
        let tpm = share64(gate.tpm_limit);
        if gate.tpm_limit > 0 && tpm == 0 {
            return Err(Denial::new(DenyReason::KeyTpm, 1000));
        }
        let budgets = gate.budgets.clone().map(|budget| Budget {
            limit_micros: share64(budget.limit_micros),
            ..budget
        });
        if let Some(out) = budgets
            .iter()
            .zip(&gate.budgets)
            .find(|(shared, whole)| whole.limit_micros > 0 && shared.limit_micros == 0)
        {
            return Err(Denial::new(DenyReason::KeyBudget, out.0.resets_in_ms));
        }
        Ok(KeyGate {
            concurrency_limit: concurrency,
            tpm_limit: tpm,
            budgets,
            ..gate.clone()
        })
    }

    /// Starts the `divided` transition after a recovery (see `transition`), remembering the
    /// registry as it was during the outage. Nothing under the other policies.
    pub(super) fn start_transition(&self, outage_view: RegistryView) {
        if self.settings.policy != FailurePolicy::Divided {
            return;
        }
        // A wait for the other replicas' recoveries (real processes), so Tokio's timer, not the
        // engine's clock.
        *self.transition.lock().unwrap_or_else(|p| p.into_inner()) = Some(Transition {
            until: tokio::time::Instant::now() + self.settings.registry_ttl,
            view: outage_view,
        });
    }

    /// While the transition lasts, Redis may not hold the other replicas' fallback leases yet,
    /// so an acquire also keeps to this replica's outage share, counted over the leases its
    /// streams hold. Returns the guard that serializes those acquires (count, then grant: hold
    /// it until the grant is recorded), or the denial; `None` outside the transition.
    /// A keyed acquire (`key`) keeps to its key's outage share the same way.
    pub(super) async fn enter_transition(
        &self,
        terms: &LeaseTerms,
        key: Option<&KeyGate>,
    ) -> Result<Option<MutexGuard<'_, ()>>, Denial> {
        let key_limit = key.map_or(0, |gate| gate.concurrency_limit);
        match self.transition_view() {
            Some(view) if (terms.concurrency_limit > 0 || key_limit > 0) && !self.is_degraded() => {
                let serial = self.transition_gate.lock().await;
                if terms.concurrency_limit > 0
                    && self.held_on(terms.account_id)
                        >= Self::share_of(view, terms.concurrency_limit).max(0) as usize
                {
                    return Err(Denial::new(DenyReason::Concurrency, 0));
                }
                if let Some(gate) = key
                    && key_limit > 0
                    && self.held_on_key(gate.api_key_id)
                        >= Self::share_of(view, key_limit).max(0) as usize
                {
                    return Err(Denial::new(DenyReason::KeyConcurrency, 0));
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
