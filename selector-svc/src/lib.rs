//! selector-svc: the selection engine (`poolgate-select`) served over gRPC, with the accounts in
//! Postgres (docs/DESIGN.md §5).
//!
//! `grpc` (transport, validation, admin token, the conversions of `poolgate-proto`) → the
//! engine; `error` is the one map from the engine's errors to gRPC codes; `store` is the only
//! SQL (the Postgres `AccountSource`); `server` the wiring; `budgets` rebuilds the budget
//! counters Redis lost from the usage ledger (the status page on `--admin-http-listen` is
//! `poolgate-operator`'s, over the engine's admin API the admin service serves); `migration_rules` holds the upgrade rules every
//! migration follows (each records the oldest release that runs on its schema, which the store's
//! schema check reads) and `release` compares release numbers.

pub mod budgets;
pub mod error;
pub mod grpc;
pub mod migration_rules;
pub mod release;
pub mod retention;
pub mod server;
pub mod store;
