//! The model endpoints (Anthropic Messages, OpenAI chat completions and Responses): one answer
//! pipeline, shaped per API, that records the request, counts it in flight, and answers with the
//! scripted answer, the account's refusal (revoked, subscription, usage window, credit, unknown
//! model) or the normal one, with the account's usage-window headers when it has windows. Its
//! recording (`receive`) and OpenAI's refusals are shared with the embeddings and rerank
//! endpoints (`plain`).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Value, json};

use super::anthropic::claude_code_refusal;
use super::bodies::{normal_body, normal_events};
use super::scripted::{after_pauses, take_scripted};
use super::stream::{
    cut_events, cut_short, event_stream, fail_response, oversized, trailing_pause,
};
use super::windows::{self, Dialect};
use super::{FakeState, InFlight, Scripted, SeenRequest, Via, credential, is_probe};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    Anthropic,
    Chat,
    Responses,
}

pub(super) async fn messages(
    State(state): State<Arc<FakeState>>,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer(state, Shape::Anthropic, uri, headers, body).await
}

pub(super) async fn chat(
    State(state): State<Arc<FakeState>>,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer(state, Shape::Chat, uri, headers, body).await
}

pub(super) async fn responses(
    State(state): State<Arc<FakeState>>,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer(state, Shape::Responses, uri, headers, body).await
}

pub(super) async fn answer(
    state: Arc<FakeState>,
    shape: Shape,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer_via(state, shape, uri, headers, body, None).await
}

/// `answer`, for a request that may have come as a socket's frame (`via`: recorded as such).
pub(super) async fn answer_via(
    state: Arc<FakeState>,
    shape: Shape,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
    via: Option<Via>,
) -> Response {
    let credential = credential(&headers);
    let guard = InFlight::enter(&state, &credential);
    let Received {
        request,
        model,
        probe,
    } = receive(&state, &credential, &uri, &headers, &body, via.as_ref());
    let scripted = after_pauses(take_scripted(&state, &credential, probe)).await;
    let broke = state
        .out_of_credit
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&credential);
    let unknown_model = state
        .known_models
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|known| !known.contains(&model));
    let subscription = shape == Shape::Anthropic
        && state
            .claude_code_only
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&credential);
    let third_party_answer = *state
        .third_party_answer
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let refused_subscription = subscription
        .then(|| claude_code_refusal(&headers, &request, third_party_answer))
        .flatten();
    let revoked = state
        .revoked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&credential);
    // Who the caller is comes before how much it may use; what it asked for after.
    let refused_first = if revoked {
        Some(revoked_answer(shape))
    } else {
        refused_subscription
    };
    let refused_later = if broke {
        Some(credit_refusal(shape))
    } else if unknown_model {
        Some(unknown_model_refusal(shape, &model))
    } else {
        None
    };
    let serves = refused_first.is_none()
        && refused_later.is_none()
        && !matches!(scripted, Some(Scripted::Fail { .. }));
    let dialect = match shape {
        Shape::Anthropic => Dialect::Anthropic,
        Shape::Chat | Shape::Responses => Dialect::Codex,
    };
    let enforce = scripted.is_none() && refused_first.is_none();
    let (window_headers, window_refusal) =
        match windows::admit(&state, &credential, dialect, &model, enforce, serves) {
            Some(verdict) => (verdict.headers, verdict.refusal),
            None => (Vec::new(), None),
        };
    let scripted = scripted.or_else(|| {
        let (status, body) = refused_first.or(window_refusal).or(refused_later)?;
        Some(Scripted::Fail {
            status,
            headers: Vec::new(),
            body: body.to_string(),
        })
    });
    let response = respond(&state, shape, scripted, &model, &request, guard).await;
    windows::stamp(response, &window_headers)
}

/// A model request as received: its body, its model (`unknown` when it names none) and whether
/// it is the selector's probe.
pub(super) struct Received {
    pub request: Value,
    pub model: String,
    pub probe: bool,
}

/// Records a model request (`via`: it came as a socket's frame): counts it as a probe when it is
/// one, keeps its model and, among the first 1 000, the request itself.
pub(super) fn receive(
    state: &FakeState,
    credential: &str,
    uri: &http::Uri,
    headers: &HeaderMap,
    body: &Bytes,
    via: Option<&Via>,
) -> Received {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_owned();
    let probe = is_probe(uri.path(), &request);
    if probe {
        *state
            .probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(credential.to_owned())
            .or_default() += 1;
    }
    state
        .seen_models
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(model.clone());
    let mut seen = state.seen.lock().unwrap_or_else(|p| p.into_inner());
    if seen.len() < 1000 {
        let (raw, socket) = match via {
            Some(via) => (via.frame.clone(), Some(via.socket)),
            None => (body.clone(), None),
        };
        seen.push(SeenRequest {
            path: uri.path().to_owned(),
            query: uri.query().map(str::to_owned),
            headers: headers.clone(),
            body: serde_json::from_slice(&raw).unwrap_or(Value::Null),
            raw,
            probe,
            socket,
        });
    }
    drop(seen);
    Received {
        request,
        model,
        probe,
    }
}

