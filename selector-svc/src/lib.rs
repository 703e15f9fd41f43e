//! selector-svc: owns the upstream accounts (config and credentials) and their health, and
//! answers "which accounts, in which order, for this request" (docs/DESIGN.md §5).
//!
//! Layers: `grpc` (transport, validation, admin token) → `engine` (select, outcomes, bindings)
//! → `oracle` (load reads) / `health` (a `HealthStore`: Redis, or memory) / `source` (an
//! `AccountSource`: Postgres in `store`, or memory) over a `snapshot` of the config, with the
//! ordering and outcome decisions of `poolgate-core`; `refresh` keeps OAuth tokens fresh.
//!
//! The `postgres` feature (on by default) adds the Postgres store and what is built on it: the
//! gRPC service (`grpc`, `server`) and the binary. Without it the library is the engine over the
//! memory stores, for the relay's standalone mode.

pub mod confirm;
pub mod confirmations;
pub mod crypto;
pub mod domain;
pub mod engine;
#[cfg(feature = "postgres")]
pub mod grpc;
pub mod health;
pub mod metrics;
pub mod oracle;
pub mod refresh;
#[cfg(feature = "postgres")]
pub mod server;
pub mod snapshot;
pub mod source;
#[cfg(feature = "postgres")]
pub mod store;
