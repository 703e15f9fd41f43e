//! The client API families (Anthropic's, OpenAI's, Cohere's rerank) and the errors the relay
//! makes itself, in each one's format.

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use poolgate_core::account::Platform;

use crate::ports::{KeyLimit, KeyRefused, RefusedFor};

/// Which API the client speaks (the endpoint decides; it also decides the account platform).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Anthropic,
    OpenAi,
    /// Cohere's rerank (`/v1/rerank`, `/v2/rerank`): errors are `{"message": …}`.
    Cohere,
}

impl Api {
    pub fn platform(self) -> Platform {
        match self {
            Api::Anthropic => Platform::Anthropic,
            Api::OpenAi => Platform::OpenAi,
            Api::Cohere => Platform::Rerank,
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
    /// The client's own limit (user RPM; the key's concurrency and TPM): 429.
    RateLimited,
    /// A spend budget of the client key is used up: 402, a status the official SDKs do not
    /// retry (they retry 408, 409, 429 and >= 500), with `x-should-retry: false` besides.
    BudgetExhausted,
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
            ErrorKind::BudgetExhausted => StatusCode::PAYMENT_REQUIRED,
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
            // Anthropic's type for "out of credits or spend limit reached".
            ErrorKind::BudgetExhausted => "billing_error",
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
            // OpenAI's words for a quota used up (which OpenAI sends as a 429: here a 402, so
            // that no client retries it).
            ErrorKind::BudgetExhausted => ("insufficient_quota", "insufficient_quota"),
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
    /// `x-should-retry` (which the Stainless-generated SDKs obey before any status rule):
    /// `Some(false)` on an answer retrying cannot change.
    pub should_retry: Option<bool>,
    /// When a used-up spend budget resets (`x-poolgate-budget-resets-at`, RFC 3339 UTC).
    pub budget_resets_at_ms: Option<i64>,
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
            should_retry: None,
            budget_resets_at_ms: None,
        }
    }

    /// A key's own admission limit met (docs/DESIGN.md §4): concurrency (after the request
    /// waited like for an account) and TPM answer 429 `rate_limit_error` with `retry-after`; a
    /// used-up spend budget answers 402 (Anthropic `billing_error`, OpenAI
    /// `insufficient_quota`) with `x-should-retry: false` and the time the budget resets, in
    /// the message and in `retry-after` and `x-poolgate-budget-resets-at` (a total budget never
    /// resets: neither header). `retry_after_ms` is admission's (for a budget, the time to
    /// the period's reset; 0 for the total); `now_ms` the relay's clock.
    pub fn key_limit(api: Api, limit: KeyLimit, retry_after_ms: u64, now_ms: i64) -> Self {
        match limit {
            KeyLimit::Budget if retry_after_ms == 0 => RelayError {
                openai_code: Some("insufficient_quota"),
                should_retry: Some(false),
                ..RelayError::new(
                    api,
                    ErrorKind::BudgetExhausted,
                    "this API key's total spend budget is used up; it does not reset (ask the operator for more)",
                )
            },
            KeyLimit::Budget => {
                // To the nearest whole second: a period ends on one, and the relay's clock and
                // admission's (Redis time) differ by a little either way.
                let resets_at_ms = now_ms
                    .saturating_add(i64::try_from(retry_after_ms).unwrap_or(i64::MAX / 2))
                    .saturating_add(500)
                    .div_euclid(1000)
                    .saturating_mul(1000);
                let at = poolgate_core::keys::rfc3339_utc(resets_at_ms);
                RelayError {
                    openai_code: Some("insufficient_quota"),
                    should_retry: Some(false),
                    budget_resets_at_ms: Some(resets_at_ms),
                    ..RelayError::new(
                        api,
                        ErrorKind::BudgetExhausted,
                        format!("this API key's spend budget is used up; it resets at {at}"),
                    )
                }
                .retry_after_ms(retry_after_ms)
            }
            KeyLimit::Tpm => RelayError {
                openai_code: Some("key_tpm_limit_exceeded"),
                ..RelayError::new(
                    api,
                    ErrorKind::RateLimited,
                    "this API key used its tokens-per-minute limit; try again shortly",
                )
            }
            .retry_after_ms(retry_after_ms.max(1000)),
            KeyLimit::Concurrency => RelayError {
                openai_code: Some("key_concurrency_limit_exceeded"),
                ..RelayError::new(
                    api,
                    ErrorKind::RateLimited,
                    "this API key has as many requests in flight as its concurrency limit allows; try again when one finishes",
                )
            }
            .retry_after_ms(retry_after_ms.max(1000)),
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
            // Cohere's error body: the message alone (docs.cohere.com/reference/errors).
            Api::Cohere => serde_json::json!({"message": self.message}),
        }
    }

