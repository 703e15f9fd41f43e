//! Outcome classification lives in the selector library (`selector_svc::classify`), because its
//! confirmation probe classifies with the same rules; the relay uses it from there.

pub use selector_svc::classify::*;
