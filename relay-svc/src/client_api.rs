//! The two client API families and the errors the relay makes itself, in each one's format.

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use poolgate_core::account::Platform;

use crate::ports::{KeyRefused, RefusedFor};

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
    /// The key may not do this (disabled, or outside its endpoint or model list): 403.
    PermissionDenied,
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
            ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
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
            ErrorKind::PermissionDenied => "permission_error",
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
            ErrorKind::PermissionDenied => ("permission_error", "permission_denied"),
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
    /// OpenAI's `code` and `param` when more precise than the kind's (Anthropic's format has
    /// neither).
    pub openai_code: Option<&'static str>,
    pub openai_param: Option<&'static str>,
}

impl RelayError {
    pub fn new(api: Api, kind: ErrorKind, message: impl Into<String>) -> Self {
        RelayError {
            api,
            kind,
            message: message.into(),
            retry_after_secs: None,
            openai_code: None,
            openai_param: None,
        }
    }

    /// A key's request refused (docs/DESIGN.md §6, "What a client key reaches"): disabled, or
    /// outside its endpoint list, 403 `permission_error`; expired, 401 `authentication_error`;
    /// a model outside its list, 403 `permission_error` (Anthropic) or what OpenAI answers for
    /// a model the key cannot reach (404 `model_not_found`).
    pub fn key_refused(api: Api, refused: &KeyRefused) -> Self {
        let message = refused.message.clone();
        let (kind, code) = match &refused.reason {
            RefusedFor::Disabled => (ErrorKind::PermissionDenied, "api_key_disabled"),
            RefusedFor::Expired => (ErrorKind::Authentication, "api_key_expired"),
            RefusedFor::Endpoint => (ErrorKind::PermissionDenied, "endpoint_not_allowed"),
            RefusedFor::Model(model) if api == Api::OpenAi => {
                return RelayError {
                    openai_code: Some("model_not_found"),
                    openai_param: Some("model"),
                    ..RelayError::new(
                        api,
                        ErrorKind::NotFound,
                        format!(
                            "The model `{model}` does not exist or you do not have access to it."
                        ),
                    )
                };
            }
            RefusedFor::Model(_) => (ErrorKind::PermissionDenied, "model_not_allowed"),
        };
        RelayError {
            openai_code: Some(code),
            ..RelayError::new(api, kind, message)
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
                let code = self.openai_code.unwrap_or(code);
                serde_json::json!({
                    "error": {"message": self.message, "type": kind, "param": self.openai_param, "code": code},
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

#[cfg(test)]
mod tests {
    use poolgate_core::keys::KeyRefusal;

    use super::*;

    fn refused(api: Api, refusal: KeyRefusal) -> (StatusCode, serde_json::Value) {
        let error = RelayError::key_refused(api, &refusal.into());
        (error.kind.status(), error.body())
    }

    #[test]
    fn key_refusals_answer_in_each_clients_format_naming_the_reason() {
        let (status, body) = refused(Api::Anthropic, KeyRefusal::Disabled);
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(body["error"]["type"], "permission_error", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("disabled")
        );
        let (status, body) = refused(Api::OpenAi, KeyRefusal::Disabled);
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(body["error"]["type"], "permission_error", "{body}");
        assert_eq!(body["error"]["code"], "api_key_disabled");

        let (status, body) = refused(Api::Anthropic, KeyRefusal::Expired { at_ms: 0 });
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(body["error"]["type"], "authentication_error", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("expired")
        );

        let endpoint = KeyRefusal::EndpointNotAllowed(poolgate_core::keys::Endpoint::Responses);
        let (status, body) = refused(Api::OpenAi, endpoint);
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(body["error"]["code"], "endpoint_not_allowed", "{body}");

        let model = || KeyRefusal::ModelNotAllowed("gpt-4o".into());
        let (status, body) = refused(Api::Anthropic, model());
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(body["error"]["type"], "permission_error", "{body}");
        let (status, body) = refused(Api::OpenAi, model());
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(
            body,
            serde_json::json!({"error": {
                "message": "The model `gpt-4o` does not exist or you do not have access to it.",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }})
        );
    }
}
