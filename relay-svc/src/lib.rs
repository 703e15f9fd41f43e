//! relay-svc: the Anthropic- and OpenAI-compatible HTTP front that spreads client requests over
//! the pooled accounts (docs/DESIGN.md §6).
//!
//! `http` (routes, auth, parsing, SSE keep-alive) → `proxy` (the per-request orchestration) over
//! the engines' two APIs (`ports`: `poolgate_select::api::SelectionApi`,
//! `poolgate_lease::api::LeaseApi`), implemented by the engines in this process (`standalone`
//! builds them) or by their gRPC clients (`poolgate-client`, re-exported as `remote`). The
//! relay does not know which. `session` and `usage` are pure helpers.
//!
//! A process: `cli` (the flags) → [`run`] (the relay on its listeners, and in standalone mode the
//! admin endpoint and the state file's last write); `admin_client` is the `admin` subcommand.

pub mod admin;
pub mod admin_client;
pub mod admin_page;
pub mod cli;
pub mod client_api;
pub mod edge;
pub mod http;
pub mod metrics;
pub mod ports;
pub mod proxy;
pub mod run;
pub mod server;
pub mod session;
pub mod standalone;
pub mod usage;
pub mod usage_sink;

pub use run::run;

/// The gRPC clients of the two APIs (distributed mode).
pub use poolgate_client as remote;
