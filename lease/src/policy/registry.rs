//! The replica registry: this replica's heartbeat (which doubles as the Redis probe while
//! degraded, and recovers when it answers), with its report of itself (failure policy, degraded
//! or not: the operator's status view reads it), and the view of the live replicas it reads.

use std::sync::atomic::Ordering;

use poolgate_core::millis;
use poolgate_core::status::AdmissionPolicy;
use poolgate_runtime::error::StateError;

use super::{FailurePolicy, PolicyBackend};
use crate::redis_backend::OwnReport;

#[derive(Debug, Clone, Copy)]
pub(super) struct RegistryView {
    pub(super) replicas: u32,
    /// This replica's rank among the live replicas; `None` until the registry was read.
    pub(super) rank: Option<u32>,
}

impl PolicyBackend {
    /// (live replicas, this replica's rank) as last read from the registry.
    pub fn registry_view(&self) -> (u32, Option<u32>) {
        let view = *self.registry.lock().unwrap_or_else(|p| p.into_inner());
        (view.replicas, view.rank)
    }

    /// Heartbeats into the registry; on success while degraded, recovers. Run every
    /// `registry_interval` by the server.
    pub async fn tick(&self) {
        let ttl = millis(self.settings.registry_ttl);
        // The state before this heartbeat: a degraded replica that recovers below reports ok
        // with its next heartbeat, one interval later. A replica that cannot reach Redis writes
        // nothing; its entry goes stale, which readers show as unknown.
        let report = OwnReport {
            policy: self.report_policy(),
            degraded: self.is_degraded(),
        };
        match self
            .redis
            .registry_heartbeat(&self.member, ttl, report)
            .await
        {
            Ok((members, present)) => {
                self.registry_timeouts.store(0, Ordering::SeqCst);
                // This replica's entry, written by its last heartbeat and live for a registry
                // ttl, is gone: Redis lost its state (a flush, a node restarted empty).
                if !present && self.registered.swap(true, Ordering::SeqCst) {
                    tracing::warn!("this replica's registry entry is gone: Redis lost its state");
                    self.redis.notice_loss();
                }
                if !self.is_degraded() && self.redis.take_noticed_loss() {
                    self.metrics.redis_state_lost.inc();
                    let put_back = self.restore_held_leases().await;
                    self.metrics.leases_put_back.inc_by(put_back as u64);
                }
                let rank = members
                    .iter()
                    .position(|m| *m == self.member)
                    .map(|r| r as u32);
                let outage_view = {
                    let mut view = self.registry.lock().unwrap_or_else(|p| p.into_inner());
                    let outage_view = *view;
                    view.replicas = (members.len() as u32).max(1);
                    view.rank = rank;
                    outage_view
                };
                if self.is_degraded() && self.recover().await {
                    self.start_transition(outage_view);
                }
            }
            Err(StateError::Timeout)
                if self.registry_timeouts.fetch_add(1, Ordering::SeqCst) == 0 =>
            {
                self.metrics
                    .redis_timeouts
                    .with_label_values(&["registry"])
                    .inc();
            }
            Err(error) => {
                self.registry_timeouts.store(0, Ordering::SeqCst);
                self.enter_degraded("registry", &error).await
            }
        }
    }

    /// The policy as the registry's reports name it.
    fn report_policy(&self) -> AdmissionPolicy {
        match self.settings.policy {
            FailurePolicy::Open => AdmissionPolicy::Open,
            FailurePolicy::Divided => AdmissionPolicy::Divided,
            FailurePolicy::Closed => AdmissionPolicy::Closed,
        }
    }

    /// Leaves the registry on shutdown.
    pub async fn leave(&self) {
        if let Err(error) = self.redis.registry_leave(&self.member).await {
            tracing::debug!(%error, "could not leave the replica registry; the entry expires");
        }
    }
}
