//! What a gRPC call of these clients ended with when it did not answer usefully: kept with the
//! gRPC code inside the crate (whether another replica is worth a try depends on it), turned into
//! the APIs' [`ApiError`] at their edge.

use poolgate_core::api::ApiError;
use poolgate_proto::convert::ConvertError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The service answered with a gRPC error.
    #[error("{code:?}: {message}")]
    Status { code: tonic::Code, message: String },
    /// The answer holds a value this build cannot read (an unknown enum value): an error of
    /// that service, never a guess at what it meant.
    #[error("unreadable answer: {0}")]
    Convert(#[from] ConvertError),
    /// The call ended without an answer.
    #[error("no answer: {0}")]
    NoAnswer(&'static str),
}

impl From<tonic::Status> for CallError {
    fn from(status: tonic::Status) -> Self {
        CallError::Status {
            code: status.code(),
            message: status.message().to_owned(),
        }
    }
}

impl From<CallError> for ApiError {
    fn from(error: CallError) -> Self {
        match error {
            CallError::Status {
                code: tonic::Code::InvalidArgument,
                message,
            } => ApiError::Invalid {
                field: String::new(),
                message,
            },
            CallError::Status {
                code: tonic::Code::NotFound,
                message,
            } => ApiError::NotFound(message),
            CallError::Status { code, message } => {
                ApiError::Unavailable(format!("{code:?}: {message}"))
            }
            CallError::Convert(error) => ApiError::Unreadable(error.to_string()),
            CallError::NoAnswer(why) => ApiError::NoAnswer(why),
        }
    }
}

/// A gRPC error status as the APIs' error.
pub fn api_error(status: tonic::Status) -> ApiError {
    CallError::from(status).into()
}
