//! The Responses API over a WebSocket (Codex's transport; docs/DESIGN.md §6, "Codex over
//! WebSocket"): `GET /v1/responses` with `Upgrade: websocket`. The client key is checked before
//! the upgrade, and each open socket takes one of its key's sockets on this relay. Each
//! `response.create` text frame is one turn, run as a streaming `POST /v1/responses` through the
//! relay (selected, leased, called, reported and charged like any request: a slot per turn, none
//! while the socket idles), its events sent back one per text frame as the platform sends them.
//!
//! Continuations: a turn naming the response the previous turn on this socket produced, with
//! `store: false` (what Codex sends), carries only the new input. It goes on as sent on the
//! upstream socket that produced that response (`proxy/upstream_socket.rs`: one per client
//! socket, on ChatGPT accounts and OpenAI API keys); anywhere else (over HTTP, a new upstream
//! socket, another account) the relay sends the whole conversation (the previous turn's input,
//! its output items, the new input), as Codex itself does when it falls back to HTTP. A `store: false` turn naming
//! any other response gets the platform's `previous_response_not_found` error event before any
//! output, on which Codex resends the whole conversation: never a wrong answer, never another
//! account's context. A `store: true` continuation is passed on as over HTTP (the response
//! binding keeps it on its account).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body as AxumBody;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, HeaderValue, StatusCode, Uri};
use serde_json::{Map, Value, json};

use super::{Front, Route, client_key, closing, handle};
use events::{Turn, relay_error, sse_data};

mod events;
mod lease;
use crate::client_api::{Api, ErrorKind, RelayError};
use crate::proxy::upstream_socket::{SocketTurn, UpstreamSocket};
use lease::socket_lease;
use poolgate_core::keys::Endpoint;

/// How the socket is bounded.
#[derive(Debug, Clone)]
pub struct SocketSettings {
    /// Serve the socket; off: the upgrade is answered 426, on which Codex uses HTTP at once.
    pub enabled: bool,
    /// The first `response.create` must come within this after the upgrade.
    pub first_message: Duration,
    /// A socket with no message for this long is closed (between turns; a turn's own wait is
    /// the relay's).
    pub idle: Duration,
    /// Open sockets per client key on this relay.
    pub per_key: usize,
}

impl Default for SocketSettings {
    fn default() -> Self {
        SocketSettings {
            enabled: true,
            first_message: Duration::from_secs(30),
            idle: Duration::from_secs(30 * 60),
            per_key: 64,
        }
    }
}

/// Open sockets per client key, and the relay's shutdown as the sockets see it.
#[derive(Debug, Clone)]
pub struct OpenSockets {
    per_key: Arc<Mutex<HashMap<i64, usize>>>,
    /// `true` once the relay shuts down: each socket closes after its turn (1001).
    closing: tokio::sync::watch::Sender<bool>,
}

impl Default for OpenSockets {
    fn default() -> Self {
        OpenSockets {
            per_key: Arc::default(),
            closing: tokio::sync::watch::Sender::new(false),
        }
    }
}

/// One key's open socket, given back when dropped.
pub struct SocketSlot {
    open: OpenSockets,
    key: i64,
}

impl OpenSockets {
    /// The relay shuts down: every socket closes once its turn is answered (an idle one at once),
    /// with 1001 "going away", on which Codex opens a new one (on another relay) and resends the
    /// conversation.
    pub fn close_all(&self) {
        self.closing.send_replace(true);
    }

    /// Open sockets, all keys together.
    pub fn open_count(&self) -> usize {
        self.per_key
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .sum()
    }

    fn open(&self, key: i64, limit: usize) -> Option<SocketSlot> {
        let mut open = self.per_key.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(key).or_default();
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(SocketSlot {
            open: self.clone(),
            key,
        })
    }
}

