//! The two client API families and the errors the relay makes itself, in each one's format.

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use poolgate_core::account::Platform;

/// Which API the client speaks (the endpoint decides; it also decides the account platform).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Anthropic,
    OpenAi,
}

impl Api {
    pub fn platform(self) -> Platform {
        match self {
            Api::Anthropic => Platform::Anthropic,
            Api::OpenAi => Platform::OpenAi,
        }
    }
}

/// The kinds of error the relay makes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidRequest,
    Authentication,
    NotFound,
    /// The client's own limit (user RPM): 429.
    RateLimited,
    /// The pool had no capacity in time: 503.
    Overloaded,
    /// Something broke on our side or upstream without an answer to pass on: 502.
    Upstream,
}

impl ErrorKind {
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Upstream => StatusCode::BAD_GATEWAY,
        }
    }

    fn anthropic_type(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::RateLimited => "rate_limit_error",
            ErrorKind::Overloaded => "overloaded_error",
            ErrorKind::Upstream => "api_error",
        }
    }

    fn openai_type(self) -> (&'static str, &'static str) {
        match self {
            ErrorKind::InvalidRequest => ("invalid_request_error", "invalid_request"),
            ErrorKind::Authentication => ("authentication_error", "invalid_api_key"),
            ErrorKind::NotFound => ("invalid_request_error", "not_found"),
            ErrorKind::RateLimited => ("rate_limit_error", "rate_limit_exceeded"),
            ErrorKind::Overloaded => ("server_error", "pool_overloaded"),
            ErrorKind::Upstream => ("server_error", "upstream_error"),
        }
    }
}

/// A relay-made error: status, client-format JSON, and `retry-after` when known.
#[derive(Debug, Clone)]
pub struct RelayError {
    pub api: Api,
    pub kind: ErrorKind,
    pub message: String,
    pub retry_after_secs: Option<u64>,
}

impl RelayError {
    pub fn new(api: Api, kind: ErrorKind, message: impl Into<String>) -> Self {
        RelayError {
            api,
            kind,
            message: message.into(),
            retry_after_secs: None,
        }
    }

    pub fn retry_after_ms(mut self, ms: u64) -> Self {
        self.retry_after_secs = Some(ms.div_ceil(1000).max(1));
        self
    }

    pub fn body(&self) -> serde_json::Value {
        match self.api {
            Api::Anthropic => serde_json::json!({
                "type": "error",
                "error": {"type": self.kind.anthropic_type(), "message": self.message},
            }),
            Api::OpenAi => {
                let (kind, code) = self.kind.openai_type();
                serde_json::json!({
                    "error": {"message": self.message, "type": kind, "param": null, "code": code},
                })
            }
        }
    }

    /// The same error as an SSE event, for a stream whose status line has gone out.
    pub fn sse_event(&self) -> Bytes {
        match self.api {
            Api::Anthropic => Bytes::from(format!("event: error\ndata: {}\n\n", self.body())),
            Api::OpenAi => Bytes::from(format!("data: {}\n\n", self.body())),
        }
    }
}

impl IntoResponse for RelayError {
    fn into_response(self) -> Response {
        let mut response = (self.kind.status(), axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after_secs
            && let Ok(value) = HeaderValue::from_str(&secs.to_string())
        {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, value);
        }
        response
    }
}
