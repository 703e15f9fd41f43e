//! One tower layer for every poolgate gRPC server: requests by method and code, requests in
//! flight by method, and a duration histogram by method (for a lease stream: the whole stream).
//! The code is read from the response head (`grpc-status`, sent there for every error a handler
//! returns); a response without one counts as `OK`.
//!
//! A server labels only the methods it serves ([`ServedMethods`], read from the protos): the
//! path of a request comes from whoever connects, before any authentication, so every other
//! path is counted as `unknown` — refused calls stay visible and the series count stays fixed.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec, Registry};

use poolgate_runtime::metrics::{counter_vec, gauge_vec, histogram_vec};

/// The label of every path a server does not serve.
pub const UNKNOWN_METHOD: &str = "unknown";

/// The RPCs a server serves, by full path (`/package.Service/Method`), each with its label
/// (`Service/Method`): the only method labels its metrics take.
#[derive(Clone, Debug, Default)]
pub struct ServedMethods {
    labels: Arc<HashMap<String, String>>,
}

impl ServedMethods {
    /// Every method of the named services (`package.Service`, as tonic's `NamedService::NAME`
    /// spells them) in the encoded file descriptor sets (`FILE_DESCRIPTOR_SET` of the protos).
    ///
    /// The sets are compiled into the binary and the names are the server's own: a set that does
    /// not decode, or a service no set describes, is a programming error every server start
    /// (and so every test) hits, hence a panic.
    pub fn from_descriptors(descriptor_sets: &[&[u8]], services: &[&str]) -> Self {
        use prost::Message;
        let mut labels = HashMap::new();
        let mut found = Vec::new();
        for encoded in descriptor_sets {
            let set = prost_types::FileDescriptorSet::decode(*encoded)
                .expect("a compiled-in file descriptor set decodes");
            for file in &set.file {
                for service in &file.service {
                    let full = match file.package() {
                        "" => service.name().to_owned(),
                        package => format!("{package}.{}", service.name()),
                    };
                    if !services.contains(&full.as_str()) {
                        continue;
                    }
                    for method in &service.method {
                        labels.insert(
                            format!("/{full}/{}", method.name()),
                            format!("{}/{}", service.name(), method.name()),
                        );
                    }
                    found.push(full);
                }
            }
        }
        for service in services {
            assert!(
                found.iter().any(|f| f == service),
                "no descriptor set describes the served service {service}"
            );
        }
        ServedMethods {
            labels: Arc::new(labels),
        }
    }

    /// The label of a request's path: its method's, or [`UNKNOWN_METHOD`].
    pub fn label(&self, path: &str) -> &str {
        self.labels
            .get(path)
            .map(String::as_str)
            .unwrap_or(UNKNOWN_METHOD)
    }

    /// The labels of every served method.
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.labels.values().map(String::as_str)
    }
}

#[derive(Clone)]
pub struct GrpcMetrics {
    requests: IntCounterVec,
    in_flight: IntGaugeVec,
    seconds: HistogramVec,
    /// Server side: the methods it serves (every other path is `unknown`). Client side `None`:
    /// the paths are the ones this process's own generated clients call.
    served: Option<ServedMethods>,
}

impl GrpcMetrics {
    /// Registers `grpc_server_*` metrics in `registry`, labelled with the `served` methods only.
    pub fn new(registry: &Registry, served: ServedMethods) -> Self {
        Self::with_side(registry, "server", Some(served))
    }

    /// Registers `grpc_client_*` metrics in `registry` (for a service's outgoing calls).
    pub fn client(registry: &Registry) -> Self {
        Self::with_side(registry, "client", None)
    }

    fn with_side(registry: &Registry, side: &str, served: Option<ServedMethods>) -> Self {
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
            served,
        }
    }

    fn label(&self, path: &str) -> String {
        match &self.served {
            Some(served) => served.label(path).to_owned(),
            None => method_label(path),
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

/// Client side: `/pkg.Service/Method` → `Service/Method` (the paths are this process's own
/// calls; anything malformed or overlong is `unknown`).
fn method_label(path: &str) -> String {
    let trimmed = path.trim_start_matches('/');
    match trimmed.split_once('/') {
        Some((service, method)) if trimmed.len() <= 128 => {
            let service = service.rsplit('.').next().unwrap_or(service);
            format!("{service}/{method}")
        }
        _ => UNKNOWN_METHOD.to_owned(),
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
        let method = self.metrics.label(request.uri().path());
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
    use super::{ServedMethods, UNKNOWN_METHOD, method_label};

    /// A descriptor set of one file, package `demo.v1`, services `Greeter` (`Hello`, `Bye`) and
    /// `Other` (`Call`).
    fn demo_set() -> Vec<u8> {
        use prost::Message;
        use prost_types::{
            FileDescriptorProto, FileDescriptorSet, MethodDescriptorProto, ServiceDescriptorProto,
        };
        let method = |name: &str| MethodDescriptorProto {
            name: Some(name.to_owned()),
            ..Default::default()
        };
        let service = |name: &str, methods: &[&str]| ServiceDescriptorProto {
            name: Some(name.to_owned()),
            method: methods.iter().map(|m| method(m)).collect(),
            ..Default::default()
        };
        FileDescriptorSet {
            file: vec![FileDescriptorProto {
                name: Some("demo.proto".into()),
                package: Some("demo.v1".into()),
                service: vec![
                    service("Greeter", &["Hello", "Bye"]),
                    service("Other", &["Call"]),
                ],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    }

    #[test]
    fn a_server_labels_only_the_methods_of_the_services_it_serves() {
        let set = demo_set();
        let served = ServedMethods::from_descriptors(&[&set], &["demo.v1.Greeter"]);
        assert_eq!(served.label("/demo.v1.Greeter/Hello"), "Greeter/Hello");
        assert_eq!(served.label("/demo.v1.Greeter/Bye"), "Greeter/Bye");
        // Another service of the same protos, an unknown method of a served one, a lookalike.
        for path in [
            "/demo.v1.Other/Call",
            "/demo.v1.Greeter/Nope",
            "/x.Greeter/Hello",
            "/demo.v1.Greeter/Hello/",
            "",
            "nonsense",
        ] {
            assert_eq!(served.label(path), UNKNOWN_METHOD, "{path}");
        }
        let mut labels: Vec<_> = served.labels().collect();
        labels.sort_unstable();
        assert_eq!(labels, ["Greeter/Bye", "Greeter/Hello"]);
    }

    #[test]
    #[should_panic(expected = "demo.v1.Missing")]
    fn a_served_service_no_descriptor_describes_is_a_programming_error() {
        let set = demo_set();
        ServedMethods::from_descriptors(&[&set], &["demo.v1.Greeter", "demo.v1.Missing"]);
    }

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
