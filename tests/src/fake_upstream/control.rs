//! The control API (`/_mock/*`): scripts answers from their JSON form, sets usage windows,
//! reports the per-credential stats and the requests received, resets peaks.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

use super::{FakeState, Scripted, windows};

/// One answer of the control API's JSON form (see
/// [`FakeUpstream::start_on`](super::FakeUpstream::start_on)).
fn parse_answer(answer: &Value) -> Option<Scripted> {
    if let Some(ms) = answer.get("after_ms").and_then(Value::as_u64) {
        let mut inner = answer.clone();
        if let Some(fields) = inner.as_object_mut() {
            fields.remove("after_ms");
        }
        return parse_answer(&inner)
            .map(|inner| Scripted::After(Duration::from_millis(ms), Box::new(inner)));
    }
    let flag = |name: &str| answer.get(name).and_then(Value::as_bool) == Some(true);
    if let Some(ms) = answer.get("delay_ms").and_then(Value::as_u64) {
        return Some(Scripted::Delay(Duration::from_millis(ms)));
    }
    if flag("early_close") {
        return Some(Scripted::EarlyClose);
    }
    if let Some(bytes) = answer.get("oversized").and_then(Value::as_u64) {
        return Some(Scripted::Oversized(
            usize::try_from(bytes).unwrap_or(usize::MAX),
        ));
    }
    if flag("incomplete_stream") {
        return Some(Scripted::IncompleteStream);
    }
    if flag("broken_stream") {
        return Some(Scripted::BrokenStream);
    }
    let status = answer.get("status").and_then(Value::as_u64)?;
    let headers = answer
        .get("headers")
        .and_then(Value::as_object)
        .map(|h| {
            h.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| v.to_string()),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let body = match answer.get("body") {
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => "{}".into(),
    };
    Some(Scripted::Fail {
        status: status.min(999) as u16,
        headers,
        body,
    })
}

pub(super) async fn control_script(
    State(state): State<Arc<FakeState>>,
    axum::Json(request): axum::Json<Value>,
) -> Response {
    let Some(credential) = request.get("credential").and_then(Value::as_str) else {
        return (StatusCode::BAD_REQUEST, "credential: required").into_response();
    };
    let answers: Vec<Scripted> = request
        .get("answers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(parse_answer)
        .collect();
    let count = answers.len();
    let queue = if request.get("clients_only").and_then(Value::as_bool) == Some(true) {
        &state.client_scripts
    } else {
        &state.scripts
    };
    queue
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(credential.to_owned())
        .or_default()
        .extend(answers);
    axum::Json(json!({"queued": count})).into_response()
}

/// Sets (or, with no window, clears) a credential's usage windows.
pub(super) async fn control_windows(
    State(state): State<Arc<FakeState>>,
    axum::Json(request): axum::Json<Value>,
) -> Response {
    let Some(credential) = request.get("credential").and_then(Value::as_str) else {
        return (StatusCode::BAD_REQUEST, "credential: required").into_response();
    };
    match windows::parse_budgets(&request) {
        Ok(budgets) => {
            let set = !budgets.is_empty();
            windows::set(&state, credential, budgets);
            axum::Json(json!({"windows": set})).into_response()
        }
        Err(field) => (StatusCode::BAD_REQUEST, field).into_response(),
    }
}

pub(super) async fn control_stats(State(state): State<Arc<FakeState>>) -> Response {
    let stats = state.stats.lock().unwrap_or_else(|p| p.into_inner());
    let body: serde_json::Map<String, Value> = stats
        .iter()
        .map(|(credential, s)| {
            (
                credential.clone(),
                json!({"current": s.current, "peak": s.peak, "total": s.total}),
            )
        })
        .collect();
    axum::Json(Value::Object(body)).into_response()
}

/// What the fake received: path, query, headers (credentials masked) and body of each request.
pub(super) async fn control_requests(State(state): State<Arc<FakeState>>) -> Response {
    let seen = state.seen.lock().unwrap_or_else(|p| p.into_inner());
    let requests: Vec<Value> = seen
        .iter()
        .map(|r| {
            let headers: serde_json::Map<String, Value> = r
                .headers
                .iter()
                .map(|(name, value)| {
                    let value = if matches!(name.as_str(), "authorization" | "x-api-key") {
                        "***".to_owned()
                    } else {
                        value.to_str().unwrap_or("").to_owned()
                    };
                    (name.as_str().to_owned(), Value::String(value))
                })
                .collect();
            json!({"path": r.path, "query": r.query, "headers": headers, "body": r.body, "probe": r.probe})
        })
        .collect();
    axum::Json(Value::Array(requests)).into_response()
}

pub(super) async fn control_reset(State(state): State<Arc<FakeState>>) -> Response {
    let mut stats = state.stats.lock().unwrap_or_else(|p| p.into_inner());
    for stat in stats.values_mut() {
        stat.peak = stat.current;
        stat.total = 0;
    }
    StatusCode::NO_CONTENT.into_response()
}
