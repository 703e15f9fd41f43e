//! The one mapping of the selection engine's errors to gRPC status codes, and of a client key
//! refused as a whole.

use poolgate_core::keys::KeyRefusal;
use poolgate_proto::convert::keys::key_refusal_status;
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

/// A key refused as a whole (disabled, expired): `PERMISSION_DENIED` naming why, in its message
/// and in the `poolgate-key-refusal` metadata entry the relay reads (docs/DESIGN.md §6).
pub fn key_refused(refusal: &KeyRefusal) -> tonic::Status {
    // `check_key` refuses only the key as a whole; a refusal of one request has no entry.
    key_refusal_status(refusal)
        .unwrap_or_else(|| tonic::Status::permission_denied(refusal.message()))
}
