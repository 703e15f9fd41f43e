//! selector-svc: owns the upstream accounts (config and credentials in Postgres) and their health
//! (Redis), and answers "which accounts, in which order, for this request" (docs/DESIGN.md §5).
//!
//! Layers: `grpc` (transport, validation, admin token) → `engine` (select, outcomes, bindings)
//! → `select` (ordering, pure) / `oracle` (load reads) / `health` (Redis) / `store` (Postgres)
//! over a `snapshot` of the config; `refresh` keeps OAuth tokens fresh.

pub mod confirm;
pub mod crypto;
pub mod domain;
pub mod engine;
pub mod grpc;
pub mod health;
pub mod metrics;
pub mod oracle;
pub mod refresh;
pub mod server;
pub mod snapshot;
pub mod store;
