//! relay-svc: the Anthropic- and OpenAI-compatible HTTP front that spreads client requests over
//! the pooled accounts (DESIGN §6).
//!
//! `http` (routes, auth, parsing, SSE keep-alive) → `proxy` (the per-request orchestration) over
//! two traits in `backends`: `remote` (gRPC to selector and admission) or `standalone` (all in
//! this process). `classify`, `session` and `usage` are pure helpers; `fake_upstream` is the
//! project's own fake LLM server (demo mode, tests, benchmarks).

pub mod admin;
pub mod api;
pub mod backends;
pub mod fake_upstream;
pub mod http;
pub mod metrics;
pub mod proxy;
pub mod remote;
pub mod server;
pub mod session;
pub mod standalone;
pub mod usage;
pub mod usage_sink;
