//! relay-svc: the Anthropic- and OpenAI-compatible HTTP front that spreads client requests over
//! the pooled accounts (docs/DESIGN.md §6).
//!
//! `http` (routes, auth, parsing, SSE keep-alive) → `proxy` (the per-request orchestration) over
//! two traits in `backends`: `remote` (gRPC to selector and admission) or `standalone` (all in
//! this process). `session` and `usage` are pure helpers; `fake_upstream` is the
//! project's own fake LLM server (demo mode, tests, benchmarks); `stack` (feature `testing`)
//! starts the whole stack in one process for the integration tests and the bench.

pub mod admin;
pub mod api;
pub mod backends;
pub mod edge;
pub mod fake_upstream;
pub mod http;
pub mod metrics;
pub mod proxy;
pub mod remote;
pub mod server;
pub mod session;
#[cfg(feature = "testing")]
pub mod stack;
pub mod standalone;
pub mod usage;
pub mod usage_sink;
