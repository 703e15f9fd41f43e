//! The admission vocabulary: lease terms, denials and money from `poolgate-core`, under one name
//! inside this crate.

pub use poolgate_core::lease::*;
pub use poolgate_core::money::*;
pub use poolgate_core::{AccountId, MAX_NAME_BYTES, millis};
