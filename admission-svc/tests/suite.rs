//! One test binary for this crate: each file beside this one is a module of it.
//! One binary links once, where a binary per file linked the whole service each time;
//! nextest still runs every test in a process of its own.

mod support;

mod bad_input;
mod failure_policy;
mod hostile_callers;
mod lease_channel;
mod lease_model;
mod lease_suite;
mod many_replicas;
mod redis_behaviour;
mod service_auth;
mod wake_across_replicas;
