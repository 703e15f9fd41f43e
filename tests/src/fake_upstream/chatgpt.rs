//! The ChatGPT backend: its Codex endpoint's checks, and the access tokens ChatGPT's sign-in
//! issues.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::answer::{Shape, answer_via};
use super::windows::{self, Dialect};
use super::{FakeState, Via, credential};

/// An access token as ChatGPT's sign-in issues them (unsigned here): a JWT whose
/// `https://api.openai.com/auth` claim names the ChatGPT account.
pub fn fake_chatgpt_token(account_id: &str) -> String {
    use base64::Engine;
    let encode = |value: Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string().as_bytes())
    };
    format!(
        "{}.{}.fake-signature",
        encode(json!({"alg": "none", "typ": "JWT"})),
        encode(
            json!({"https://api.openai.com/auth": {"chatgpt_account_id": account_id}, "exp": 4_102_444_800u64})
        )
    )
}

/// The ChatGPT backend's Codex endpoint: refuses what the real one is shown to refuse (each
/// rule's public source: docs/SUBSCRIPTIONS.md, "What the upstreams enforce, and how we know"):
/// a `chatgpt-account-id` that is missing or not the token's, `store` not false
/// ("Store must be set to false"), `stream` not true ("Stream must be set to true"); then
/// answers as `/v1/responses`. Who the client is (`originator`, the user agent) it does not
/// check: no evidence shows the backend refusing on it. Nor does it ask for `instructions`
/// (reported as required in early 2026, yet Codex 0.171 sends its instructions as `input`
/// items and no `instructions` member).
pub(super) async fn chatgpt_codex(
    State(state): State<Arc<FakeState>>,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    chatgpt_codex_via(state, uri, headers, body, None).await
}

/// `chatgpt_codex`, for a request that may have come as a socket's frame.
pub(super) async fn chatgpt_codex_via(
    state: Arc<FakeState>,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
    via: Option<Via>,
) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let token = header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let claimed = poolgate_core::account::chatgpt_account_id(token);
    let problem = if claimed.is_none() || header("chatgpt-account-id") != claimed.as_deref() {
        Some("chatgpt-account-id does not match the token")
    } else if request.get("store") != Some(&Value::Bool(false)) {
        Some("Store must be set to false")
    } else if request.get("stream") != Some(&Value::Bool(true)) {
        Some("Stream must be set to true")
    } else {
        None
    };
    if let Some(detail) = problem {
        let refused = (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"detail": detail})),
        )
            .into_response();
        // Its windows' headers too (every answer carries them), counting nothing.
        return match windows::admit(
            &state,
            &credential(&headers),
            Dialect::Codex,
            "",
            false,
            false,
        ) {
            Some(verdict) => windows::stamp(refused, &verdict.headers),
            None => refused,
        };
    }
    answer_via(state, Shape::Responses, uri, headers, body, via).await
}
