//! poolgate-rpc: what every gRPC process needs and no service owns. The gRPC metrics layer,
//! service identity (a token or mutual TLS), TLS files, telemetry (tracing, OpenTelemetry
//! export, W3C trace context in gRPC metadata), the `/metrics` HTTP server and the binaries'
//! exit statuses. The engines never link it: they build without tonic.

pub mod exit;
pub mod grpc_metrics;
pub mod metrics_http;
pub mod service_auth;
pub mod telemetry;
pub mod tls;
