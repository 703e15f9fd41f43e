//! poolgate-rpc: what every gRPC process needs and no service owns. The gRPC metrics layer,
//! service identity (a token or mutual TLS), TLS files, and telemetry (tracing, OpenTelemetry
//! export, W3C trace context in gRPC metadata). The engines never link it: they build without
//! tonic.

pub mod grpc_metrics;
pub mod service_auth;
pub mod telemetry;
pub mod tls;
