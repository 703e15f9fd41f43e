//! poolgate-runtime: what every poolgate process needs and no service owns. The Redis connection
//! and its clock, the storage error, telemetry (tracing, OpenTelemetry, context propagation),
//! the gRPC metrics layer, service identity (token or mutual TLS), secret flags and the cost of
//! a wrong admin token, TLS files, the shutdown signal, Prometheus helpers.

pub mod clock;
pub mod error;
pub mod failed_auth;
pub mod grpc_metrics;
pub mod metrics;
pub mod redis;
pub mod secret_flags;
pub mod service_auth;
pub mod shutdown;
pub mod telemetry;
pub mod tls;
