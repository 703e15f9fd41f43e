//! Prometheus metrics of one admission replica. Labels are bounded enums (results, reasons,
//! operations): never an account id, a user, a session hash or a lease id.

use poolgate_runtime::metrics::{counter, counter_vec, gauge};
use prometheus::{IntCounter, IntCounterVec, IntGauge, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// admission_decisions_total{result, reason}
    pub decisions: IntCounterVec,
    /// admission_attempts_total{result, reason}
    pub attempts: IntCounterVec,
    pub leases_in_flight: IntGauge,
    pub waiters: IntGauge,
    /// admission_wakes_received_total: another replica's release woke a waiter here.
    pub wakes_received: IntCounter,
    pub leases_restored: IntCounter,
    /// Times this replica noticed Redis had lost state it saw (docs/DESIGN.md §3, "When Redis is
    /// wiped"), and the leases its restore passes put back.
    pub redis_state_lost: IntCounter,
    pub leases_put_back: IntCounter,
    /// admission_leases_lost_total{reason}: heartbeats answered `Lost` (`released`, `no_room`,
    /// `expired`, `backend_unavailable`).
    pub leases_lost: IntCounterVec,
    pub orphaned: IntCounter,
    pub release_retries: IntCounter,
    pub spend_micros: IntCounter,
    /// admission_redis_fallbacks_total{operation, reason}
    pub fallbacks: IntCounterVec,
    /// admission_redis_timeouts_total{operation}: Redis calls that timed out (answered as
    /// unavailable for that call; only the registry probe turns timeouts into an outage).
    pub redis_timeouts: IntCounterVec,
    pub degraded: IntGauge,
    /// admission_redis_round_trips_total: commands, scripts and pipelines sent to Redis.
    pub redis_round_trips: IntCounter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self::registered_in(Registry::new())
    }

    /// The metrics, registered in `registry` (a process that runs this engine in process, such
    /// as a standalone relay, shows them on its own `/metrics`).
    pub fn registered_in(registry: Registry) -> Self {
        Metrics {
            decisions: counter_vec(
                &registry,
                "admission_decisions_total",
                "Acquire decisions by result (granted, denied, cancelled, error) and deny reason.",
                &["result", "reason"],
            ),
            attempts: counter_vec(
                &registry,
                "admission_attempts_total",
                "Same-account retry charges by result and reason.",
                &["result", "reason"],
            ),
            leases_in_flight: gauge(
                &registry,
                "admission_leases_in_flight",
                "Leases held by lease streams on this replica.",
            ),
            waiters: gauge(
                &registry,
                "admission_waiters",
                "Acquires waiting for a slot on this replica.",
            ),
            wakes_received: counter(
                &registry,
                "admission_wakes_received_total",
                "Wake messages from another replica's release that woke a waiter here.",
            ),
            leases_restored: counter(
                &registry,
                "admission_leases_restored_total",
                "Heartbeats that re-added a lease the backend had lost (e.g. Redis restarted).",
            ),
            redis_state_lost: counter(
                &registry,
                "admission_redis_state_lost_total",
                "Times this replica noticed Redis had lost state it had seen (a wipe, a node restarted empty); each starts a recount and a restore pass.",
            ),
            leases_put_back: counter(
                &registry,
                "admission_leases_put_back_total",
                "Leases this replica's restore passes put back after Redis lost state.",
            ),
            leases_lost: counter_vec(
                &registry,
                "admission_leases_lost_total",
                "Lease streams ended with Lost, by reason (released, no_room, expired, backend_unavailable).",
                &["reason"],
            ),
            orphaned: counter(
                &registry,
                "admission_leases_orphaned_total",
                "Lease streams that ended without Release (lease left to the orphan grace).",
            ),
            release_retries: counter(
                &registry,
                "admission_release_retries_total",
                "Releases the backend did not take at once and that were queued for retry.",
            ),
            spend_micros: counter(
                &registry,
                "admission_spend_recorded_micro_usd_total",
                "Spend recorded into session windows, in micro-USD.",
            ),
            fallbacks: counter_vec(
                &registry,
                "admission_redis_fallbacks_total",
                "Operations served by the Redis failure policy instead of Redis, by operation and reason.",
                &["operation", "reason"],
            ),
            redis_timeouts: counter_vec(
                &registry,
                "admission_redis_timeouts_total",
                "Redis calls that timed out, by operation (the call answers as Redis unavailable; only registry heartbeats timing out twice in a row switch to the failure policy).",
                &["operation"],
            ),
            degraded: gauge(
                &registry,
                "admission_degraded",
                "1 while Redis is unreachable and the failure policy decides.",
            ),
            redis_round_trips: counter(
                &registry,
                "admission_redis_round_trips_total",
                "Redis round trips (a command, a script or a pipeline is one).",
            ),
            registry,
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        poolgate_runtime::metrics::render(&self.registry)
    }
}
