//! The admission error type and its one mapping to gRPC status codes.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum AdmissionError {
    /// Bad input; the message names the field.
    #[error("invalid {field}: {message}")]
    InvalidArgument { field: String, message: String },
    /// The stream broke the lease protocol (e.g. a second `Acquire`).
    #[error("lease protocol violation: {0}")]
    Protocol(String),
    /// The backend could not answer (Redis down, timed out).
    #[error("backend unavailable: {0}")]
    Unavailable(#[from] BackendError),
}

impl AdmissionError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        AdmissionError::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<AdmissionError> for tonic::Status {
    fn from(error: AdmissionError) -> Self {
        let message = error.to_string();
        match error {
            AdmissionError::InvalidArgument { .. } => tonic::Status::invalid_argument(message),
            AdmissionError::Protocol(_) => tonic::Status::failed_precondition(message),
            AdmissionError::Unavailable(_) => tonic::Status::unavailable(message),
        }
    }
}

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
