//! The Responses API over a WebSocket, as the ChatGPT backend (`/backend-api/codex/responses`)
//! and the OpenAI platform (`/v1/responses`) serve it to Codex. Each rule cites its source in
//! docs/SUBSCRIPTIONS.md ("The Responses WebSocket"):
//! - the upgrade of a revoked token is refused with its HTTP answer (a bad key gets a plain 401
//!   on the upgrade);
//! - each `response.create` text frame is one request, checked and answered as the same body
//!   over HTTP (the ChatGPT backend's `store`/`stream`/account checks included), its events sent
//!   one per text frame, the SSE `data:` payloads;
//! - a refusal comes as the wrapped error event: `{"type":"error","status":…,"error":{…},
//!   "headers":{…}}`, and the socket stays open;
//! - a `store: false` response is kept only by the socket that produced it, and only the last
//!   one: a `previous_response_id` naming anything else gets the `previous_response_not_found`
//!   error event (status 400) before any output;
//! - unknown message types are ignored.
//!
//! Each frame is recorded as a request (`SeenRequest::socket` names its socket), and the sockets
//! opened are counted.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use http::HeaderMap;
use serde_json::{Map, Value, json};

use super::answer::{Shape, answer_via, revoked_answer};
use super::chatgpt::chatgpt_codex_via;
use super::{FakeState, Via, credential};

/// Which upstream a socket is.
#[derive(Clone, Copy)]
enum Upstream {
    ChatGpt,
    Platform,
}

pub(super) async fn chatgpt_socket(
    State(state): State<Arc<FakeState>>,
    uri: http::Uri,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    accept(state, uri, headers, upgrade, Upstream::ChatGpt)
}

pub(super) async fn platform_socket(
    State(state): State<Arc<FakeState>>,
    uri: http::Uri,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    accept(state, uri, headers, upgrade, Upstream::Platform)
}

fn accept(
    state: Arc<FakeState>,
    uri: http::Uri,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
    upstream: Upstream,
) -> Response {
    let revoked = state
        .revoked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&credential(&headers));
    if revoked {
        let (status, body) = revoked_answer(Shape::Responses);
        let status = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::UNAUTHORIZED);
        return (status, axum::Json(body)).into_response();
    }
    if *state.no_sockets.lock().unwrap_or_else(|p| p.into_inner()) {
        // An upstream with no socket: what a server that routes only POST here answers.
        return http::StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    let id = state.sockets_opened.fetch_add(1, Ordering::SeqCst) + 1;
    upgrade
        .max_message_size(64 << 20)
        .on_upgrade(move |socket| serve(state, uri, headers, socket, upstream, id))
}

/// The last response this socket completed, and the whole conversation it ends.
struct Kept {
    id: String,
    conversation: Vec<Value>,
}

async fn serve(
    state: Arc<FakeState>,
    uri: http::Uri,
    headers: HeaderMap,
    mut socket: WebSocket,
    upstream: Upstream,
    id: u64,
) {
    let mut kept: Option<Kept> = None;
    while let Some(Ok(message)) = socket.next().await {
        let Message::Text(text) = message else {
            continue;
        };
        let frame = Bytes::copy_from_slice(text.as_bytes());
        let Ok(Value::Object(mut body)) = serde_json::from_slice::<Value>(&frame) else {
            continue;
        };
        if body.remove("type").as_ref().and_then(Value::as_str) != Some("response.create") {
            continue;
        }
        let input = match body.remove("input") {
            Some(Value::Array(items)) => items,
            Some(Value::String(text)) => vec![json!({"role": "user", "content": text})],
            _ => Vec::new(),
        };
        let input = match body.remove("previous_response_id") {
            Some(Value::String(previous)) => match kept.take() {
                Some(Kept {
                    id,
                    mut conversation,
                }) if id == previous => {
                    conversation.extend(input);
                    conversation
                }
                _ => {
                    let event = json!({"type": "error", "status": 400, "error": {
                        "type": "invalid_request_error", "code": "previous_response_not_found",
                        "message": format!("Previous response with id '{previous}' not found."),
                        "param": "previous_response_id"}});
                    if send(&mut socket, event.to_string()).await.is_err() {
                        return;
                    }
                    continue;
                }
            },
            _ => input,
        };
        kept = None;
        body.insert("input".into(), Value::Array(input.clone()));
        let request = Bytes::from(Value::Object(body).to_string());
        let via = Via { socket: id, frame };
        let response = match upstream {
            Upstream::ChatGpt => {
                chatgpt_codex_via(
                    state.clone(),
                    uri.clone(),
                    headers.clone(),
                    request,
                    Some(via),
                )
                .await
            }
            Upstream::Platform => {
                answer_via(
                    state.clone(),
                    Shape::Responses,
                    uri.clone(),
                    headers.clone(),
                    request,
                    Some(via),
                )
                .await
            }
        };
        match relay_answer(&mut socket, response).await {
            Answered::Completed { id, output } => {
                let mut conversation = input;
                conversation.extend(output);
                kept = Some(Kept { id, conversation });
            }
            Answered::Other => {}
            // Broken off: the socket drops without a close frame.
            Answered::Broken => return,
        }
    }
}

enum Answered {
    Completed { id: String, output: Vec<Value> },
    Other,
    Broken,
}

/// Sends the HTTP answer as the socket does: a refusal as the wrapped error event, a stream as
/// its events.
async fn relay_answer(socket: &mut WebSocket, response: Response) -> Answered {
    let status = response.status();
    let headers = response.headers().clone();
    if !status.is_success() {
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let error = match body.get("error") {
            Some(error @ Value::Object(_)) => error.clone(),
            _ => json!({"type": "invalid_request_error",
                "message": body.get("detail").cloned().unwrap_or(Value::Null)}),
        };
        let mut named = Map::new();
        for (name, value) in &headers {
            let name = name.as_str();
            let window = name.starts_with("x-codex-")
                || name.starts_with("x-ratelimit-")
                || name == "retry-after";
            if window && let Ok(value) = value.to_str() {
                named.insert(name.to_owned(), Value::from(value));
            }
        }
        let event =
            json!({"type": "error", "status": status.as_u16(), "error": error, "headers": named});
        return match send(socket, event.to_string()).await {
            Ok(()) => Answered::Other,
            Err(()) => Answered::Broken,
        };
    }
    let mut body = response.into_body().into_data_stream();
    let mut pending = String::new();
    let mut completed = None;
    loop {
        match body.next().await {
            Some(Ok(chunk)) => {
                pending.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = pending.find("\n\n") {
                    let event: String = pending.drain(..end + 2).collect();
                    let data: String = event
                        .lines()
                        .filter_map(|line| line.strip_prefix("data:"))
                        .map(str::trim_start)
                        .collect();
                    if data.is_empty() {
                        continue;
                    }
                    if let Ok(parsed) = serde_json::from_str::<Value>(&data)
                        && parsed["type"] == "response.completed"
                    {
                        completed = Some(parsed);
                    }
                    if send(socket, data).await.is_err() {
                        return Answered::Broken;
                    }
                }
            }
            Some(Err(_)) => return Answered::Broken,
            None => break,
        }
    }
    match completed {
        Some(event) => Answered::Completed {
            id: event["response"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            output: event["response"]["output"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        },
        // Ended without its terminal event: the socket is closed as broken.
        None => Answered::Broken,
    }
}

async fn send(socket: &mut WebSocket, text: String) -> Result<(), ()> {
    socket
        .send(Message::Text(text.into()))
        .await
        .map_err(|_| ())
}
