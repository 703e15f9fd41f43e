//! admission-svc: decides whether one more request may go to one upstream account now, and holds
//! that decision as a lease for as long as the request runs (DESIGN §4).
//!
//! Layers, outside in: `grpc` (transport and validation) → `session` (the lease stream
//! protocol) → `admission` (the engine) → `backend` (`memory` or `redis_backend`).

pub mod admission;
pub mod backend;
pub mod domain;
pub mod error;
pub mod grpc;
pub mod memory;
pub mod metrics;
pub mod policy;
pub mod redis_backend;
pub mod server;
pub mod session;

pub use server::{BackendConfig, Config, run};
