//! What only Anthropic's API does: the `count_tokens` endpoint and the refusals of a Claude
//! subscription token on another client's (third-party) request.

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
        Some(Scripted::After(..) | Scripted::TrailingPause(_)) | None => {
            axum::Json(counted).into_response()
        }
    }
}

/// The text block Claude Code opens every request's `system` with (Claude Code 2.1.332:
/// `x-anthropic-billing-header: cc_version=2.1.332.<3 hex>; cc_entrypoint=sdk-cli;`), the
/// block Anthropic looks for before it serves a subscription token on a non-Haiku model.
pub const BILLING_BLOCK_OPENING: &str = "x-anthropic-billing-header:";

/// Anthropic's 400 for third-party traffic on a subscription token, newest wording first; before
/// 2026-04-08 the same refusal was a bare "Error" (the sources: docs/SUBSCRIPTIONS.md, "What the
/// upstreams enforce, and how we know").
pub const THIRD_PARTY_MESSAGE: &str = "Third-party apps now draw from extra usage, not plan limits. Ask your workspace admin to add more and keep going.";

/// How the fake words its refusal of third-party traffic on a subscription token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ThirdPartyAnswer {
    /// Since 2026-04-08: 400 `invalid_request_error` "Third-party apps now draw from extra usage…".
    #[default]
    ExtraUsage,
    /// 2026-03-17 to early April: 400 `invalid_request_error` with the message "Error".
    BareError,
}

/// Why Anthropic would refuse a Claude subscription (OAuth) token on this request, if it would
/// (each rule and its public source: docs/SUBSCRIPTIONS.md, "What the upstreams enforce, and
/// how we know"):
/// - a bearer token without the `oauth-2025-04-20` beta: 401 "OAuth authentication is
///   currently not supported.";
/// - a non-Haiku model, and `system[0]` not Claude Code's billing block: the third-party 400.
///
/// Nothing else: what the rest of `system` says, the user agent, other betas are not checked,
/// because no evidence shows a rule on them that a test here could hold.
pub(super) fn claude_code_refusal(
    headers: &HeaderMap,
    request: &Value,
    answer: ThirdPartyAnswer,
) -> Option<(u16, Value)> {
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
    let haiku = request
        .get("model")
        .and_then(Value::as_str)
        .is_some_and(|model| model.contains("haiku"));
    if haiku || opens_with_billing_block(request) {
        return None;
    }
    let message = match answer {
        ThirdPartyAnswer::ExtraUsage => THIRD_PARTY_MESSAGE,
        ThirdPartyAnswer::BareError => "Error",
    };
    Some((
        400,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}}),
    ))
}

/// Whether `system[0]` is a text block that opens with Claude Code's billing header.
pub fn opens_with_billing_block(request: &Value) -> bool {
    request
        .get("system")
        .and_then(Value::as_array)
        .and_then(|blocks| blocks.first())
        .filter(|block| block.get("type").and_then(Value::as_str) == Some("text"))
        .and_then(|block| block.get("text"))
        .and_then(Value::as_str)
        .is_some_and(|text| text.starts_with(BILLING_BLOCK_OPENING))
}
