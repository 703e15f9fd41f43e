//! admission-svc: the lease engine (`poolgate-lease`) served over gRPC (docs/DESIGN.md §4).
//!
//! `grpc` (transport, validation, the proto conversions of `poolgate-proto`) → the engine;
//! `error` is the one map from the engine's errors to gRPC codes; `server` the wiring.

pub mod error;
pub mod grpc;
pub mod server;

pub use server::{Config, run};
