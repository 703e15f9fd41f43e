//! Prometheus metrics of one relay replica. Labels are bounded: endpoints, platforms, reasons.
//! Never an API key, a session hash, a request id or (by default) an account id.

use std::time::Duration;

use poolgate_runtime::metrics;
use prometheus::{HistogramVec, IntCounter, IntCounterVec, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// relay_requests_total{endpoint}
    pub requests: IntCounterVec,
    /// relay_failovers_total{reason, outcome}: reason `concurrency`, `rpm`, `session_window`,
    /// `same_account`, `429`, `529`, `5xx`, `401`, `network`, `quota`...; outcome `local`
    /// (a sibling is tried without using the budget), `failover`, `retry`, `budget_spent`.
    pub failovers: IntCounterVec,
    pub same_account_retries: IntCounter,
    pub client_disconnects: IntCounter,
    /// The gRPC clients' counters (`relay_lease_lost_total`, `relay_lease_resumed_total`,
    /// `relay_lease_channel_events_total`, `relay_window_writes_total`), in this registry.
    pub client: poolgate_client::metrics::Metrics,
    pub spend_micros: IntCounter,
    /// relay_unpriced_usage_total{pricing}: answers with tokens whose model has no price of its
    /// own: `fallback` (charged its family's highest catalogue price), `none` (charged $0).
    pub unpriced_usage: IntCounterVec,
    /// relay_usage_records_lost_total: usage records that never reached the selector.
    pub usage_lost: IntCounter,
    /// relay_key_refusals_total{reason}: requests refused for what their key may reach
    /// (`disabled`, `expired`, `endpoint`, `model`), before any account is asked, or by the
    /// key's own admission limits (`concurrency`, `tpm`, `budget`), or a model without a price
    /// on a key with a budget where the operator refuses those (`unpriced`); never the key.
    pub key_refusals: IntCounterVec,
    /// relay_pool_refusals_total{service,reason}: embeddings and rerank requests the pool could
    /// not serve now, answered 429 at once with `retry-after` (`reason`: `busy`, `failed`, or an
    /// empty plan's: `all_blocked`, `breaker_open`, `confirming`, `all_excluded`).
    pub pool_refusals: IntCounterVec,
    /// relay_rerank_degraded_total{reason}: rerank requests answered with the documents in the
    /// order they were sent (the passthrough), not charged, by why no account reranked them.
    pub rerank_degraded: IntCounterVec,
    /// relay_socket_turns_total{kind}: `response.create` messages on Responses WebSockets:
    /// `turn` (run through the relay), `continued` (a continuation of the socket's previous turn:
    /// as sent on the upstream socket that holds it, else whole), `previous_response_not_found` (a `store: false` continuation of a
    /// response this socket did not make: the client resends the conversation), `prewarm`
    /// (`generate: false`, answered without an upstream call).
    pub socket_turns: IntCounterVec,
    /// relay_upstream_sockets_total{event}: socket turns toward the upstream's own socket:
    /// `opened`, `reused`, `refused` (the upgrade answered an error, classified as over HTTP),
    /// `resent_whole` (a continuation the upstream no longer held, sent whole), `aged` (the
    /// upstream's hour was up: a new socket), `http_no_socket` and `http_large` (the turn went
    /// over HTTP: no socket there, or a message of 16 MiB or more).
    pub upstream_sockets: IntCounterVec,
    pub upstream_seconds: HistogramVec,
    pub first_byte_seconds: HistogramVec,
    /// relay_added_seconds{platform}: the time a request that reached an upstream spent in the
    /// relay rather than in upstream calls (docs/METRICS.md defines it exactly).
    pub added_seconds: HistogramVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            metrics::counter_vec(&registry, name, help, labels)
        };
        let counter = |name: &str, help: &str| metrics::counter(&registry, name, help);
        let buckets = vec![
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
        ];
        let histogram = |name: &str, help: &str| {
            metrics::histogram_vec(&registry, name, help, &["platform"], buckets.clone())
        };
        Metrics {
            requests: counter_vec(
                "relay_requests_total",
                "Client requests by endpoint.",
                &["endpoint"],
            ),
            failovers: counter_vec(
                "relay_failovers_total",
                "Failovers and same-account retries by reason and outcome.",
                &["reason", "outcome"],
            ),
            same_account_retries: counter(
                "relay_same_account_retries_total",
                "Same-account retries after a conflict.",
            ),
            client_disconnects: counter(
                "relay_client_disconnects_total",
                "Streams the client left before the end (upstream call cancelled, lease released).",
            ),
            spend_micros: counter(
                "relay_spend_recorded_micro_usd_total",
                "Spend recorded with lease releases, in micro-USD.",
            ),
            usage_lost: counter(
                "relay_usage_records_lost_total",
                "Usage records that never reached the selector (refused, or past the bound kept through an outage).",
            ),
            key_refusals: counter_vec(
                "relay_key_refusals_total",
                "Requests refused for what their client key may reach (disabled, expired, endpoint, model), by its own limits (concurrency, tpm, budget), or for a model without a price on a key with a budget (unpriced), by reason; no upstream is called.",
                &["reason"],
            ),
            pool_refusals: counter_vec(
                "relay_pool_refusals_total",
                "Embeddings and rerank requests the pool could not serve now, answered 429 at once with retry-after, by service and reason (busy, failed, all_blocked, breaker_open, confirming, all_excluded).",
                &["service", "reason"],
            ),
            rerank_degraded: counter_vec(
                "relay_rerank_degraded_total",
                "Rerank requests answered with the documents in the order they were sent (not reranked, not charged) because no account could rerank them now, by reason.",
                &["reason"],
            ),
            socket_turns: counter_vec(
                "relay_socket_turns_total",
                "response.create messages on Responses WebSockets by kind: turn (run through the relay), continued (the socket's previous turn continued: as sent on the upstream socket that holds it, else whole), previous_response_not_found (a store:false continuation of a response this socket did not make), prewarm (generate:false, no upstream call).",
                &["kind"],
            ),
            upstream_sockets: counter_vec(
                "relay_upstream_sockets_total",
                "Socket turns toward the upstream's own Responses WebSocket by event: opened, reused, refused (the upgrade answered an error), resent_whole (a continuation the upstream no longer held), aged (its hour was up), http_no_socket and http_large (the turn went over HTTP).",
                &["event"],
            ),
            unpriced_usage: counter_vec(
                "relay_unpriced_usage_total",
                "Answers with token usage whose model has no price of its own (operator's or catalogue's), by pricing: fallback (charged its family's highest catalogue price) or none (recorded at $0); each model is also logged once.",
                &["pricing"],
            ),
            upstream_seconds: histogram(
                "relay_upstream_seconds",
                "Upstream call duration (to the last byte) by platform.",
            ),
            first_byte_seconds: histogram(
                "relay_upstream_first_byte_seconds",
                "Time to the first upstream byte of streams by platform.",
            ),
            added_seconds: metrics::histogram_vec(
                &registry,
                "relay_added_seconds",
                "Latency the relay adds to a request that reached an upstream: from the request's arrival at the relay (key checked, body read) to its answer head, less the time spent in upstream calls, by platform.",
                &["platform"],
                vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0,
                ],
            ),
            client: poolgate_client::metrics::Metrics::registered_in(registry.clone()),
            registry,
        }
    }

    pub fn failover(&self, reason: &str, outcome: &str) {
        self.failovers.with_label_values(&[reason, outcome]).inc();
    }

    pub fn key_refused(&self, reason: &crate::ports::RefusedFor) {
        self.key_refusals
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    pub fn key_limited(&self, limit: crate::ports::KeyLimit) {
        self.key_refusals.with_label_values(&[limit.as_str()]).inc();
    }

    pub fn upstream_latency(&self, platform: &str, elapsed: Duration) {
        self.upstream_seconds
            .with_label_values(&[platform])
            .observe(elapsed.as_secs_f64());
    }

    pub fn time_to_first_byte(&self, platform: &str, elapsed: Duration) {
        self.first_byte_seconds
            .with_label_values(&[platform])
            .observe(elapsed.as_secs_f64());
    }

    pub fn added_latency(&self, platform: &str, added: Duration) {
        self.added_seconds
            .with_label_values(&[platform])
            .observe(added.as_secs_f64());
    }

    pub fn render(&self) -> String {
        metrics::render(&self.registry)
    }
}
