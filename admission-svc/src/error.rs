//! The admission error type and its one mapping to gRPC status codes.

use poolgate_runtime::error::BackendError;
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
