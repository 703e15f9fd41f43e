//! The upstream side of a client's Responses socket (docs/DESIGN.md §6, "Codex over
//! WebSocket"): a turn on a ChatGPT account or an OpenAI API key goes to the upstream's own
//! Responses WebSocket, as Codex calls it (the ChatGPT backend's `…/codex/responses`, the
//! platform's `/v1/responses`), on one upstream socket per client socket, never shared.
//!
//! The upstream keeps a `store: false` response only on the socket that produced it, so a
//! continuation goes on as Codex sends it (its new input and `previous_response_id`) only on
//! the socket that produced the previous response; on any other (a new one: the old one broke,
//! aged out, or the turn moved accounts) the whole conversation goes instead, which the client
//! socket keeps for exactly this. Between turns the socket is held by a keeper task that answers
//! the upstream's pings, and it holds no lease.
//!
//! Each upstream event (one JSON text frame) becomes the SSE event the HTTP call would have
//! carried, so the rest of the call (usage, bindings, error events, failover before the first
//! byte) is the HTTP call's. An upstream that refuses the upgrade for the account (401, 402, 403,
//! 429, 5xx) is classified as over HTTP; any other answer to it (404, 405, 426, 400, a 2xx) means
//! no socket there, and this turn and the next hour's go over HTTP; a message of 16 MiB or more (the upstream closes the socket on it) goes over HTTP.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use poolgate_core::AccountId;
use poolgate_core::account::{CredentialKind, Platform};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use super::Relay;
use super::call::{BodyError, Head};
use crate::ports::PlannedAccount;

type Ws = WebSocketStream<reqwest::Upgraded>;

/// The ChatGPT backend closes a socket on a message this large (1009), before any event
/// (docs/SUBSCRIPTIONS.md): such a turn goes over HTTP, which takes it.
pub const UPSTREAM_MESSAGE_LIMIT: usize = 16 << 20;

/// The upstream ends a socket after 60 minutes (`websocket_connection_limit_reached`); one this
/// old is not started on again.
const MAX_AGE: Duration = Duration::from_secs(55 * 60);

/// How long an upstream that answered an upgrade with "no socket here" is called over HTTP.
const NO_SOCKET_FOR: Duration = Duration::from_secs(3600);

/// The error codes on which the socket, not the request, is at fault: the turn goes again,
/// whole, once (on the same socket for an unknown previous response, on a new one for age).
const UNKNOWN_PREVIOUS: &str = "previous_response_not_found";
const SOCKET_AGED: &str = "websocket_connection_limit_reached";

/// The upstream socket of one client socket: empty, or open to one account between turns.
#[derive(Clone, Default)]
pub struct UpstreamSocket(Arc<tokio::sync::Mutex<Option<Idle>>>);

/// What a turn that came over a client socket carries to the upstream call.
pub struct SocketTurn {
    pub upstream: UpstreamSocket,
    /// The client's `OpenAI-Beta` socket flag (`responses_websockets=…`), sent with the upstream
    /// handshake as the client sent it; none when the client sent none.
    pub beta: Option<HeaderValue>,
    /// The turn continues the response the client socket's previous turn produced: that id and
    /// the turn's new input alone (the request body holds the whole conversation).
    pub continues: Option<(String, Vec<Value>)>,
}

/// An open upstream socket and what it holds.
struct Open {
    ws: Ws,
    account: AccountId,
    opened: Instant,
    /// The last response it completed: the one a continuation on it may name.
    last_response: Option<String>,
}

/// An open socket between turns, held by its keeper.
struct Idle {
    account: AccountId,
    opened: Instant,
    last_response: Option<String>,
    stop: oneshot::Sender<()>,
    keeper: tokio::task::JoinHandle<Option<Ws>>,
}

impl UpstreamSocket {
    /// The socket to `account` if this client socket has one still open and young enough; any
    /// other it had is closed.
    async fn take(&self, account: AccountId) -> Option<Open> {
        let idle = self.0.lock().await.take()?;
        let Idle {
            account: held,
            opened,
            last_response,
            stop,
            keeper,
        } = idle;
        // Stopped, the keeper gives the socket back (or `None`: it closed meanwhile); dropped
        // unstopped, it closes it.
        if held != account || opened.elapsed() >= MAX_AGE {
            drop(stop);
            return None;
        }
        let _ = stop.send(());
        let ws = keeper.await.ok().flatten()?;
        Some(Open {
            ws,
            account,
            opened,
            last_response,
        })
    }

