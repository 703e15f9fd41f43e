//! One test binary for this crate: each file beside this one is a module of it.
//! One binary links once, where a binary per file linked the whole service each time;
//! nextest still runs every test in a process of its own.

mod both_endpoints;
mod page_tls;
