//! One upstream call under a held lease: send, classify a non-2xx answer, and serve a 2xx, read
//! whole here (a ChatGPT stream folded into one response for a client that asked for none) or
//! streamed (`stream.rs`). Until the first byte reaches the client, a lease admission says is
//! gone ends the call, so the request can fail over.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::{HeaderMap, HeaderValue, StatusCode};
use poolgate_core::account::CredentialKind;
use poolgate_core::classify::{
    Classified, UpstreamError, classify, classify_stream_error, connect_failure, network_failure,
};
use poolgate_core::outcome::OutcomeClass;
use poolgate_core::windows::read_windows;
use serde_json::Value;
use tokio::sync::watch;

use super::finish::Finish;
use super::headers::response_headers;
use super::upstream_socket::SocketFailure;
use super::{Answer, Body, Called, Inbound, Relay, UpstreamTime};
use crate::client_api::{Api, ErrorKind, RelayError};
use crate::ports::{Lease, PlannedAccount};
use crate::usage::{StreamFold, whole_answer};

/// A 2xx from upstream whose body is still to be read, and the lease it runs under.
pub(super) struct Answered<S> {
    pub(super) status: StatusCode,
    /// The headers the client gets.
    pub(super) headers: HeaderMap,
    pub(super) body: S,
    pub(super) lease: Box<dyn Lease>,
    /// The lease's "gone for good" signal (see [`gone`]).
    pub(super) lost: Option<watch::Receiver<bool>>,
    /// When the upstream request went out.
    pub(super) sent: Instant,
    /// The body's length, when the upstream stated it.
    pub(super) length: Option<usize>,
}

impl Called {
    /// A call with no upstream answer to pass on, told to the client as `error` (JSON in its
    /// API's format, as every error the relay makes itself).
    fn relay_made(lease: Box<dyn Lease>, classified: Classified, error: &RelayError) -> Called {
        Called::Failed {
            classified,
            status: error.kind.status().as_u16(),
            headers: json_headers(),
            body: Bytes::from(error.body().to_string()),
            lease,
        }
    }

    /// The upstream could not be reached (DNS, TCP connect, TLS handshake): nothing of the
    /// request left the relay, so nothing the client sent shaped it (see `connect_failure`).
    fn connect_failure(lease: Box<dyn Lease>, api: Api, what: &str) -> Called {
        let error = RelayError::new(api, ErrorKind::Upstream, what);
        Called::relay_made(lease, connect_failure(), &error)
    }

    /// No usable answer after the request went out (a timeout, an early close, a body that
    /// broke off or outgrew `max_body_bytes`): the request may have caused it, so it is a
    /// network failure the selector confirms (see `network_failure`).
    pub(super) fn network_failure(lease: Box<dyn Lease>, api: Api, what: &str) -> Called {
        let error = RelayError::new(api, ErrorKind::Upstream, what);
        Called::relay_made(lease, network_failure(), &error)
    }

    /// A folded stream that ended in an error event (classified by `classify_stream_error`), or
    /// without any terminal event (a network failure). The client gets the event's own type,
    /// code and message in its format: a 400 when the event blames the request, else a 502.
    fn stream_failure(lease: Box<dyn Lease>, api: Api, event: Option<&Value>) -> Called {
        let Some(event) = event else {
            return Called::network_failure(
                lease,
                api,
                "the upstream stream ended without a response",
            );
        };
        let classified = classify_stream_error(event);
        let upstream = event_error(event);
        let kind = if classified.class == OutcomeClass::ClientError {
            ErrorKind::InvalidRequest
        } else {
            ErrorKind::Upstream
        };
        let message = if upstream.message.is_empty() {
            "the upstream stream failed".to_owned()
        } else {
            upstream.message.clone()
        };
        let error = RelayError::new(api, kind, message);
        let mut body = error.body();
        if let Some(fields) = body.get_mut("error").and_then(Value::as_object_mut) {
            if let Some(kind) = &upstream.kind {
                fields.insert("type".into(), Value::from(kind.as_str()));
            }
            if let (Api::OpenAi, Some(code)) = (api, &upstream.code) {
                fields.insert("code".into(), Value::from(code.as_str()));
            }
        }
        Called::Failed {
            classified,
            status: kind.status().as_u16(),
            headers: json_headers(),
            body: Bytes::from(body.to_string()),
            lease,
        }
    }
}