    /// Holds `open` until the next turn, answering the upstream's pings meanwhile.
    async fn keep(&self, open: Open) {
        let Open {
            mut ws,
            account,
            opened,
            last_response,
        } = open;
        let (stop, mut stopped) = oneshot::channel::<()>();
        let keeper = tokio::spawn(async move {
            loop {
                enum Next {
                    GiveBack,
                    Close,
                    Read,
                    Gone,
                }
                let next = tokio::select! {
                    biased;
                    asked = &mut stopped => if asked.is_ok() { Next::GiveBack } else { Next::Close },
                    frame = ws.next() => match frame {
                        // Pings are answered by the read itself; nothing else is due between turns.
                        Some(Ok(_)) => Next::Read,
                        Some(Err(_)) | None => Next::Gone,
                    },
                };
                match next {
                    Next::GiveBack => return Some(ws),
                    Next::Read => continue,
                    Next::Gone => return None,
                    Next::Close => {
                        let _ = tokio::time::timeout(Duration::from_secs(2), ws.close(None)).await;
                        return None;
                    }
                }
            }
        });
        *self.0.lock().await = Some(Idle {
            account,
            opened,
            last_response,
            stop,
            keeper,
        });
    }
}

/// Where upstream sockets are not offered (answered 404, 405 or 426), by base URL, until when.
#[derive(Default)]
pub struct NoSocket(Mutex<HashMap<String, Instant>>);

impl NoSocket {
    fn knows(&self, base: &str) -> bool {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match known.get(base) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                known.remove(base);
                false
            }
            None => false,
        }
    }

    fn note(&self, base: &str) {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        known.insert(base.to_owned(), Instant::now() + NO_SOCKET_FOR);
    }
}

/// Why a turn on the socket got no answer.
pub(super) enum SocketFailure {
    /// The upstream could not be reached: nothing of the request left the relay.
    Connect(String),
    /// No answer after the request went out.
    NoAnswer(String),
}

/// The accounts whose turns may go over the upstream's socket: the ChatGPT backend's, and the
/// OpenAI platform's API keys.
pub(super) fn takes_sockets(account: &PlannedAccount) -> bool {
    account.platform == Platform::OpenAi
        && matches!(
            account.credential_kind,
            CredentialKind::ChatGptOAuth | CredentialKind::ApiKey
        )
}

/// The first frame of a turn's answer, read.
enum First {
    /// An event that starts the answer.
    Event(String),
    /// The platform's error event, with its status.
    Error { status: u16, event: Value },
    /// The socket closed or broke before any event.
    Closed(String),
}

