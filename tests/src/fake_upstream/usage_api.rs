//! The usage endpoints the official CLIs read for their usage views, with the real shapes
//! (docs/SUBSCRIPTIONS.md, "Probes and usage readings"; sources in
//! /tmp/research/fake_rules_h3.md):
//! - Claude: `GET /api/oauth/usage` (bearer): `five_hour`, `seven_day` (`{utilization: percent
//!   0–100, resets_at: RFC 3339 | null}`), `seven_day_opus`/`seven_day_sonnet` null (as since
//!   mid-2026), `extra_usage`, and `limits[]` (`session`, `weekly_all`).
//! - ChatGPT: `GET /wham/usage` and `/backend-api/wham/usage` (bearer): `plan_type`,
//!   `rate_limit {allowed, limit_reached, primary_window, secondary_window}` with
//!   `{used_percent (integer), limit_window_seconds, reset_after_seconds, reset_at}`,
//!   `additional_rate_limits: []`.
//!
//! Both read the credential's window budgets (`windows::shown`: the same state the answers'
//! headers come from), a window not used since its reset shown as not started; a revoked token
//! gets a 401, no bearer a 401. A scripted answer queued with `script` (the probe's queue) is
//! not used here: the endpoints answer from the credential's state only.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::windows::{self, Shown};
use super::{FakeState, credential};

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The bearer token, counted; `Err`: the refusal to give.
fn admit(
    state: &FakeState,
    headers: &HeaderMap,
    refusal: (u16, Value),
) -> Result<String, Box<Response>> {
    let token = credential(headers);
    *state
        .usage_calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(token.clone())
        .or_default() += 1;
    let revoked = state
        .revoked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&token);
    if *state
        .no_usage_endpoints
        .lock()
        .unwrap_or_else(|p| p.into_inner())
    {
        return Err(Box::new(
            (
                StatusCode::NOT_FOUND,
                axum::Json(json!({"type": "error", "error": {"type": "not_found_error", "message": "Not Found"}})),
            )
                .into_response(),
        ));
    }
    if token.is_empty() || revoked {
        return Err(Box::new(
            (
                StatusCode::from_u16(refusal.0).unwrap_or(StatusCode::UNAUTHORIZED),
                axum::Json(refusal.1),
            )
                .into_response(),
        ));
    }
    Ok(token)
}

fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Claude's `/api/oauth/usage`.
pub(super) async fn claude_usage(
    State(state): State<Arc<FakeState>>,
    headers: HeaderMap,
) -> Response {
    // As the Messages API answers a revoked token (no report of this endpoint's own answer).
    let refusal = super::answer::revoked_answer(super::answer::Shape::Anthropic);
    let token = match admit(&state, &headers, refusal) {
        Ok(token) => token,
        Err(refused) => return *refused,
    };
    let shown = windows::shown(&state, &token).unwrap_or_default();
    let bucket = |five_hour: bool| -> Value {
        match shown.iter().find(|w| w.five_hour == five_hour) {
            Some(w) => json!({"utilization": w.percent, "resets_at": w.reset_ms.map(rfc3339)}),
            None => json!({"utilization": 0.0, "resets_at": null}),
        }
    };
    let (five_hour, seven_day) = (bucket(true), bucket(false));
    let limit = |kind: &str, group: &str, bucket: &Value| {
        json!({"kind": kind, "group": group, "percent": bucket["utilization"],
               "resets_at": bucket["resets_at"], "scope": null, "severity": "normal",
               "is_active": false})
    };
    axum::Json(json!({
        "five_hour": five_hour,
        "seven_day": seven_day,
        "seven_day_oauth_apps": null,
        "seven_day_opus": null,
        "seven_day_sonnet": null,
        "extra_usage": {"is_enabled": false, "monthly_limit": null, "used_credits": null, "utilization": null},
        "limits": [
            limit("session", "session", &five_hour),
            limit("weekly_all", "weekly", &seven_day),
        ],
    }))
    .into_response()
}

/// ChatGPT's `/wham/usage`.
pub(super) async fn chatgpt_usage(
    State(state): State<Arc<FakeState>>,
    headers: HeaderMap,
) -> Response {
    let refusal = json!({"error": {"message": "Your authentication token has been invalidated. Please try signing in again.", "type": "invalid_request_error", "code": "token_invalidated", "param": null}});
    let token = match admit(&state, &headers, (401, refusal)) {
        Ok(token) => token,
        Err(refused) => return *refused,
    };
    let shown = windows::shown(&state, &token).unwrap_or_default();
    let now = now_ms();
    let window = |w: &Shown| {
        let reset = w.reset_ms.unwrap_or(now + w.length_ms);
        json!({
            "used_percent": w.percent.round() as i64,
            "limit_window_seconds": (w.length_ms + 999) / 1000,
            "reset_after_seconds": ((reset - now).max(0) + 999) / 1000,
            "reset_at": reset.div_euclid(1000),
        })
    };
    let primary = shown.iter().find(|w| w.five_hour).map(window);
    let secondary = shown.iter().find(|w| !w.five_hour).map(window);
    let reached = shown
        .iter()
        .any(|w| w.percent >= 100.0 && w.reset_ms.is_some());
    axum::Json(json!({
        "plan_type": "pro",
        "rate_limit": {
            "allowed": !reached,
            "limit_reached": reached,
            "primary_window": primary,
            "secondary_window": secondary,
        },
        "credits": null,
        "additional_rate_limits": [],
    }))
    .into_response()
}