/// The structured error of a stream's error event: Anthropic's and chat's `error` object, a
/// Responses `response.failed`'s `response.error`, or the flat fields of a Responses `error`.
fn event_error(event: &Value) -> UpstreamError {
    UpstreamError::from_json(event)
        .or_else(|| event.get("response").and_then(UpstreamError::from_json))
        .unwrap_or_else(|| {
            let text = |name: &str| {
                event
                    .get(name)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
            };
            UpstreamError {
                kind: None,
                code: text("code"),
                message: text("message").unwrap_or_default(),
            }
        })
}

fn json_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers
}

impl Relay {
    pub(super) async fn call(
        self: Arc<Self>,
        inbound: &Inbound,
        account: &PlannedAccount,
        lease: Box<dyn Lease>,
        started: Instant,
        upstream: &mut UpstreamTime,
    ) -> Called {
        let sent = Instant::now();
        // Until the first byte reaches the client, a lease admission says is gone (released by
        // someone else, no room to restore it) ends this call: the request fails over.
        let mut lost = lease.lost();
        let answered = tokio::select! {
            answered = self.send(inbound, account) => answered,
            _ = gone(&mut lost) => {
                upstream.ended(sent);
                return Called::LeaseLost(lease);
            }
        };
        let head = match answered {
            Ok(head) => head,
            Err(Unanswered::Connect(what)) => {
                upstream.ended(sent);
                return Called::connect_failure(lease, inbound.api, &what);
            }
            Err(Unanswered::NoAnswer(what)) => {
                upstream.ended(sent);
                return Called::network_failure(lease, inbound.api, &what);
            }
        };
        let Head {
            status,
            headers,
            length,
            body,
        } = head;
        // Every answer head (success or error, stream or not) says where the account stands in
        // its usage windows; selection orders by it (docs/DESIGN.md §5). Sent off the latency
        // path: the port queues it, nothing here waits for the selector.
        let readings = read_windows(&headers, self.clock.wall_ms());
        if !readings.is_empty() {
            self.record_windows(account.id, readings);
        }
        if !status.is_success() {
            let body = read_bounded(body, self.settings.max_body_bytes).await;
            upstream.ended(sent);
            let classified = classify(
                status.as_u16(),
                &headers,
                &body,
                self.clock.wall_ms(),
                self.settings.hard_block_threshold.as_millis() as u64,
            );
            return Called::Failed {
                classified,
                status: status.as_u16(),
                headers,
                body,
                lease,
            };
        }
        let is_sse = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        // The ChatGPT backend always streams: a client that did not ask for a stream gets the
        // stream folded into one response.
        let fold =
            is_sse && !inbound.stream && account.credential_kind == CredentialKind::ChatGptOAuth;
        let answered = Answered {
            status,
            headers: response_headers(&headers, account.usage_headers_to_clients),
            body,
            lease,
            lost,
            sent,
            length,
        };
        if !is_sse || fold {
            self.serve_whole(inbound, account, answered, started, fold, upstream)
                .await
        } else {
            self.serve_stream(inbound, account, answered, started, upstream)
                .await
        }
    }

