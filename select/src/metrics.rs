//! Prometheus metrics of one selector replica. Labels are bounded enums; account ids never.

use poolgate_runtime::metrics::{counter, counter_vec, float_gauge_vec, gauge_vec};
use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGaugeVec, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// selector_selects_total{result}: `planned`, or the none reason.
    pub selects: IntCounterVec,
    /// selector_outcomes_total{class, applied}
    pub outcomes: IntCounterVec,
    /// selector_breaker_changes_total{change}: opened, reopened, closed.
    pub breaker_changes: IntCounterVec,
    pub retirements: IntCounter,
    /// selector_confirmations_total{suspect, result}: suspect quota_gone, broken or unauthorized; result
    /// started, already_running, confirmed, not_confirmed, inconclusive.
    pub confirmations: IntCounterVec,
    /// selector_usage_reads_total{result}: the usage endpoints' reads (`engine/usage_reads.rs`)
    /// by result: read, refused, no_endpoint, inconclusive.
    pub usage_reads: IntCounterVec,
    /// selector_sticky_total{result, platform}: hit, bound, rebind.
    pub sticky: IntCounterVec,
    /// selector_reloads_total{trigger}: notify, periodic, startup.
    pub reloads: IntCounterVec,
    /// selector_token_refreshes_total{result}: refreshed, waited, failed, floored.
    pub token_refreshes: IntCounterVec,
    /// selector_active_blocks{kind}: hard, soft, breaker (from the latest readings).
    pub active_blocks: IntGaugeVec,
    /// selector_redis_round_trips_total: commands, scripts and pipelines sent to Redis.
    pub redis_round_trips: IntCounter,
    /// selector_window_shed_accounts{group}: accounts past the group's usage-window shed
    /// threshold among its latest select's candidates.
    pub window_shed_accounts: IntGaugeVec,
    /// selector_window_headroom{group, window}: the share left in each window kind, summed over
    /// the group's accounts that reported it (2.5: two and a half accounts' worth).
    pub window_headroom: GaugeVec,
    /// selector_window_sessions_moved_total{group}: sticky sessions moved off an account past
    /// the move threshold.
    pub window_sessions_moved: IntCounterVec,
    /// selector_accounts{group, status}: accounts by the status an operator sees them in
    /// (`LiveStatus`: active, disabled, soft_blocked, hard_blocked, confirming, breaker_open,
    /// retired, error), every status of every configured group present (0 included).
    pub accounts: IntGaugeVec,
    /// selector_group_eligible{group}: the group's accounts a select could plan now.
    pub group_eligible: IntGaugeVec,
    /// selector_group_leases{group}: live leases on the group's active accounts.
    pub group_leases: IntGaugeVec,
    /// selector_group_concurrency_limit{group}: the concurrency limits of the group's active
    /// accounts, summed (an account without a limit adds nothing).
    pub group_concurrency_limit: IntGaugeVec,
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
        let retirements = counter(
            &registry,
            "selector_retirements_total",
            "Accounts retired after a billing-class answer was confirmed by the probe.",
        );
        let active_blocks = gauge_vec(
            &registry,
            "selector_active_blocks",
            "Accounts blocked in this replica's latest readings, by kind (hard, soft, breaker).",
            &["kind"],
        );
        let token_refreshes = counter_vec(
            &registry,
            "selector_token_refreshes_total",
            "OAuth token refreshes by result.",
            &["result"],
        );
        // Every result shows from the start (0 included): an alert's `increase()` then sees
        // the first failure, not only the second.
        for result in ["refreshed", "waited", "failed", "floored"] {
            token_refreshes.with_label_values(&[result]);
        }
        Metrics {
            active_blocks,
            token_refreshes,
            selects: counter_vec(
                &registry,
                "selector_selects_total",
                "Select calls by result (planned or the reason nothing was eligible).",
                &["result"],
            ),
            outcomes: counter_vec(
                &registry,
                "selector_outcomes_total",
                "Reported upstream outcomes by class and what was applied.",
                &["class", "applied"],
            ),
            breaker_changes: counter_vec(
                &registry,
                "selector_breaker_changes_total",
                "Circuit breaker state changes.",
                &["change"],
            ),
            retirements,
            confirmations: counter_vec(
                &registry,
                "selector_confirmations_total",
                "Confirmation probes by what they suspect (quota_gone, broken, unauthorized) and result (started, already_running, confirmed, not_confirmed, inconclusive).",
                &["suspect", "result"],
            ),
            usage_reads: counter_vec(
                &registry,
                "selector_usage_reads_total",
                "Usage endpoint reads of OAuth accounts by result (read, refused, no_endpoint, inconclusive).",
                &["result"],
            ),
            sticky: counter_vec(
                &registry,
                "selector_sticky_total",
                "Session bindings by result (hit, bound, rebind) and platform.",
                &["result", "platform"],
            ),
            reloads: counter_vec(
                &registry,
                "selector_reloads_total",
                "Config snapshot reloads by trigger.",
                &["trigger"],
            ),
            redis_round_trips: counter(
                &registry,
                "selector_redis_round_trips_total",
                "Redis round trips (a command, a script or a pipeline is one).",
            ),
            window_shed_accounts: gauge_vec(
                &registry,
                "selector_window_shed_accounts",
                "Accounts past the group's usage-window shed threshold among its latest select's candidates.",
                &["group"],
            ),
            window_headroom: float_gauge_vec(
                &registry,
                "selector_window_headroom",
                "Share left in each usage-window kind, summed over the group's accounts that reported it.",
                &["group", "window"],
            ),
            window_sessions_moved: counter_vec(
                &registry,
                "selector_window_sessions_moved_total",
                "Sticky sessions moved off an account past the group's usage-window move threshold.",
                &["group"],
            ),
            accounts: gauge_vec(
                &registry,
                "selector_accounts",
                "Accounts by group and the status an operator sees them in (active, disabled, soft_blocked, hard_blocked, confirming, breaker_open, retired, error); refreshed every few seconds.",
                &["group", "status"],
            ),
            group_eligible: gauge_vec(
                &registry,
                "selector_group_eligible",
                "The group's accounts a select could plan now (active, not hard-blocked, breaker closed, no usage window used up); refreshed every few seconds.",
                &["group"],
            ),
            group_leases: gauge_vec(
                &registry,
                "selector_group_leases",
                "Live leases on the group's active accounts; refreshed every few seconds.",
                &["group"],
            ),
            group_concurrency_limit: gauge_vec(
                &registry,
                "selector_group_concurrency_limit",
                "Concurrency limits of the group's active accounts, summed (an account without a limit adds nothing); refreshed every few seconds.",
                &["group"],
            ),
            registry,
        }
    }

    pub fn render(&self) -> String {
        poolgate_runtime::metrics::render(&self.registry)
    }
}