impl Drop for SocketSlot {
    fn drop(&mut self) {
        let mut open = self.open.per_key.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// Whether a request asks for a WebSocket.
pub(super) fn asks_websocket(headers: &HeaderMap) -> bool {
    headers
        .get_all(http::header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|protocol| protocol.trim().eq_ignore_ascii_case("websocket"))
}

/// The upgrade: the key first (a JSON error in the platform's format, as over HTTP), then its
/// socket bound (429), then the socket.
pub(super) async fn upgrade(
    front: Front,
    uri: Uri,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    let relay = front.relay.clone();
    let caller = match relay
        .authenticate(Api::OpenAi, client_key(&headers).as_deref())
        .await
        .and_then(|caller| {
            relay
                .check_access(Api::OpenAi, &caller, Endpoint::Responses, None)
                .map(|()| caller)
        }) {
        Ok(caller) => caller,
        Err(error) => return closing(error.into_response()),
    };
    let settings = relay.settings.sockets.clone();
    let Some(slot) = front.sockets.open(caller.api_key_id, settings.per_key) else {
        return closing(
            RelayError::new(
                Api::OpenAi,
                ErrorKind::RateLimited,
                format!(
                    "this key has {} Responses WebSockets open on this relay already; close one",
                    settings.per_key
                ),
            )
            .into_response(),
        );
    };
    // The same bound across the relays: the key's sockets are a lease count of their own.
    let lease = match socket_lease(&relay, caller.api_key_id, settings.per_key).await {
        Ok(lease) => lease,
        Err(()) => {
            return closing(
                RelayError::new(
                    Api::OpenAi,
                    ErrorKind::RateLimited,
                    format!(
                        "this key has {} Responses WebSockets open already; close one",
                        settings.per_key
                    ),
                )
                .into_response(),
            );
        }
    };
    let limit = relay.settings.max_body_bytes;
    let turn_headers = turn_headers(&headers);
    let beta = socket_beta(&headers);
    relay
        .metrics
        .requests
        .with_label_values(&["/v1/responses (websocket)"])
        .inc();
    upgrade
        .max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| async move {
            let client = Client {
                headers: turn_headers,
                beta,
                upstream: UpstreamSocket::default(),
            };
            serve(front, uri, client, socket, settings).await;
            if let Some(lease) = lease {
                lease.release(0.0, 0).await;
            }
            drop(slot);
        })
}

/// The headers each turn is run with: the upgrade's, less the upgrade's own and the socket's
/// beta flag (a WebSocket feature, not the HTTP call's).
fn turn_headers(headers: &HeaderMap) -> HeaderMap {
    let mut turn = headers.clone();
    for name in [
        "upgrade",
        "connection",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "content-length",
        "transfer-encoding",
    ] {
        turn.remove(name);
    }
    let betas: Vec<String> = headers
        .get_all("openai-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|beta| !beta.is_empty() && !beta.starts_with("responses_websockets"))
        .map(str::to_owned)
        .collect();
    turn.remove("openai-beta");
    if !betas.is_empty()
        && let Ok(value) = HeaderValue::from_str(&betas.join(","))
    {
        turn.insert("openai-beta", value);
    }
    turn.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    turn
}

/// The client's socket flag (`OpenAI-Beta: responses_websockets=…`), as it sent it: the upstream
/// socket's handshake carries it on (never one the client did not send).
fn socket_beta(headers: &HeaderMap) -> Option<HeaderValue> {
    let flags: Vec<&str> = headers
        .get_all("openai-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|beta| beta.starts_with("responses_websockets"))
        .collect();
    (!flags.is_empty())
        .then(|| HeaderValue::from_str(&flags.join(",")).ok())
        .flatten()
}

/// What every turn of one client socket shares.
struct Client {
    /// The headers each turn runs with (`turn_headers`).
    headers: HeaderMap,
    beta: Option<HeaderValue>,
    /// Its socket toward the upstream, when its turns go to one.
    upstream: UpstreamSocket,
}

/// What the socket remembers of its last turn: a continuation's whole conversation is built
/// from it.
#[derive(Default)]
struct Conversation {
    /// The last turn's response id, when it completed.
    last_id: Option<String>,
    /// Its whole input, and the output items it produced.
    input: Vec<Value>,
    output: Vec<Value>,
}

/// Why a socket ends.
enum Ended {
    /// The client left, or a frame could not be sent.
    Gone,
}

type Sink = futures_util::stream::SplitSink<WebSocket, Message>;
type Source = futures_util::stream::SplitStream<WebSocket>;

async fn serve(
    front: Front,
    uri: Uri,
    client: Client,
    socket: WebSocket,
    settings: SocketSettings,
) {
    let (mut sink, mut source) = socket.split();
    let mut conversation = Conversation::default();
    let mut wait = settings.first_message;
    // A message the client sent while the last turn's answer was ending (after its terminal
    // event): the next turn.
    let mut early: Option<Message> = None;
    let mut closing = front.sockets.closing.subscribe();
    loop {
        if *closing.borrow_and_update() {
            close(&mut sink, 1001, "the relay is shutting down").await;
            return;
        }
        let next = match early.take() {
            Some(message) => Ok(Some(Ok(message))),
            None => tokio::select! {
                next = tokio::time::timeout(wait, source.next()) => next,
                _ = closing.changed() => continue,
            },
        };
        let message = match next {
            Err(_) => {
                let reason = if wait == settings.first_message && conversation.last_id.is_none() {
                    "no response.create in time"
                } else {
                    "idle"
                };
                close(&mut sink, 1000, reason).await;
                return;
            }
            Ok(None) | Ok(Some(Err(_))) => return,
            Ok(Some(Ok(message))) => message,
        };
        wait = settings.idle;
        let text = match message {
            Message::Text(text) => text,
            Message::Binary(_) => {
                if send_error(
                    &mut sink,
                    400,
                    "invalid_request_error",
                    None,
                    "binary frames are not accepted; send each event as a JSON text frame",
                )
                .await
                .is_err()
                {
                    return;
                }
                continue;
            }
            Message::Close(_) => return,
            Message::Ping(_) | Message::Pong(_) => continue,
        };
        match turn(
            &front,
            &uri,
            &client,
            &mut sink,
            &mut source,
            &mut conversation,
            text.as_str(),
        )
        .await
        {
            Ok(next) => early = next,
            Err(Ended::Gone) => return,
        }
    }
}

async fn close(sink: &mut Sink, code: u16, reason: &str) {
    let _ = sink
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        })))
        .await;
}