impl Relay {
    /// Sends the turn over the upstream socket: `None` when it goes over HTTP instead.
    pub(super) async fn socket_call(
        &self,
        inbound: &super::Inbound,
        account: &PlannedAccount,
        turn: &SocketTurn,
    ) -> Option<Result<Head, SocketFailure>> {
        if !takes_sockets(account) || self.no_socket.knows(&account.base_url) {
            return None;
        }
        let body = super::body::upstream_body(inbound, account);
        let whole = create_frame(&body)?;
        if whole.len() >= UPSTREAM_MESSAGE_LIMIT {
            self.socket_event("http_large");
            return None;
        }
        let timeout = self.settings.upstream_timeout;
        let mut reused = turn.upstream.take(account.id).await;
        let mut retried = false;
        loop {
            let was_reused = reused.is_some();
            let mut open = match reused.take() {
                Some(open) => {
                    self.socket_event("reused");
                    open
                }
                None => match self.open_socket(inbound, account, turn).await {
                    Opened::Socket(ws) => {
                        self.socket_event("opened");
                        Open {
                            ws,
                            account: account.id,
                            opened: Instant::now(),
                            last_response: None,
                        }
                    }
                    Opened::Answer(head) => {
                        self.socket_event("refused");
                        return Some(Ok(head));
                    }
                    Opened::NoSocket => {
                        self.socket_event("http_no_socket");
                        self.no_socket.note(&account.base_url);
                        return None;
                    }
                    Opened::Failed(failure) => return Some(Err(failure)),
                },
            };
            // A continuation goes on as the client sent it only where its response lives.
            let incremental = match &turn.continues {
                Some((previous, input))
                    if !retried && open.last_response.as_deref() == Some(previous) =>
                {
                    continuation_frame(&body, previous, input)
                }
                _ => None,
            };
            let frame = incremental.clone().unwrap_or_else(|| whole.clone());
            open.last_response = None;
            if open.ws.send(Message::Text(frame.into())).await.is_err() {
                if was_reused && !retried {
                    retried = true;
                    continue;
                }
                return Some(Err(SocketFailure::NoAnswer(
                    "the upstream socket broke as the turn was sent".into(),
                )));
            }
            match read_first(&mut open.ws, timeout).await {
                First::Event(text) => {
                    let head = Head {
                        status: StatusCode::OK,
                        headers: event_stream_headers(),
                        length: None,
                        body: Box::pin(events(open, turn.upstream.clone(), text, timeout)),
                    };
                    return Some(Ok(head));
                }
                First::Error { status, event } => {
                    let code = event
                        .pointer("/error/code")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    if !retried && code == UNKNOWN_PREVIOUS && incremental.is_some() {
                        // The upstream no longer holds it: the whole conversation, same socket.
                        self.socket_event("resent_whole");
                        retried = true;
                        reused = Some(open);
                        continue;
                    }
                    if !retried && code == SOCKET_AGED {
                        self.socket_event("aged");
                        retried = true;
                        continue;
                    }
                    // The platform's error event stands for the HTTP answer it wraps; the socket
                    // is not used again (as Codex retires it).
                    return Some(Ok(error_head(status, &event)));
                }
                First::Closed(what) => {
                    if was_reused && !retried {
                        // Closed while idle, seen only now: a new socket, the turn whole.
                        retried = true;
                        continue;
                    }
                    return Some(Err(SocketFailure::NoAnswer(what)));
                }
            }
        }
    }

    fn socket_event(&self, event: &str) {
        self.metrics
            .upstream_sockets
            .with_label_values(&[event])
            .inc();
    }

    async fn open_socket(
        &self,
        inbound: &super::Inbound,
        account: &PlannedAccount,
        turn: &SocketTurn,
    ) -> Opened {
        let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
        let request = match self
            .socket_handshake(inbound, account, turn.beta.as_ref(), &key)
            .build()
        {
            Ok(request) => request,
            Err(_) => return Opened::Failed(SocketFailure::Connect("bad upstream url".into())),
        };
        let client = self.http.for_socket(account.proxy_url.as_deref());
        let response = match client.execute(request).await {
            Ok(response) => response,
            Err(error) if error.is_connect() => {
                tracing::warn!(account_id = account.id, error = %error.without_url(), "upstream unreachable");
                return Opened::Failed(SocketFailure::Connect(
                    "the upstream could not be reached".into(),
                ));
            }
            Err(error) => {
                tracing::warn!(account_id = account.id, error = %error.without_url(), "upstream socket handshake failed");
                return Opened::Failed(SocketFailure::NoAnswer(
                    "the upstream did not answer the socket's handshake".into(),
                ));
            }
        };
        let status = response.status();
        if status != StatusCode::SWITCHING_PROTOCOLS {
            if !refuses_the_account(status) {
                return Opened::NoSocket;
            }
            // Refused as an HTTP call would be (401, 403, 429, 5xx): the same answer, classified
            // the same way.
            let headers = response.headers().clone();
            let body = super::call::read_bounded(
                Box::pin(
                    response
                        .bytes_stream()
                        .map(|chunk| chunk.map_err(BodyError::from)),
                ),
                self.settings.max_body_bytes,
            )
            .await;
            return Opened::Answer(Head {
                status,
                headers,
                length: Some(body.len()),
                body: Box::pin(futures_util::stream::once(async move { Ok(body) })),
            });
        }
        // The upgrade's answer carries the account's usage windows, as an HTTP answer does.
        let readings =
            poolgate_core::windows::read_windows(response.headers(), self.clock.wall_ms());
        if !readings.is_empty() {
            self.record_windows(account.id, readings);
        }
        let accepted = response
            .headers()
            .get("sec-websocket-accept")
            .map(HeaderValue::as_bytes);
        let expected = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        if accepted != Some(expected.as_bytes()) {
            return Opened::Failed(SocketFailure::NoAnswer(
                "the upstream's socket handshake did not match".into(),
            ));
        }
        match response.upgrade().await {
            Ok(upgraded) => {
                let config = WebSocketConfig::default()
                    .max_message_size(Some(
                        self.settings.max_body_bytes.max(UPSTREAM_MESSAGE_LIMIT),
                    ))
                    .max_frame_size(Some(
                        self.settings.max_body_bytes.max(UPSTREAM_MESSAGE_LIMIT),
                    ));
                Opened::Socket(
                    WebSocketStream::from_raw_socket(upgraded, Role::Client, Some(config)).await,
                )
            }
            Err(_) => Opened::Failed(SocketFailure::NoAnswer(
                "the upstream socket could not be taken over".into(),
            )),
        }
    }
}