    /// The same error as an SSE event, for a stream whose status line has gone out.
    pub fn sse_event(&self) -> Bytes {
        match self.api {
            Api::Anthropic => Bytes::from(format!("event: error\ndata: {}\n\n", self.body())),
            Api::OpenAi | Api::Cohere => Bytes::from(format!("data: {}\n\n", self.body())),
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
        if let Some(should_retry) = self.should_retry {
            response.headers_mut().insert(
                "x-should-retry",
                HeaderValue::from_static(if should_retry { "true" } else { "false" }),
            );
        }
        if let Some(at_ms) = self.budget_resets_at_ms
            && let Ok(value) = HeaderValue::from_str(&poolgate_core::keys::rfc3339_utc(at_ms))
        {
            response
                .headers_mut()
                .insert("x-poolgate-budget-resets-at", value);
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
    #[test]
    fn key_limits_answer_429_with_retry_after_and_a_budget_402_that_says_do_not_retry() {
        let now = 1_796_227_745_000; // 2026-12-02T16:09:05Z
        let headers = |error: RelayError| {
            let response = error.into_response();
            let get = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .map(|v| v.to_str().unwrap().to_owned())
            };
            (
                response.status(),
                get("retry-after"),
                get("x-should-retry"),
                get("x-poolgate-budget-resets-at"),
            )
        };
        for limit in [KeyLimit::Concurrency, KeyLimit::Tpm] {
            let error = RelayError::key_limit(Api::Anthropic, limit, 2500, now);
            assert_eq!(error.body()["error"]["type"], "rate_limit_error");
            assert_eq!(
                headers(error),
                (StatusCode::TOO_MANY_REQUESTS, Some("3".into()), None, None)
            );
        }
        let tpm = RelayError::key_limit(Api::OpenAi, KeyLimit::Tpm, 0, now);
        assert_eq!(tpm.body()["error"]["code"], "key_tpm_limit_exceeded");
        assert!(tpm.message.contains("tokens-per-minute"), "names the limit");

        // The day's budget, 7 h 50 min 55 s before midnight UTC.
        let day = RelayError::key_limit(Api::Anthropic, KeyLimit::Budget, 28_255_000, now);
        assert_eq!(
            day.body()["error"]["type"],
            "billing_error",
            "{}",
            day.body()
        );
        assert!(
            day.message.contains("budget") && day.message.contains("2026-12-03T00:00:00Z"),
            "{}",
            day.message
        );
        assert_eq!(
            headers(day),
            (
                StatusCode::PAYMENT_REQUIRED,
                Some("28255".into()),
                Some("false".into()),
                Some("2026-12-03T00:00:00Z".into())
            )
        );
        // The relay's clock a little ahead of admission's, or behind it: the same reset.
        for skew in [-300, 300] {
            let retry = u64::try_from(28_255_000 - skew).unwrap();
            let skewed = RelayError::key_limit(Api::Anthropic, KeyLimit::Budget, retry, now + skew);
            assert_eq!(
                skewed.budget_resets_at_ms,
                Some(1_796_256_000_000),
                "{skew}"
            );
        }
        let total = RelayError::key_limit(Api::OpenAi, KeyLimit::Budget, 0, now);
        let body = total.body();
        assert_eq!(
            (&body["error"]["type"], &body["error"]["code"]),
            (
                &serde_json::json!("insufficient_quota"),
                &serde_json::json!("insufficient_quota")
            )
        );
        assert!(
            total.message.contains("does not reset"),
            "{}",
            total.message
        );
        assert_eq!(
            headers(total),
            (
                StatusCode::PAYMENT_REQUIRED,
                None,
                Some("false".into()),
                None
            )
        );
    }
}
