//! The lease engine's error: what a lease stream can fail with. Transport-free; admission-svc
//! maps it to gRPC status codes in one place (`admission-svc/src/error.rs`).

use poolgate_runtime::error::StateError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum LeaseError {
    /// Bad input; the message names the field.
    #[error("invalid {field}: {message}")]
    InvalidArgument { field: String, message: String },
    /// The stream broke the lease protocol (e.g. a second `Acquire`).
    #[error("lease protocol violation: {0}")]
    Protocol(String),
    /// A bound on what one caller may hold open was reached (the conversations of one lease
    /// channel).
    #[error("too many: {0}")]
    Exhausted(String),
    /// The backend could not answer (Redis down, timed out).
    #[error("backend unavailable: {0}")]
    Unavailable(#[from] StateError),
}

impl LeaseError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        LeaseError::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }
}
