//! The endpoints that answer one JSON body and never stream: OpenAI's embeddings
//! (`embeddings`) and Cohere's rerank (`rerank`). One pipeline, as the model endpoints': the
//! request is recorded and counted in flight; the scripted answer comes first, then the account's
//! refusals, then the request's checks, then the normal answer.
//!
//! Per API, what the evidence shows and nothing else:
//! - **Embeddings** (OpenAI): a revoked credential gets the chat endpoints' 401, usage windows
//!   refuse and stamp as on chat (the Codex dialect), no credit gets the 429
//!   `insufficient_quota`, a malformed request its 400, an unknown model
//!   (`set_known_models`) the 404 `model_not_found`.
//! - **Rerank** (Cohere): a revoked credential gets 401 `{"message":"invalid api token"}`, a
//!   malformed request its 400 in Cohere's `{"message"}` shape. No evidence shows Cohere's answer
//!   to an account without credit or to an unknown model, nor Cohere sending the windows'
//!   headers: such accounts are served normally, and a rate limit is only ever scripted.
//!
//! Scripted answers: `Fail` is the answer; `Delay` pauses, then answers as unscripted would
//! (the request's own 400 included, the account's refusals skipped, as on the model
//! endpoints); `EarlyClose` cuts the answer's body short; `Oversized` pads a JSON body out; the
//! stream-only ones (`IncompleteStream`, `BrokenStream`, `TrailingPause`) answer normally.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::HeaderMap;
use serde_json::Value;

use super::answer::{
    Received, Shape, credit_refusal, receive, revoked_answer, unknown_model_refusal,
};
use super::embeddings::{self, Embeddings};
use super::rerank::{self, Rerank, Version};
use super::scripted::{after_pauses, take_scripted};
use super::stream::{cut_short, fail_response, oversized};
use super::windows::{self, Dialect};
use super::{FakeState, InFlight, Scripted, credential};

/// Which API a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Embeddings,
    Rerank(Version),
}

/// A request that passed its API's checks.
enum Checked {
    Embeddings(Embeddings),
    Rerank(Rerank),
}

impl Checked {
    fn body(&self) -> Value {
        match self {
            Checked::Embeddings(embeddings) => embeddings.body(),
            Checked::Rerank(rerank) => rerank.body(&rerank::uuid_like()),
        }
    }
}

pub(super) async fn embeddings(
    State(state): State<Arc<FakeState>>,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    serve(state, Api::Embeddings, uri, headers, body).await
}

pub(super) async fn rerank_v1(
    State(state): State<Arc<FakeState>>,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    serve(state, Api::Rerank(Version::V1), uri, headers, body).await
}

pub(super) async fn rerank_v2(
    State(state): State<Arc<FakeState>>,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    serve(state, Api::Rerank(Version::V2), uri, headers, body).await
}

fn holds(set: &Mutex<HashSet<String>>, credential: &str) -> bool {
    set.lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(credential)
}

async fn serve(
    state: Arc<FakeState>,
    api: Api,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let credential = credential(&headers);
    let guard = InFlight::enter(&state, &credential);
    let Received {
        request,
        model,
        probe,
    } = receive(&state, &credential, &uri, &headers, &body, None);
    let scripted = after_pauses(take_scripted(&state, &credential, probe)).await;
    let checked = match api {
        Api::Embeddings => embeddings::check(&request).map(Checked::Embeddings),
        Api::Rerank(version) => rerank::check(version, &request).map(Checked::Rerank),
    };
    // Who the caller is comes before how much it may use; what it asked for after.
    let refused_first = holds(&state.revoked, &credential).then(|| match api {
        Api::Embeddings => revoked_answer(Shape::Chat),
        Api::Rerank(_) => rerank::refusal(401, "invalid api token"),
    });
    let refused_later = match api {
        Api::Embeddings => {
            let unknown_model = state
                .known_models
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(|known| !known.contains(&model));
            if holds(&state.out_of_credit, &credential) {
                Some(credit_refusal(Shape::Chat))
            } else if let Err(invalid) = &checked {
                Some(invalid.clone())
            } else if unknown_model {
                Some(unknown_model_refusal(Shape::Chat, &model))
            } else {
                None
            }
        }
        Api::Rerank(_) => checked.as_ref().err().cloned(),
    };
    let (window_headers, window_refusal) = match api {
        Api::Embeddings => {
            let serves = refused_first.is_none()
                && refused_later.is_none()
                && !matches!(scripted, Some(Scripted::Fail { .. }));
            let enforce = scripted.is_none() && refused_first.is_none();
            match windows::admit(&state, &credential, Dialect::Codex, &model, enforce, serves) {
                Some(verdict) => (verdict.headers, verdict.refusal),
                None => (Vec::new(), None),
            }
        }
        Api::Rerank(_) => (Vec::new(), None),
    };
    let scripted = scripted.or_else(|| {
        let (status, body) = refused_first.or(window_refusal).or(refused_later)?;
        Some(Scripted::Fail {
            status,
            headers: Vec::new(),
            body: body.to_string(),
        })
    });
    let response = respond(&state, scripted, checked, guard).await;
    windows::stamp(response, &window_headers)
}

/// The answer itself: the scripted (or refusal) one, else the checked request's (its 400 when it
/// failed its checks), after the simulated latency.
async fn respond(
    state: &FakeState,
    scripted: Option<Scripted>,
    checked: Result<Checked, (u16, Value)>,
    guard: InFlight,
) -> Response {
    let delay = *state.delay.lock().unwrap_or_else(|p| p.into_inner());
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
        Some(Scripted::EarlyClose) => {
            tokio::time::sleep(delay).await;
            let text = match &checked {
                Ok(checked) => checked.body(),
                Err((_, body)) => body.clone(),
            }
            .to_string();
            return cut_short(&text, "application/json", Some(guard));
        }
        Some(Scripted::Oversized(bytes)) => {
            tokio::time::sleep(delay).await;
            let id = format!("{:016x}", fastrand::u64(..));
            return oversized(bytes, &id, Some(guard));
        }
        Some(
            Scripted::After(..)
            | Scripted::IncompleteStream
            | Scripted::BrokenStream
            | Scripted::TrailingPause(_),
        )
        | None => tokio::time::sleep(delay).await,
    }
    let response = match checked {
        Ok(checked) => axum::Json(checked.body()).into_response(),
        Err((status, body)) => fail_response(status, Vec::new(), body.to_string()),
    };
    drop(guard);
    response
}
