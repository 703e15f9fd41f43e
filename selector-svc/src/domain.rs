//! The selector vocabulary: accounts, credentials, outcomes and their settings from
//! `poolgate-core`, under one name inside this crate.

pub use poolgate_core::account::*;
pub use poolgate_core::outcome::{Outcome, OutcomeClass, RuntimeBlockSettings};
pub use poolgate_core::{AccountId, MAX_NAME_BYTES, millis, now_ms};
