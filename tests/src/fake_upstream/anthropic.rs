//! What only Anthropic's API does: the `count_tokens` endpoint and the refusals of a Claude
//! subscription token used other than as Claude Code.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Value, json};

use super::answer::Shape;
use super::bodies::normal_events;
use super::scripted::{after_pauses, take_scripted};
use super::stream::{cut_events, cut_short, event_stream, fail_response, oversized};
use super::{FakeState, Scripted, credential};

pub(super) async fn count_tokens(
    State(state): State<Arc<FakeState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let credential = credential(&headers);
    *state
        .count_tokens
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(credential.clone())
        .or_default() += 1;
    // Never the probe's: count_tokens is a client endpoint only.
    let scripted = after_pauses(take_scripted(&state, &credential, false)).await;
    let counted = json!({"input_tokens": body.len() / 4});
    match scripted {
        Some(Scripted::Fail {
            status,
            headers,
            body,
        }) => fail_response(status, headers, body),
        Some(Scripted::Delay(pause)) => {
            tokio::time::sleep(pause).await;
            axum::Json(counted).into_response()
        }
        Some(Scripted::EarlyClose) => {
            let text = counted.to_string();
            cut_short(&text, "application/json", None)
        }
        Some(Scripted::Oversized(bytes)) => oversized(bytes, "count", None),
        Some(scripted @ (Scripted::IncompleteStream | Scripted::BrokenStream)) => {
            let events = normal_events(Shape::Anthropic, "count", "count_tokens", &Value::Null);
            event_stream(
                cut_events(Shape::Anthropic, events, &scripted),
                Duration::ZERO,
                None,
            )
        }
        Some(Scripted::After(..)) | None => axum::Json(counted).into_response(),
    }
}

/// Why Anthropic would refuse a subscription token on this request, if it would.
pub(super) fn claude_code_refusal(headers: &HeaderMap, request: &Value) -> Option<(u16, Value)> {
    let betas = headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    let bearer =
        headers.contains_key(http::header::AUTHORIZATION) && !headers.contains_key("x-api-key");
    if !bearer || !betas.split(',').any(|b| b.trim() == "oauth-2025-04-20") {
        return Some((
            401,
            json!({"type": "error", "error": {"type": "authentication_error", "message": "OAuth authentication is currently not supported."}}),
        ));
    }
    let first = match request.get("system") {
        Some(Value::String(text)) => Some(text.as_str()),
        Some(Value::Array(blocks)) => blocks
            .first()
            .and_then(|b| b.get("text"))
            .and_then(Value::as_str),
        _ => None,
    };
    let identity = "You are Claude Code, Anthropic's official CLI for Claude.";
    if !first.is_some_and(|text| text.starts_with(identity)) {
        return Some((
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "This credential is only authorized for use with Claude Code and cannot be used for other API requests."}}),
        ));
    }
    None
}
