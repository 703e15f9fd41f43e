//! One tower layer for every poolgate gRPC server: requests by method and code, requests in
//! flight by method, and a duration histogram by method (for a lease stream: the whole stream).
//! The code is read from the response head (`grpc-status`, sent there for every error a handler
//! returns); a response without one counts as `OK`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec, Registry};

use crate::metrics::{counter_vec, gauge_vec, histogram_vec};

#[derive(Clone)]
pub struct GrpcMetrics {
    requests: IntCounterVec,
    in_flight: IntGaugeVec,
    seconds: HistogramVec,
}

impl GrpcMetrics {
    /// Registers `grpc_server_*` metrics in `registry`.
    pub fn new(registry: &Registry) -> Self {
        Self::with_side(registry, "server")
    }

    /// Registers `grpc_client_*` metrics in `registry` (for a service's outgoing calls).
    pub fn client(registry: &Registry) -> Self {
        Self::with_side(registry, "client")
    }

    fn with_side(registry: &Registry, side: &str) -> Self {
        let requests = counter_vec(
            registry,
            &format!("grpc_{side}_requests_total"),
            "gRPC requests by method and status code.",
            &["method", "code"],
        );
        let in_flight = gauge_vec(
            registry,
            &format!("grpc_{side}_in_flight"),
            "gRPC requests (and open streams) in flight by method.",
            &["method"],
        );
        let seconds = histogram_vec(
            registry,
            &format!("grpc_{side}_duration_seconds"),
            "gRPC request duration by method (until the response head).",
            &["method"],
            vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
            ],
        );
        GrpcMetrics {
            requests,
            in_flight,
            seconds,
        }
    }
}

impl<S> tower::Layer<S> for GrpcMetrics {
    type Service = GrpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService {
            inner,
            metrics: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct GrpcMetricsService<S> {
    inner: S,
    metrics: GrpcMetrics,
}

/// `/pkg.Service/Method` → `Service/Method` (bounded: only known routes reach handlers; unknown
/// paths are folded into one label).
fn method_label(path: &str) -> String {
    let trimmed = path.trim_start_matches('/');
    match trimmed.split_once('/') {
        Some((service, method)) if trimmed.len() <= 128 => {
            let service = service.rsplit('.').next().unwrap_or(service);
            format!("{service}/{method}")
        }
        _ => "unknown".to_owned(),
    }
}

impl<S, B, R> tower::Service<http::Request<B>> for GrpcMetricsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = method_label(request.uri().path());
        let metrics = self.metrics.clone();
        let future = self.inner.call(request);
        Box::pin(async move {
            let started = Instant::now();
            let gauge = metrics.in_flight.with_label_values(&[&method]);
            gauge.inc();
            let result = future.await;
            gauge.dec();
            metrics
                .seconds
                .with_label_values(&[&method])
                .observe(started.elapsed().as_secs_f64());
            let code = match &result {
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map(|code| format!("{:?}", tonic::Code::from_i32(code)))
                    .unwrap_or_else(|| "Ok".to_owned()),
                Err(_) => "TransportError".to_owned(),
            };
            metrics.requests.with_label_values(&[&method, &code]).inc();
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::method_label;

    #[test]
    fn method_labels_are_short_and_bounded() {
        assert_eq!(
            method_label("/poolgate.admission.v1.Admission/Lease"),
            "Admission/Lease"
        );
        assert_eq!(method_label("/grpc.health.v1.Health/Check"), "Health/Check");
        assert_eq!(method_label("nonsense"), "unknown");
        assert_eq!(method_label(&format!("/a/{}", "x".repeat(300))), "unknown");
    }
}
