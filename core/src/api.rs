//! The error of the engines' APIs (`poolgate_select::api::SelectionApi`,
//! `poolgate_lease::api::LeaseApi`), the same whichever implementation answered: the engine in
//! process, or its service over gRPC. A caller degrades on it (answers 503, keeps serving),
//! never panics, and decides on the variant, never on the words.

/// A backend that did not answer usefully.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The request was refused as invalid, naming the field.
    #[error("invalid {field}: {message}")]
    Invalid { field: String, message: String },
    /// The thing asked about does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The backend's answer holds a value this build cannot read (an unknown enum value): an
    /// error of that backend, never a guess at what it meant.
    #[error("unreadable answer: {0}")]
    Unreadable(String),
    /// The backend (or its storage) is down or refused for a reason of its own.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The call ended without an answer.
    #[error("no answer: {0}")]
    NoAnswer(&'static str),
}
