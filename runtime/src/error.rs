//! The storage error every service shares, translated once from the client's error type.

use thiserror::Error;

/// A backend failure, already translated from the storage client's error type. Messages never
/// carry credentials (the Redis URL's password is never formatted into them).
#[derive(Debug, Clone, Error)]
pub enum BackendError {
    /// The operation did not answer in time; it may or may not have been applied.
    #[error("backend timed out")]
    Timeout,
    #[error("backend error: {0}")]
    Failed(String),
}

impl From<redis::RedisError> for BackendError {
    fn from(error: redis::RedisError) -> Self {
        // `RedisError`'s display holds the command's error text and kind, never the URL.
        BackendError::Failed(format!(
            "{:?}: {}",
            error.kind(),
            error.detail().unwrap_or("")
        ))
    }
}
