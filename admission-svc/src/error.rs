//! The one mapping of admission's errors to gRPC status codes.

use poolgate_lease::error::LeaseError;
use poolgate_proto::convert::ConvertError;

/// A lease error as the gRPC status the caller sees.
pub fn status(error: LeaseError) -> tonic::Status {
    let message = error.to_string();
    match error {
        LeaseError::InvalidArgument { .. } => tonic::Status::invalid_argument(message),
        LeaseError::Protocol(_) => tonic::Status::failed_precondition(message),
        LeaseError::Exhausted(_) => tonic::Status::resource_exhausted(message),
        LeaseError::Unavailable(_) => tonic::Status::unavailable(message),
    }
}

/// A field the proto conversion refused, as the lease error naming it.
pub fn invalid(error: ConvertError) -> LeaseError {
    LeaseError::invalid(error.field, error.problem)
}
