//! The gRPC clients' own metrics, registered in the registry of the process that runs them (the
//! relay's): leases lost and resumed, the lease channels' events, usage-window writes. Labels
//! are bounded: reasons and events, never a key or an account.

use poolgate_runtime::metrics;
use prometheus::{IntCounter, IntCounterVec, Registry};

#[derive(Clone)]
pub struct Metrics {
    /// Where the counters are registered (the gRPC call metrics go there too).
    pub registry: Registry,
    /// relay_lease_lost_total{reason}: leases admission said are gone while their request ran
    /// (`released`, `no_room`, `expired`, `not_resumed`); the upstream call finished anyway.
    pub leases_lost: IntCounterVec,
    /// relay_lease_resumed_total: lease streams that broke and were resumed on a replica.
    pub leases_resumed: IntCounter,
    /// relay_lease_channel_events_total{event}: the lease channels toward admission: `opened`,
    /// `broken` (every lease on it resumes), `fallback` (admission does not serve the channel:
    /// one stream per lease for a while), `resume_paced` (a resume waited for its turn).
    pub lease_channel: IntCounterVec,
    /// relay_window_writes_total{outcome}: `RecordWindows` calls to the selector, `sent` or
    /// `failed` (that batch of readings is dropped: the next answers refresh them).
    pub window_writes: IntCounterVec,
}

impl Metrics {
    /// The counters, in a registry of their own (tests).
    pub fn new() -> Self {
        Metrics::registered_in(Registry::new())
    }

    /// The counters, registered in `registry`.
    pub fn registered_in(registry: Registry) -> Self {
        Metrics {
            leases_lost: metrics::counter_vec(
                &registry,
                "relay_lease_lost_total",
                "Leases lost while their request ran, by reason (released, no_room, expired, not_resumed); the upstream call finished anyway.",
                &["reason"],
            ),
            leases_resumed: metrics::counter(
                &registry,
                "relay_lease_resumed_total",
                "Lease streams that broke and were resumed on an admission replica.",
            ),
            lease_channel: metrics::counter_vec(
                &registry,
                "relay_lease_channel_events_total",
                "Lease channels toward admission by event: opened, broken (its leases resume), fallback (admission does not serve the channel: one stream per lease for a while), resume_paced (a resume waited for its turn after a break).",
                &["event"],
            ),
            window_writes: metrics::counter_vec(
                &registry,
                "relay_window_writes_total",
                "RecordWindows calls to the selector (usage-window readings, coalesced per account), by outcome (sent, failed: dropped).",
                &["outcome"],
            ),
            registry,
        }
    }

    pub fn lease_channel_event(&self, event: &str) {
        self.lease_channel.with_label_values(&[event]).inc();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