/// Sends the platform's error event (`status` is what Codex maps it by).
async fn send_error(
    sink: &mut Sink,
    status: u16,
    kind: &str,
    code: Option<&str>,
    message: &str,
) -> Result<(), Ended> {
    let mut error = json!({"type": kind, "message": message});
    if let Some(code) = code {
        error["code"] = json!(code);
    }
    send(
        sink,
        json!({"type": "error", "status": status, "error": error}).to_string(),
    )
    .await
}

async fn send(sink: &mut Sink, text: String) -> Result<(), Ended> {
    sink.send(Message::Text(text.into()))
        .await
        .map_err(|_| Ended::Gone)
}

/// Input as a list of items (a string is one user message).
fn items(input: Option<Value>) -> Vec<Value> {
    match input {
        Some(Value::Array(items)) => items,
        Some(Value::String(text)) => vec![json!({"role": "user", "content": text})],
        Some(Value::Null) | None => Vec::new(),
        Some(other) => vec![other],
    }
}

/// One `response.create`.
async fn turn(
    front: &Front,
    uri: &Uri,
    client: &Client,
    sink: &mut Sink,
    source: &mut Source,
    conversation: &mut Conversation,
    text: &str,
) -> Result<Option<Message>, Ended> {
    let mut body: Map<String, Value> = match serde_json::from_str(text) {
        Ok(Value::Object(body)) => body,
        _ => {
            send_error(
                sink,
                400,
                "invalid_request_error",
                None,
                "each message must be a JSON object with a \"type\"",
            )
            .await?;
            return Ok(None);
        }
    };
    match body.remove("type").as_ref().and_then(Value::as_str) {
        Some("response.create") => {}
        // Events a newer client sends that this relay does not know are ignored, as the
        // platform's socket ignores them.
        _ => return Ok(None),
    }
    let metrics = &front.relay.metrics;
    let stored = body.get("store").and_then(Value::as_bool).unwrap_or(true);
    let previous = body
        .get("previous_response_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let delta = items(body.remove("input"));
    let mut continues = None;
    let full_input = match &previous {
        Some(id) if !stored && conversation.last_id.as_deref() == Some(id) => {
            // The socket's own previous turn: the request carries the whole conversation; the
            // upstream socket that holds the previous response gets the new input alone.
            body.remove("previous_response_id");
            metrics.socket_turns.with_label_values(&["continued"]).inc();
            continues = Some((id.clone(), delta.clone()));
            let mut whole = std::mem::take(&mut conversation.input);
            whole.append(&mut std::mem::take(&mut conversation.output));
            whole.extend(delta);
            whole
        }
        Some(id) if !stored => {
            metrics
                .socket_turns
                .with_label_values(&["previous_response_not_found"])
                .inc();
            *conversation = Conversation::default();
            send_error(
                sink,
                400,
                "invalid_request_error",
                Some("previous_response_not_found"),
                &format!("Previous response with id '{id}' not found."),
            )
            .await?;
            return Ok(None);
        }
        _ => delta,
    };
    *conversation = Conversation::default();
    if body.remove("generate") == Some(Value::Bool(false)) {
        prewarm(front, sink, conversation, &body, full_input).await?;
        return Ok(None);
    }
    metrics.socket_turns.with_label_values(&["turn"]).inc();
    body.insert("input".into(), Value::Array(full_input.clone()));
    body.insert("stream".into(), Value::Bool(true));
    let bytes = Value::Object(body).to_string();
    let route = Route {
        socket: Some(SocketTurn {
            upstream: client.upstream.clone(),
            beta: client.beta.clone(),
            continues,
        }),
        ..Route::new(Api::OpenAi, "/v1/responses", Endpoint::Responses, uri)
    };
    let response = handle(
        front.clone(),
        route,
        client.headers.clone(),
        AxumBody::from(bytes),
    )
    .await;
    let status = response.status();
    if status != StatusCode::OK {
        relay_error(front, sink, response).await?;
        return Ok(None);
    }
    let mut events = response.into_body().into_data_stream();
    let mut pending = String::new();
    let mut outcome = Turn::default();
    let mut early = None;
    loop {
        tokio::select! {
            chunk = events.next() => match chunk {
                Some(Ok(chunk)) => {
                    pending.push_str(&String::from_utf8_lossy(&chunk));
                    while let Some(end) = pending.find("\n\n") {
                        let event: String = pending.drain(..end + 2).collect();
                        if let Some(data) = sse_data(&event) {
                            let text = outcome.take(data);
                            send(sink, text).await?;
                        }
                    }
                }
                Some(Err(_)) | None => break,
            },
            message = source.next(), if early.is_none() => match message {
                // The client left mid-turn: dropping the stream cancels the call and frees
                // its slot, as for an HTTP client that disconnects.
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return Err(Ended::Gone),
                // The answer's terminal event went out; its stream is ending: the next turn.
                Some(Ok(message @ (Message::Text(_) | Message::Binary(_))))
                    if outcome.ended() =>
                {
                    early = Some(message);
                }
                Some(Ok(Message::Text(_) | Message::Binary(_))) => {
                    send_error(sink, 400, "invalid_request_error", None, "a response is already in progress on this socket").await?;
                }
                Some(Ok(_)) => {}
            },
        }
    }
    if let Some(data) = sse_data(&pending) {
        let text = outcome.take(data);
        send(sink, text).await?;
    }
    match outcome.completed {
        Some(id) => {
            if !stored {
                conversation.last_id = Some(id);
                conversation.input = full_input;
                conversation.output = outcome.output;
            }
        }
        None if outcome.terminal => {}
        None => {
            send_error(
                sink,
                502,
                "server_error",
                None,
                "the upstream stream ended before response.completed",
            )
            .await?;
        }
    }
    Ok(early)
}

/// `generate: false`: nothing is generated, so nothing goes upstream; the socket answers with an
/// empty completed response whose id the next turn may continue.
async fn prewarm(
    front: &Front,
    sink: &mut Sink,
    conversation: &mut Conversation,
    body: &Map<String, Value>,
    input: Vec<Value>,
) -> Result<(), Ended> {
    front
        .relay
        .metrics
        .socket_turns
        .with_label_values(&["prewarm"])
        .inc();
    let id = format!(
        "resp_pg{:016x}{:016x}",
        fastrand::u64(..),
        fastrand::u64(..)
    );
    let model = body.get("model").cloned().unwrap_or(Value::Null);
    let created = poolgate_core::now_ms() / 1000;
    let response = |status: &str| {
        json!({"id": id, "object": "response", "created_at": created, "status": status,
            "model": model, "output": [], "usage": null})
    };
    send(
        sink,
        json!({"type": "response.created", "response": response("in_progress")}).to_string(),
    )
    .await?;
    send(
        sink,
        json!({"type": "response.completed", "response": response("completed")}).to_string(),
    )
    .await?;
    if body.get("store").and_then(Value::as_bool) == Some(false) {
        conversation.last_id = Some(id);
        conversation.input = input;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