/// Whether an upgrade's non-101 answer speaks about the account (its credential, its limits,
/// the upstream's state) and is classified as the HTTP call's would be. Anything else (404, 405,
/// 426, a 2xx or 400 from a server with a plain `GET` route there) says only that no socket is
/// served there: the turn goes over HTTP.
fn refuses_the_account(status: StatusCode) -> bool {
    matches!(status.as_u16(), 401 | 402 | 403 | 429) || status.is_server_error()
}

enum Opened {
    Socket(Ws),
    /// The upstream answered the upgrade with an error: that answer.
    Answer(Head),
    /// The upstream has no socket here: HTTP.
    NoSocket,
    Failed(SocketFailure),
}

/// `{"type":"response.create", …the body's members}`: the HTTP body as the socket takes it.
/// `None` when the body is not a JSON object.
fn create_frame(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?.trim_start();
    let rest = text.strip_prefix('{')?;
    if rest.trim_start().starts_with('}') {
        return Some(r#"{"type":"response.create"}"#.to_owned());
    }
    Some(format!(r#"{{"type":"response.create",{rest}"#))
}

/// The frame of a continuation on the socket that holds `previous`: the body with only the new
/// `input` and `previous_response_id`, spliced into its bytes as every other body change is
/// (`body::splice`), not parsed and written again.
fn continuation_frame(body: &[u8], previous: &str, input: &[Value]) -> Option<String> {
    let changes = [
        ("input", serde_json::to_string(input).ok()?),
        (
            "previous_response_id",
            serde_json::to_string(previous).ok()?,
        ),
    ];
    create_frame(&super::body::splice(body, &changes)?)
}

fn event_stream_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers
}

/// The HTTP answer an error event stands for: its status, its `headers` (the window headers of
/// a 429), and `{"error": …}` as the body.
fn error_head(status: u16, event: &Value) -> Head {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(Value::Object(named)) = event.get("headers") {
        for (name, value) in named {
            let value = match value {
                Value::String(text) => text.clone(),
                Value::Number(_) | Value::Bool(_) => value.to_string(),
                _ => continue,
            };
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                headers.append(name, value);
            }
        }
    }
    let error = event.get("error").cloned().unwrap_or(Value::Null);
    let body = Bytes::from(serde_json::json!({ "error": error }).to_string());
    Head {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        headers,
        length: Some(body.len()),
        body: Box::pin(futures_util::stream::once(async move { Ok(body) })),
    }
}

/// Reads frames until the first event of the answer.
async fn read_first(ws: &mut Ws, timeout: Duration) -> First {
    loop {
        let frame = match tokio::time::timeout(timeout, ws.next()).await {
            Err(_) => return First::Closed("the upstream socket sent nothing in time".into()),
            Ok(frame) => frame,
        };
        match frame {
            Some(Ok(Message::Text(text))) => {
                let text = text.as_str();
                if let Some(status) = error_status(text) {
                    return match serde_json::from_str(text) {
                        Ok(event) => First::Error { status, event },
                        Err(_) => First::Closed("the upstream sent a broken error event".into()),
                    };
                }
                return First::Event(text.to_owned());
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
            Some(Ok(Message::Binary(_))) => {
                return First::Closed("the upstream sent a binary frame".into());
            }
            Some(Ok(Message::Close(_))) | None => {
                return First::Closed("the upstream socket closed before any event".into());
            }
            Some(Err(_)) => return First::Closed("the upstream socket broke".into()),
        }
    }
}

/// The status of an `error` event that has one outside 2xx (the platform's wrapped error).
fn error_status(text: &str) -> Option<u16> {
    #[derive(serde::Deserialize)]
    struct ErrorHead {
        #[serde(rename = "type")]
        kind: Option<String>,
        status: Option<u16>,
        status_code: Option<u16>,
    }
    if !text.contains("\"error\"") {
        return None;
    }
    let head: ErrorHead = serde_json::from_str(text).ok()?;
    let status = head.status.or(head.status_code)?;
    (head.kind.as_deref() == Some("error") && !(200..300).contains(&status)).then_some(status)
}

/// What an event frame's `type` and its response's id are.
#[derive(serde::Deserialize)]
struct EventHead {
    #[serde(rename = "type")]
    kind: Option<String>,
    response: Option<ResponseHead>,
}

#[derive(serde::Deserialize)]
struct ResponseHead {
    id: Option<String>,
}

/// The turn's events as the SSE stream the HTTP call carries, from `first` to the terminal
/// event; the socket goes back to its client socket after a completed or incomplete answer.
fn events(
    open: Open,
    socket: UpstreamSocket,
    first: String,
    timeout: Duration,
) -> impl futures_util::Stream<Item = Result<Bytes, BodyError>> + Send + 'static {
    struct State {
        open: Option<Open>,
        socket: UpstreamSocket,
        first: Option<String>,
        timeout: Duration,
    }
    let state = State {
        open: Some(open),
        socket,
        first: Some(first),
        timeout,
    };
    futures_util::stream::unfold(state, |mut state| async move {
        let text = match state.first.take() {
            Some(text) => text,
            None => {
                let mut open = state.open.take()?;
                loop {
                    match tokio::time::timeout(state.timeout, open.ws.next()).await {
                        Ok(Some(Ok(Message::Text(text)))) => {
                            let text = text.as_str().to_owned();
                            state.open = Some(open);
                            break text;
                        }
                        Ok(Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)))) => {
                            continue;
                        }
                        Err(_) => {
                            let error = BodyError::new("the upstream socket went quiet mid-answer");
                            return Some((Err(error), state));
                        }
                        Ok(_) => {
                            let error = BodyError::new(
                                "the upstream socket closed before the answer ended",
                            );
                            return Some((Err(error), state));
                        }
                    }
                }
            }
        };
        let head: Option<EventHead> = serde_json::from_str(&text).ok();
        let kind = head
            .as_ref()
            .and_then(|head| head.kind.clone())
            .unwrap_or_default();
        let (kind, text) = if kind == "response.done" {
            // The only success Codex and the relay's readers know (the peers do the same).
            let mut event: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            event["type"] = Value::from("response.completed");
            ("response.completed".to_owned(), event.to_string())
        } else {
            (kind, text)
        };
        let chunk = Bytes::from(format!("event: {kind}\ndata: {text}\n\n"));
        match kind.as_str() {
            "response.completed" | "response.incomplete" => {
                if let Some(mut open) = state.open.take() {
                    open.last_response = (kind == "response.completed")
                        .then(|| head.and_then(|h| h.response).and_then(|r| r.id))
                        .flatten();
                    state.socket.keep(open).await;
                }
            }
            // Not used again after an error, as Codex retires it.
            "response.failed" | "error" => state.open = None,
            _ => {}
        }
        Some((Ok(chunk), state))
    })
}

#[cfg(test)]
mod tests;
