//! Building and registering Prometheus metrics whose definitions are static.
//!
//! A static definition that prometheus refuses is a programming error caught by every test that
//! builds the metrics; registering twice in one registry is ignored (the metric still counts).

use prometheus::core::Collector;
use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

fn register<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    let _ = registry.register(Box::new(metric.clone()));
    metric
}

fn built<M>(name: &str, metric: prometheus::Result<M>) -> M {
    metric.unwrap_or_else(|error| unreachable!("static metric definition {name}: {error}"))
}

pub fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(registry, built(name, IntCounter::new(name, help)))
}

pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        registry,
        built(name, IntCounterVec::new(Opts::new(name, help), labels)),
    )
}

pub fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(registry, built(name, IntGauge::new(name, help)))
}

pub fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(
        registry,
        built(name, IntGaugeVec::new(Opts::new(name, help), labels)),
    )
}

/// A gauge vector of fractional values (shares, sums of shares).
pub fn float_gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    register(
        registry,
        built(name, GaugeVec::new(Opts::new(name, help), labels)),
    )
}

pub fn histogram(registry: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    register(
        registry,
        built(
            name,
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)),
        ),
    )
}

pub fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    register(
        registry,
        built(
            name,
            HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels),
        ),
    )
}

/// The registry's metrics in the text exposition format.
pub fn render(registry: &Registry) -> String {
    prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap_or_else(|error| format!("# metrics encoding failed: {error}\n"))
}
