//! One test binary for this crate: each file beside this one is a module of it.
//! One binary links once, where a binary per file linked the whole service each time;
//! nextest still runs every test in a process of its own.

mod support;

mod account_services;
mod admin_repairs;
mod admin_status;
mod admin_windows;
mod classification;
mod config_and_tokens;
mod health_suite;
mod hostile_grpc_callers;
mod key_access;
mod key_limits;
mod key_usage_calendar;
mod load_cache;
mod memory_source;
mod newer_values;
mod outcomes;
mod prices;
mod probe_leases;
mod probe_model;
mod response_bindings;
mod schema_and_keys;
mod schema_releases;
mod service_auth;
mod state_file_writes;
mod status_gauges;
mod token_endpoints;
mod usage_retention;
mod windows_state_file;
