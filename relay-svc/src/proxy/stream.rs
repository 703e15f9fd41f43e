//! The SSE pump of a streamed answer: the first upstream byte awaited under the lease (a
//! request can still fail over until then), then every chunk passed on as it comes (usage the
//! relay asked for stripped out), the session and response bound as soon as they can be, an
//! error event inside the 200 classified and reported, bookkeeping after the last byte.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use poolgate_core::classify::{UpstreamError, classify_stream_error, network_failure};
use poolgate_core::outcome::OutcomeClass;
use tokio::sync::mpsc;

use super::body::asks_stream_usage;
use super::call::{Answered, BodyError, gone};
use super::finish::Finish;
use super::{Answer, Body, Called, Inbound, Relay, UpstreamTime};
use crate::client_api::{Api, ErrorKind, RelayError};
use crate::ports::{Lease, PlannedAccount};
use crate::usage::{ChatUsageStripper, SseScanner};

impl Relay {
    /// Serves a streamed answer. Fails over only before the first upstream byte reaches the
    /// client; after it, the stream is the client's, whatever comes.
    pub(super) async fn serve_stream<S>(
        self: Arc<Self>,
        inbound: &Inbound,
        account: &PlannedAccount,
        answered: Answered<S>,
        started: Instant,
        upstream_time: &mut UpstreamTime,
    ) -> Called
    where
        S: Stream<Item = Result<Bytes, BodyError>> + Unpin + Send + 'static,
    {
        let Answered {
            status,
            headers,
            body: mut upstream,
            lease,
            mut lost,
            sent,
            ..
        } = answered;
        let first = tokio::select! {
            first = upstream.next() => first,
            _ = gone(&mut lost) => {
                upstream_time.ended(sent);
                return Called::LeaseLost(lease);
            }
        };
        upstream_time.ended(sent);
        let Some(Ok(first)) = first else {
            return Called::network_failure(
                lease,
                inbound.api,
                "the upstream stream ended before its first byte",
            );
        };
        let api = inbound.api;
        self.metrics
            .time_to_first_byte(api.platform().as_str(), sent.elapsed());
        let (sender, receiver) = mpsc::channel::<Bytes>(32);
        let pump = Pump {
            finish: Finish::new(self.clone(), inbound, account, started, status.as_u16()),
            // What the relay added to the stream by asking for usage comes out again.
            stripper: asks_stream_usage(inbound, account).then(ChatUsageStripper::default),
            sender,
            api,
            sent,
        };
        tokio::spawn(tracing::Instrument::in_current_span(
            pump.run(upstream, first, lease),
        ));
        Called::Served(Answer::Upstream {
            status,
            headers,
            body: Body::Stream(receiver),
        })
    }
}

/// What the pump of one streamed answer needs besides the stream and the lease.
struct Pump {
    finish: Finish,
    stripper: Option<ChatUsageStripper>,
    /// Toward the client; closed when the client leaves.
    sender: mpsc::Sender<Bytes>,
    api: Api,
    sent: Instant,
}

impl Pump {
    /// Passes the stream on from its first chunk to its end (or the client's departure), then
    /// does the bookkeeping.
    async fn run<S>(self, mut upstream: S, first: Bytes, lease: Box<dyn Lease>)
    where
        S: Stream<Item = Result<Bytes, BodyError>> + Unpin,
    {
        let Pump {
            finish,
            mut stripper,
            sender,
            api,
            sent,
        } = self;
        let mut scanner = SseScanner::default();
        let mut response_bound = false;
        scanner.feed(&first);
        finish
            .bind_response_once(&scanner, &mut response_bound)
            .await;
        let mut complete = sender.send(strip(&mut stripper, first)).await.is_ok();
        // Bound while the stream runs, long before the client can send its next request.
        if complete {
            finish.bind_session().await;
        }
        let mut client_gone = !complete;
        while complete {
            tokio::select! {
                chunk = upstream.next() => match chunk {
                    Some(Ok(chunk)) => {
                        scanner.feed(&chunk);
                        // Bound as soon as the id shows, before the client has it.
                        finish.bind_response_once(&scanner, &mut response_bound).await;
                        let chunk = strip(&mut stripper, chunk);
                        if !chunk.is_empty() && sender.send(chunk).await.is_err() {
                            client_gone = true;
                            complete = false;
                        }
                    }
                    Some(Err(error)) => {
                        tracing::warn!(account_id = finish.account.id, %error, "upstream stream broke mid-way");
                        let error = RelayError::new(api, ErrorKind::Upstream, "the upstream stream broke off; the response is incomplete");
                        let _ = sender.send(error.sse_event()).await;
                        complete = false;
                        if finish.governed {
                            finish.relay.report(finish.account.id, &network_failure(), 0, "stream broke mid-way", None).await;
                        }
                    }
                    None => {
                        if let Some(rest) = stripper.as_mut().map(ChatUsageStripper::finish)
                            && !rest.is_empty()
                        {
                            let _ = sender.send(Bytes::from(rest)).await;
                        }
                        break;
                    }
                },
                // A client that disconnects cancels the upstream call at once.
                _ = sender.closed() => {
                    client_gone = true;
                    complete = false;
                }
            }
        }
        drop(upstream);
        finish
            .relay
            .metrics
            .upstream_latency(api.platform().as_str(), sent.elapsed());
        if client_gone {
            finish.relay.metrics.client_disconnects.inc();
            // The upstream notices the closed connection at its next write; until then it
            // still counts the request (see `Lingering`).
            tokio::time::sleep(finish.relay.settings.cancel_linger).await;
        }
        // A Responses `response.incomplete` (max output tokens, a content filter) is not an
        // error event: the upstream answered, the client has it as it came, a success.
        let succeeded = complete && !client_gone && scanner.error.is_none();
        if let Some(event) = &scanner.error {
            // A 200 whose stream carried an error event is not a success; what the event
            // says decides (busy, broken, billing), and a request-caused one changes nothing.
            let classified = classify_stream_error(event);
            if classified.class != OutcomeClass::ClientError && finish.governed {
                let reason = UpstreamError::from_json(event)
                    .map(|e| e.summary())
                    .unwrap_or_default();
                finish
                    .relay
                    .report(finish.account.id, &classified, 200, &reason, None)
                    .await;
            }
        }
        finish.run(lease, scanner.usage, succeeded).await;
    }
}

/// A stream chunk as the client gets it (see `ChatUsageStripper`).
fn strip(stripper: &mut Option<ChatUsageStripper>, chunk: Bytes) -> Bytes {
    match stripper {
        Some(stripper) => Bytes::from(stripper.feed(&chunk)),
        None => chunk,
    }
}
