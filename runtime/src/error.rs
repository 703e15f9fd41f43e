//! The error of the state backends (Redis, or memory where a backend can fail), which every
//! engine shares, translated once from the client's error type. (The relay's `BackendError` is
//! another thing: a selection or lease backend's answer, gRPC or in process.)

use thiserror::Error;

/// A backend failure, already translated from the storage client's error type. Messages never
/// carry credentials (the Redis URL's password is never formatted into them).
#[derive(Debug, Clone, Error)]
pub enum StateError {
    /// The operation did not answer in time; it may or may not have been applied.
    #[error("backend timed out")]
    Timeout,
    #[error("backend error: {0}")]
    Failed(String),
}

impl From<redis::RedisError> for StateError {
    fn from(error: redis::RedisError) -> Self {
        // `RedisError`'s display holds the command's error text and kind, never the URL.
        StateError::Failed(format!(
            "{:?}: {}",
            error.kind(),
            error.detail().unwrap_or("")
        ))
    }
}
