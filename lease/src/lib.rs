//! poolgate-lease: the admission engine as a library. It decides whether one more request may go
//! to one upstream account now, and holds that decision as a lease for as long as the request
//! runs (docs/DESIGN.md §4). Transport-free: admission-svc serves it over gRPC, the relay's
//! standalone mode and the selector's probe embed it.
//!
//! Layers, outside in: `channel` (many lease conversations on one stream, each served by
//! `session`) → `session` (the lease stream protocol, in domain terms) → `engine` (waits,
//! release retries, orphaning) → `backend` (`memory`, or `redis_backend` behind the failure
//! `policy`). `start` is the one constructor.

pub mod api;
pub mod backend;
pub mod calendar;
pub mod channel;
pub mod engine;
pub mod error;
pub mod memory;
pub mod metrics;
pub mod policy;
mod ports;
pub mod redis_backend;
pub mod session;
pub mod start;

pub use engine::{AcquireOutcome, LeaseEngine};
pub use start::{LeaseStore, in_memory, start};
