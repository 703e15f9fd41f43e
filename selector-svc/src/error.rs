//! The one mapping of the selection engine's errors to gRPC status codes.

use poolgate_select::engine::SelectorError;

/// A selection error as the gRPC status the caller sees.
pub fn status(error: SelectorError) -> tonic::Status {
    let message = error.to_string();
    match error {
        SelectorError::InvalidArgument { .. } => tonic::Status::invalid_argument(message),
        SelectorError::NotFound(_) => tonic::Status::not_found(message),
        SelectorError::Unauthenticated(_) => tonic::Status::unauthenticated(message),
        SelectorError::Conflict(_) => tonic::Status::already_exists(message),
        SelectorError::Unavailable(_) => tonic::Status::unavailable(message),
    }
}
