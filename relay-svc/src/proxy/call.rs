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
use poolgate_core::classify::{classify, classify_stream_error, network_failure};
use poolgate_core::now_ms;
use serde_json::Value;
use tokio::sync::watch;

use super::finish::Finish;
use super::request::response_headers;
use super::{Answer, Body, Called, Inbound, Relay};
use crate::backends::{Lease, Planned};
use crate::usage::{Usage, completed_response};

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
}

impl Called {
    /// No usable answer from upstream (unreachable, or its body broke off): a network failure,
    /// told to the client as a 502 with `what`.
    pub(super) fn network_failure(lease: Box<dyn Lease>, what: &'static str) -> Called {
        Called::Failed {
            classified: network_failure(),
            status: 502,
            headers: HeaderMap::new(),
            body: Bytes::from_static(what.as_bytes()),
            lease,
        }
    }
}

impl Relay {
    pub(super) async fn call(
        self: Arc<Self>,
        inbound: &Inbound,
        account: &Planned,
        lease: Box<dyn Lease>,
        started: Instant,
    ) -> Called {
        let sent = Instant::now();
        // Until the first byte reaches the client, a lease admission says is gone (released by
        // someone else, no room to restore it) ends this call: the request fails over.
        let mut lost = lease.lost();
        let answered = tokio::select! {
            answered = self.upstream_request(inbound, account).send() => answered,
            _ = gone(&mut lost) => return Called::LeaseLost(lease),
        };
        let response = match answered {
            Ok(response) => response,
            Err(error) => {
                tracing::warn!(account_id = account.id, error = %error.without_url(), "upstream unreachable");
                return Called::network_failure(lease, "upstream unreachable");
            }
        };
        let status = response.status();
        let headers = response.headers().clone();
        if !status.is_success() {
            let body = read_bounded(response, self.settings.max_body_bytes).await;
            let classified = classify(
                status.as_u16(),
                &headers,
                &body,
                now_ms(),
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
            headers: response_headers(&headers),
            body: response.bytes_stream(),
            lease,
            lost,
            sent,
        };
        if !is_sse || fold {
            self.serve_whole(inbound, account, answered, started, fold)
                .await
        } else {
            self.serve_stream(inbound, account, answered, started).await
        }
    }

    /// Reads the whole answer, then serves it; bookkeeping follows on its own task.
    async fn serve_whole<S>(
        self: Arc<Self>,
        inbound: &Inbound,
        account: &Planned,
        answered: Answered<S>,
        started: Instant,
        fold: bool,
    ) -> Called
    where
        S: Stream<Item = reqwest::Result<Bytes>> + Unpin,
    {
        let Answered {
            status,
            headers: mut client_headers,
            body: mut upstream,
            lease,
            mut lost,
            sent,
        } = answered;
        let mut collected = Vec::new();
        loop {
            let chunk = tokio::select! {
                chunk = upstream.next() => chunk,
                _ = gone(&mut lost) => return Called::LeaseLost(lease),
            };
            match chunk {
                None => break,
                Some(Ok(chunk))
                    if collected.len() + chunk.len() <= self.settings.max_body_bytes =>
                {
                    collected.extend_from_slice(&chunk)
                }
                Some(_) => return Called::network_failure(lease, "upstream response broke off"),
            }
        }
        let mut body = Bytes::from(collected);
        if fold {
            match completed_response(&body) {
                Ok(response) => {
                    body = Bytes::from(serde_json::to_vec(&response).unwrap_or_default());
                    client_headers.insert(
                        http::header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                }
                Err(event) => {
                    return Called::Failed {
                        classified: event
                            .as_ref()
                            .map(classify_stream_error)
                            .unwrap_or_else(network_failure),
                        status: 502,
                        headers: HeaderMap::new(),
                        body: Bytes::from(event.map(|e| e.to_string()).unwrap_or_else(|| {
                            "the upstream stream ended without a response".into()
                        })),
                        lease,
                    };
                }
            }
        }
        self.metrics
            .upstream_latency(inbound.api.platform().as_str(), sent.elapsed());
        let mut usage = Usage::default();
        let mut response_id = None;
        if let Ok(json) = serde_json::from_slice::<Value>(&body) {
            usage.absorb_message(&json);
            response_id = json
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| id.starts_with("resp_"))
                .map(str::to_owned);
        }
        let finish = Finish::new(self.clone(), inbound, account, started, status.as_u16());
        // Bound before the client has the answer: its next request in the conversation (or
        // with this `previous_response_id`) must find the binding.
        finish.bind_session().await;
        if let Some(response_id) = &response_id
            && finish.governed
        {
            self.selection.bind_response(response_id, account.id).await;
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
async fn read_bounded(response: reqwest::Response, max: usize) -> Bytes {
    let mut stream = response.bytes_stream();
    let mut body = Vec::new();
    while let Some(Ok(chunk)) = stream.next().await {
        let room = max.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if room <= chunk.len() {
            break;
        }
    }
    Bytes::from(body)
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