/// The billing answer of an account with no credit left: Anthropic's 400 credit-balance error,
/// OpenAI's 429 `insufficient_quota`.
pub(super) fn credit_refusal(shape: Shape) -> (u16, Value) {
    match shape {
        Shape::Anthropic => (
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}),
        ),
        Shape::Chat | Shape::Responses => (
            429,
            json!({"error": {"message": "You exceeded your current quota, please check your plan and billing details.", "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}),
        ),
    }
}

/// The 404 of a model the upstream does not have (`set_known_models`), echoing its name.
pub(super) fn unknown_model_refusal(shape: Shape, model: &str) -> (u16, Value) {
    match shape {
        Shape::Anthropic => (
            404,
            json!({"type": "error", "error": {"type": "not_found_error", "message": format!("model: {model}")}}),
        ),
        Shape::Chat | Shape::Responses => (
            404,
            json!({"error": {"message": format!("The model `{model}` does not exist or you do not have access to it."), "type": "invalid_request_error", "param": null, "code": "model_not_found"}}),
        ),
    }
}

/// The answer itself: the scripted (or refusal) one, else the normal one, after the simulated
/// latency.
async fn respond(
    state: &FakeState,
    shape: Shape,
    scripted: Option<Scripted>,
    model: &str,
    request: &Value,
    guard: InFlight,
) -> Response {
    let stream = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let delay = *state.delay.lock().unwrap_or_else(|p| p.into_inner());
    let chunk_delay = *state.chunk_delay.lock().unwrap_or_else(|p| p.into_inner());
    match scripted {
        Some(Scripted::Fail {
            status,
            headers,
            body,
        }) => {
            tokio::time::sleep(delay).await;
            drop(guard);
            return fail_response(status, headers, body);
        }
        Some(Scripted::Delay(extra)) => tokio::time::sleep(delay + extra).await,
        Some(Scripted::After(..)) | None => tokio::time::sleep(delay).await,
        Some(Scripted::EarlyClose) => {
            tokio::time::sleep(delay).await;
            let id = format!("{:016x}", fastrand::u64(..));
            return if stream {
                let events = normal_events(shape, &id, model, request);
                cut_short(
                    events.first().map(String::as_str).unwrap_or_default(),
                    "text/event-stream",
                    Some(guard),
                )
            } else {
                let body = normal_body(shape, &id, model).to_string();
                cut_short(&body, "application/json", Some(guard))
            };
        }
        Some(Scripted::Oversized(bytes)) => {
            tokio::time::sleep(delay).await;
            let id = format!("{:016x}", fastrand::u64(..));
            return oversized(bytes, &id, Some(guard));
        }
        Some(Scripted::TrailingPause(pause)) if stream => {
            tokio::time::sleep(delay).await;
            let id = format!("{:016x}", fastrand::u64(..));
            let events = normal_events(shape, &id, model, request);
            return trailing_pause(
                events.into_iter().map(|e| Ok(Bytes::from(e))).collect(),
                chunk_delay,
                pause,
                Some(guard),
            );
        }
        Some(Scripted::TrailingPause(_)) => tokio::time::sleep(delay).await,
        Some(how @ (Scripted::IncompleteStream | Scripted::BrokenStream)) => {
            tokio::time::sleep(delay).await;
            let id = format!("{:016x}", fastrand::u64(..));
            let events = normal_events(shape, &id, model, request);
            return event_stream(cut_events(shape, events, &how), chunk_delay, Some(guard));
        }
    }
    let id = format!("{:016x}", fastrand::u64(..));
    if !stream {
        let body = normal_body(shape, &id, model);
        drop(guard);
        return axum::Json(body).into_response();
    }
    let events = normal_events(shape, &id, model, request);
    event_stream(
        events.into_iter().map(|e| Ok(Bytes::from(e))).collect(),
        chunk_delay,
        Some(guard),
    )
}

/// A revoked token's refusal. Anthropic: 403 `permission_error` "OAuth token has been revoked.
/// Please obtain a new token." (reported from 2025-10 to 2026-01; the sources:
/// docs/SUBSCRIPTIONS.md, "What the upstreams enforce, and how we know"). The OpenAI shapes: a 401
/// `authentication_error` (no report of the ChatGPT backend's exact answer was found).
pub(super) fn revoked_answer(shape: Shape) -> (u16, Value) {
    match shape {
        Shape::Anthropic => (
            403,
            json!({"type": "error", "error": {"type": "permission_error", "message": "OAuth token has been revoked. Please obtain a new token."}}),
        ),
        Shape::Chat | Shape::Responses => (
            401,
            json!({"type": "error", "error": {"type": "authentication_error", "message": "OAuth token has been revoked."}}),
        ),
    }
}
