//! One test binary for this crate: each file beside this one is a module of it.
//! One binary links once, where a binary per file linked the whole service each time;
//! nextest still runs every test in a process of its own.

mod common;
mod support;

mod admin_token_attempts;
mod backup_restore;
mod behaviour;
mod chaos;
mod clis;
mod dashboard_metrics;
mod distributed;
mod edge_view;
mod edges;
mod embeddings_rerank;
mod grpc_tls;
mod health_evidence;
mod hostile;
mod incomplete;
mod key_access;
mod key_limits;
mod key_limits_system;
mod lease_channels;
mod lease_lost;
mod model_limits;
mod no_secrets_in_logs;
mod ports_suite;
mod prices;
mod processes;
mod properties;
mod redis_bounds;
mod refresh_race;
mod release;
mod responses_socket;
mod run;
mod sdk;
mod selector_outage;
mod shutdown;
mod sign_in;
mod socket_kill;
mod standalone;
mod standalone_state;
mod status_page;
mod status_page_browser;
mod status_page_sign_in;
mod trace_propagation;
mod windows_persist;
