//! Building blocks for the relay's integration tests: the in-process stack
//! (`poolgate_stack`, shared with the relay bench) and the service binaries as processes.

#![allow(dead_code, unused_imports)]

pub mod processes;
pub mod recording_hop;

pub use poolgate_stack::*;