    /// Reads the whole answer, then serves it; bookkeeping follows on its own task.
    async fn serve_whole<S>(
        self: Arc<Self>,
        inbound: &Inbound,
        account: &PlannedAccount,
        answered: Answered<S>,
        started: Instant,
        fold: bool,
        upstream_time: &mut UpstreamTime,
    ) -> Called
    where
        S: Stream<Item = Result<Bytes, BodyError>> + Unpin,
    {
        let Answered {
            status,
            headers: mut client_headers,
            body: mut upstream,
            lease,
            mut lost,
            sent,
            length,
        } = answered;
        // A JSON answer is kept as its bytes (room for it taken once, from its length); a folded
        // stream keeps only its event in progress and the response it folds to.
        let max = self.settings.max_body_bytes;
        let mut collected = Vec::with_capacity(if fold {
            0
        } else {
            length.unwrap_or(0).min(max)
        });
        let mut folding = fold.then(StreamFold::default);
        let mut received = 0usize;
        loop {
            let chunk = tokio::select! {
                chunk = upstream.next() => chunk,
                _ = gone(&mut lost) => {
                    upstream_time.ended(sent);
                    return Called::LeaseLost(lease);
                }
            };
            match chunk {
                None => break,
                Some(Ok(chunk)) if received + chunk.len() <= max => {
                    received += chunk.len();
                    match folding.as_mut() {
                        Some(folding) => folding.feed(&chunk),
                        None => collected.extend_from_slice(&chunk),
                    }
                }
                Some(_) => {
                    upstream_time.ended(sent);
                    return Called::network_failure(
                        lease,
                        inbound.api,
                        "the upstream response broke off or outgrew the relay's limit",
                    );
                }
            }
        }
        upstream_time.ended(sent);
        if let Some(folding) = folding {
            match folding.finish() {
                Ok(response) => {
                    collected = response;
                    client_headers.insert(
                        http::header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                }
                Err(event) => return Called::stream_failure(lease, inbound.api, event.as_ref()),
            }
        }
        let body = Bytes::from(collected);
        self.metrics
            .upstream_latency(inbound.api.platform().as_str(), sent.elapsed());
        let (usage, response_id) = whole_answer(&body);
        let finish = Finish::new(self.clone(), inbound, account, started, status.as_u16());
        // Bound before the client has the answer: its next request in the conversation (or
        // with this `previous_response_id`) must find the binding.
        finish.bind_session().await;
        if let Some(response_id) = &response_id {
            finish.bind_response(response_id).await;
        }
        tokio::spawn(tracing::Instrument::in_current_span(
            finish.run(lease, usage, true),
        ));
        Called::Served(Answer::Upstream {
            status,
            headers: client_headers,
            body: Body::Full(body),
        })
    }
}

/// An error answer's body, at most `max` bytes (the rest is not read).
pub(super) async fn read_bounded(mut body: BodyStream, max: usize) -> Bytes {
    let mut read = Vec::new();
    while let Some(Ok(chunk)) = body.next().await {
        let room = max.saturating_sub(read.len());
        read.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if room <= chunk.len() {
            break;
        }
    }
    Bytes::from(read)
}

/// An upstream answer's head and its body, however it came: an HTTP answer, or a turn's events
/// on the upstream socket (`upstream_socket.rs`).
pub(super) struct Head {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    /// The body's length, when the upstream stated it.
    pub(super) length: Option<usize>,
    pub(super) body: BodyStream,
}

pub(super) type BodyStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, BodyError>> + Send + 'static>>;

/// A body that broke off (what broke, never a URL or a credential).
#[derive(Debug)]
pub(super) struct BodyError(String);

impl BodyError {
    pub(super) fn new(what: &str) -> Self {
        BodyError(what.to_owned())
    }
}

impl From<reqwest::Error> for BodyError {
    fn from(error: reqwest::Error) -> Self {
        BodyError(error.without_url().to_string())
    }
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a call got no answer.
enum Unanswered {
    /// Nothing of the request left the relay (DNS, TCP connect, TLS handshake).
    Connect(String),
    /// No answer after it went out.
    NoAnswer(String),
}

impl Relay {
    /// Sends the request: a turn from a client socket over the upstream's socket where it has
    /// one, everything else over HTTP.
    async fn send(&self, inbound: &Inbound, account: &PlannedAccount) -> Result<Head, Unanswered> {
        if let Some(turn) = &inbound.socket
            && let Some(sent) = self.socket_call(inbound, account, turn).await
        {
            return sent.map_err(|failure| match failure {
                SocketFailure::Connect(what) => Unanswered::Connect(what),
                SocketFailure::NoAnswer(what) => Unanswered::NoAnswer(what),
            });
        }
        match self.upstream_request(inbound, account).send().await {
            Ok(response) => Ok(Head {
                status: response.status(),
                headers: response.headers().clone(),
                length: response
                    .content_length()
                    .and_then(|n| usize::try_from(n).ok()),
                body: Box::pin(
                    response
                        .bytes_stream()
                        .map(|chunk| chunk.map_err(BodyError::from)),
                ),
            }),
            // Only a failed connection is known to have carried nothing of the request; a
            // timeout or an early close after it went out may be the request's doing.
            Err(error) if error.is_connect() => {
                tracing::warn!(account_id = account.id, error = %error.without_url(), "upstream unreachable");
                Err(Unanswered::Connect(
                    "the upstream could not be reached".into(),
                ))
            }
            Err(error) => {
                tracing::warn!(account_id = account.id, error = %error.without_url(), "upstream did not answer");
                Err(Unanswered::NoAnswer("the upstream did not answer".into()))
            }
        }
    }
}

/// Resolves when the lease is lost (see `Lease::lost`); never when it cannot be, or when its
/// keeper is gone.
pub(super) async fn gone(lost: &mut Option<watch::Receiver<bool>>) {
    if let Some(lost) = lost
        && lost.wait_for(|lost| *lost).await.is_ok()
    {
        return;
    }
    std::future::pending::<()>().await
}
