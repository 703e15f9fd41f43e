//! [`Leases`] over admission's lease conversations, on the [lease channels](super::channel) or
//! one `Lease` stream each: each acquire on its own task (a caller that leaves withdraws it, never
//! strands a lease), retried on another replica when its call breaks before the answer; a grant
//! is handed to a [`keeper`](super::keeper) task. [`Requests`] and [`Events`] are a
//! conversation's two halves, the same on both paths.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::api::ApiError;
use poolgate_core::lease::{Denial, DenyReason, LeaseTerms};
use poolgate_proto::admission::v1 as apb;
use poolgate_proto::admission::v1::admission_client::AdmissionClient;
use poolgate_proto::convert;
use poolgate_rpc::service_auth::WithToken;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use crate::balancer::ReplicaSet;
use crate::channel::{self, Channels, ResumePacer, Started};
use crate::error::CallError;
use crate::keeper;
use crate::metrics::Metrics;
use crate::{Traced, traced};
use poolgate_lease::api::{Acquired, LeaseApi};

/// Admission over gRPC.
pub struct RemoteLeases {
    link: Link,
    metrics: Metrics,
}

impl RemoteLeases {
    /// Leases over `channel` (balanced over `replicas`), `lease_channels` lease channels spread
    /// over the replicas carrying them (0: one `Lease` stream each).
    pub fn new(
        channel: Channel,
        replicas: ReplicaSet,
        token: Option<&str>,
        metrics: Metrics,
        grpc_metrics: &poolgate_rpc::grpc_metrics::GrpcMetrics,
        lease_channels: usize,
    ) -> Self {
        let client = AdmissionClient::new(traced(WithToken::new(channel, token), grpc_metrics));
        let connect: channel::Connect = {
            let (token, grpc_metrics) = (token.map(str::to_owned), grpc_metrics.clone());
            Arc::new(move |endpoint: &Endpoint| {
                let replica = WithToken::new(endpoint.connect_lazy(), token.as_deref());
                AdmissionClient::new(traced(replica, &grpc_metrics))
            })
        };
        RemoteLeases {
            link: Link {
                channels: Channels::new(replicas, connect, lease_channels, metrics.clone())
                    .map(Arc::new),
                pacer: Arc::new(ResumePacer::new(metrics.clone())),
                client,
            },
            metrics,
        }
    }
}

#[cfg(test)]
impl RemoteLeases {
    pub(super) fn link_channels(&self) -> Option<&Channels> {
        self.link.channels.as_deref()
    }
}

/// How lease conversations reach admission: on the lease channels when there are some and
/// admission serves them, else one `Lease` stream each; and the unary `Release`.
#[derive(Clone)]
pub(super) struct Link {
    pub(super) client: AdmissionClient<Traced>,
    channels: Option<Arc<Channels>>,
    pacer: Arc<ResumePacer>,
}

/// The holder's half of a lease conversation.
pub(super) enum Requests {
    Stream(mpsc::Sender<apb::LeaseRequest>),
    Channel(channel::Requests),
}

impl Requests {
    pub(super) async fn send(&self, request: apb::LeaseRequest) -> Result<(), tonic::Status> {
        self.send_traced(request, &TraceContext::new()).await
    }

    /// Sends `request` with the trace context of the request the lease serves: in the message
    /// on a lease channel; a `Lease` stream carries it in its metadata already.
    pub(super) async fn send_traced(
        &self,
        request: apb::LeaseRequest,
        trace: &TraceContext,
    ) -> Result<(), tonic::Status> {
        match self {
            Requests::Stream(sender) => sender
                .send(request)
                .await
                .map_err(|_| tonic::Status::unavailable("lease stream closed")),
            Requests::Channel(requests) => requests.send(request, trace.clone()).await,
        }
    }
}

/// The W3C trace context of the client request a lease serves (`traceparent`, `tracestate`),
/// taken when the acquire starts, sent with the lease's acquire, resumes and release on a lease
/// channel, so admission's spans for the lease join the request's trace. Empty when nothing is
/// traced.
pub(crate) type TraceContext = std::collections::HashMap<String, String>;

/// Admission's half of a lease conversation: its events until it ends (`None`) or fails.
pub(super) enum Events {
    Stream(tonic::Streaming<apb::LeaseEvent>),
    Channel(channel::Events),
}

impl Events {
    pub(super) async fn next(&mut self) -> Option<Result<apb::LeaseEvent, tonic::Status>> {
        match self {
            Events::Stream(events) => events.next().await,
            Events::Channel(events) => events.next().await,
        }
    }
}

impl Link {
    /// Starts a lease conversation whose first message is `first`.
    async fn start(
        &self,
        first: apb::lease_request::Kind,
        trace: &TraceContext,
    ) -> Result<(Requests, Events), tonic::Status> {
        let first = match &self.channels {
            Some(channels) => match channels.start(first, trace).await? {
                Started::On(requests, events) => {
                    return Ok((Requests::Channel(requests), Events::Channel(events)));
                }
                Started::NotServed(first) => first,
            },
            None => first,
        };
        let (sender, receiver) = mpsc::channel(8);
        sender
            .send(message(first))
            .await
            .map_err(|_| tonic::Status::internal("lease stream closed"))?;
        let events = self
            .client
            .clone()
            .lease(ReceiverStream::new(receiver))
            .await?
            .into_inner();
        Ok((Requests::Stream(sender), Events::Stream(events)))
    }

    /// Starts a conversation with `first` and reads until the answer.
    async fn open(
        &self,
        first: apb::lease_request::Kind,
        trace: &TraceContext,
    ) -> Result<Opened, CallError> {
        let (requests, mut events) = self.start(first, trace).await?;
        let answer = answer(&mut events).await?;
        Ok((requests, events, answer))
    }

    /// [`open`](Self::open) with a `Resume`, in its turn (see [`ResumePacer`]).
    pub(super) async fn resume(
        &self,
        resume: apb::Resume,
        trace: &TraceContext,
    ) -> Result<Opened, CallError> {
        let _turn = self.pacer.admit().await;
        self.open(apb::lease_request::Kind::Resume(resume), trace)
            .await
    }
}

/// A conversation with the answer to its first message.
pub(super) type Opened = (Requests, Events, Result<apb::Granted, Denial>);

/// The `Acquire` of `terms`, asking to wait up to `wait`.
pub(super) fn acquire_pb(terms: &LeaseTerms, wait: Duration) -> apb::Acquire {
    apb::Acquire {
        wait_ms: convert::wait_ms(wait),
        ..apb::Acquire::from(terms)
    }
}

pub(super) fn message(kind: apb::lease_request::Kind) -> apb::LeaseRequest {
    apb::LeaseRequest { kind: Some(kind) }
}

/// Reads a lease conversation until the answer to its first message (`Queued` events skipped). A
/// denial whose reason this relay cannot read is an error (it would otherwise be acted on as a
/// guess: a user-RPM refusal taken for a full account fails over instead of answering 429).
async fn answer(events: &mut Events) -> Result<Result<apb::Granted, Denial>, CallError> {
    loop {
        match events.next().await {
            Some(Ok(apb::LeaseEvent {
                kind: Some(apb::lease_event::Kind::Queued(_)),
            })) => continue,
            Some(Ok(apb::LeaseEvent {
                kind: Some(apb::lease_event::Kind::Granted(granted)),
            })) => return Ok(Ok(granted)),
            Some(Ok(apb::LeaseEvent {
                kind: Some(apb::lease_event::Kind::Denied(denied)),
            })) => {
                return Denial::try_from(denied).map(Err).map_err(|error| {
                    tracing::warn!(%error, "admission's denial is unreadable; treated as an admission error");
                    CallError::from(error)
                });
            }
            // The answer to a `Resume` of a released lease: it is gone for good.
            Some(Ok(apb::LeaseEvent {
                kind: Some(apb::lease_event::Kind::Lost(_)),
            })) => return Ok(Err(Denial::new(DenyReason::LeaseUnknown, 0))),
            Some(Ok(_)) => return Err(tonic::Status::internal("unexpected lease event").into()),
            Some(Err(status)) => return Err(status.into()),
            None => {
                return Err(
                    tonic::Status::unavailable("lease stream ended without an answer").into(),
                );
            }
        }
    }
}

#[async_trait]
impl LeaseApi for RemoteLeases {
    async fn acquire(&self, terms: LeaseTerms, wait: Duration) -> Result<Acquired, ApiError> {
        let (reply, answer) = oneshot::channel();
        let trace = poolgate_rpc::telemetry::context_map();
        // In the request's span, so the lease call carries its trace context.
        tokio::spawn(tracing::Instrument::instrument(
            acquire_task(
                self.link.clone(),
                self.metrics.clone(),
                terms,
                wait,
                trace,
                reply,
            ),
            tracing::Span::current(),
        ));
        Ok(answer
            .await
            .unwrap_or(Err(CallError::NoAnswer("the lease task ended")))?)
    }
}

/// How long an acquire whose call breaks before its answer (a replica died or is unreachable)
/// is tried again, counted from the break: long enough for the balancer to drop a dead replica
/// (`PROBE_EVERY`).
pub(super) const ACQUIRE_RETRY_FOR: Duration = Duration::from_secs(2);

/// A call that broke in transport, or a replica that could not reach its backend: another
/// replica may answer. (A lease the broken call may have been granted is reaped at its TTL.) A
/// lease channel holding as many conversations as admission allows on one (`RESOURCE_EXHAUSTED`)
/// leaves the next try to the next channel.
fn worth_another_replica(error: &CallError) -> bool {
    matches!(
        error,
        CallError::Status {
            code: tonic::Code::Unavailable
                | tonic::Code::Unknown
                | tonic::Code::Cancelled
                | tonic::Code::Internal
                | tonic::Code::ResourceExhausted,
            ..
        }
    )
}

/// One acquire, on its own task so that a caller that goes away (the client left) never strands
/// a lease: a waiting acquire is withdrawn, and a grant that raced the departure is released at
/// once instead of waiting out the orphan grace. A call that breaks before its answer is tried
/// again, on the next replica in turn, for [`ACQUIRE_RETRY_FOR`] after it broke (with what is
/// left of the caller's wait): an acquire that waited in a replica's queue for seconds before
/// the replica died is tried again as surely as one that broke at once.
async fn acquire_task(
    link: Link,
    metrics: Metrics,
    terms: LeaseTerms,
    wait: Duration,
    trace: TraceContext,
    mut reply: oneshot::Sender<Result<Acquired, CallError>>,
) {
    let started = tokio::time::Instant::now();
    let deadline = started + wait;
    let mut tries = 0u64;
    // When the calls started breaking: the first break after a call that lived through a whole
    // retry window opens a new window.
    let mut breaking_since: Option<tokio::time::Instant> = None;
    loop {
        tries += 1;
        let tried_at = tokio::time::Instant::now();
        let left = deadline.saturating_duration_since(tried_at);
        // Not raced with the caller's departure: once sent, the acquire must be answered (and
        // a grant released), or the lease would be left to the orphan grace.
        let first = apb::lease_request::Kind::Acquire(acquire_pb(&terms, left));
        let error = match link.start(first, &trace).await {
            Err(status) => CallError::from(status),
            Ok((sender, mut events)) => {
                let answer = tokio::select! {
                    answer = answer(&mut events) => Some(answer),
                    _ = reply.closed() => None,
                };
                let Some(answer) = answer else {
                    withdraw(&sender, &mut events, &trace).await;
                    return;
                };
                match answer {
                    Ok(Ok(granted)) => {
                        let lease =
                            keeper::spawn(link, terms, granted, sender, events, metrics, trace);
                        // A caller that left just now drops the lease with the unsent reply;
                        // the keeper sees its commands end and releases.
                        let _ = reply.send(Ok(Acquired::Granted(Box::new(lease))));
                        return;
                    }
                    Ok(Err(denial)) => {
                        let _ = reply.send(Ok(Acquired::Denied(denial)));
                        return;
                    }
                    Err(error) => error,
                }
            }
        };
        let now = tokio::time::Instant::now();
        let since = match breaking_since {
            Some(since) if now.duration_since(tried_at) < ACQUIRE_RETRY_FOR => since,
            _ => now,
        };
        breaking_since = Some(since);
        if now.duration_since(since) < ACQUIRE_RETRY_FOR
            && worth_another_replica(&error)
            && !reply.is_closed()
        {
            tracing::debug!(%error, tries, "lease call broke before its answer; trying again");
            tokio::time::sleep(Duration::from_millis((50 * tries).min(250))).await;
            continue;
        }
        let _ = reply.send(Err(error));
        return;
    }
}

/// Withdraws an unanswered acquire (`Release` before the answer): admission cancels the wait or
/// releases what it granted meanwhile, and answers `Released`.
async fn withdraw(sender: &Requests, events: &mut Events, trace: &TraceContext) {
    let release = apb::lease_request::Kind::Release(apb::Release {
        spend_usd: 0.0,
        tokens: 0,
    });
    if sender.send_traced(message(release), trace).await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(event)) = events.next().await {
            if matches!(
                event.kind,
                Some(apb::lease_event::Kind::Released(_)) | Some(apb::lease_event::Kind::Denied(_))
            ) {
                return;
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;

    use futures_util::Stream;
    use poolgate_proto::admission::v1::admission_server::{Admission, AdmissionServer};
    use tonic::{Request, Response, Status, Streaming};

    use super::*;
    use crate::{GrpcClient, balanced_channel_with_replicas};

    /// An admission that denies every lease with `reason` as it is on the wire.
    struct Denying {
        reason: i32,
    }

    type LeaseEvents = Pin<Box<dyn Stream<Item = Result<apb::LeaseEvent, Status>> + Send>>;

    #[tonic::async_trait]
    impl Admission for Denying {
        type LeaseStream = LeaseEvents;
        type LeaseChannelStream =
            Pin<Box<dyn Stream<Item = Result<apb::ChannelEvent, Status>> + Send>>;

        async fn lease_channel(
            &self,
            _request: Request<Streaming<apb::ChannelRequest>>,
        ) -> Result<Response<Self::LeaseChannelStream>, Status> {
            Err(Status::unimplemented("not in this test"))
        }

        async fn lease(
            &self,
            _request: Request<Streaming<apb::LeaseRequest>>,
        ) -> Result<Response<LeaseEvents>, Status> {
            let denied = apb::LeaseEvent {
                kind: Some(apb::lease_event::Kind::Denied(apb::Denied {
                    reason: self.reason,
                    retry_after_ms: 0,
                })),
            };
            Ok(Response::new(Box::pin(tokio_stream::iter([Ok(denied)]))))
        }

        async fn release(
            &self,
            _request: Request<apb::ReleaseRequest>,
        ) -> Result<Response<apb::ReleaseResponse>, Status> {
            Err(Status::unimplemented("not in this test"))
        }

        async fn inflight(
            &self,
            _request: Request<apb::InflightRequest>,
        ) -> Result<Response<apb::InflightResponse>, Status> {
            Err(Status::unimplemented("not in this test"))
        }

        async fn record_spend(
            &self,
            _request: Request<apb::RecordSpendRequest>,
        ) -> Result<Response<apb::RecordSpendResponse>, Status> {
            Err(Status::unimplemented("not in this test"))
        }
    }

    async fn acquire_from(reason: i32) -> Result<Acquired, ApiError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AdmissionServer::new(Denying { reason }))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let metrics = Metrics::new();
        let grpc_metrics = poolgate_rpc::grpc_metrics::GrpcMetrics::client(&metrics.registry);
        let (channel, replicas) =
            balanced_channel_with_replicas(&[format!("http://{address}")], &GrpcClient::default())
                .expect("channel");
        let leases = RemoteLeases::new(channel, replicas, None, metrics, &grpc_metrics, 0);
        let terms = LeaseTerms::try_from(apb::Acquire {
            account_id: 1,
            concurrency_limit: 1,
            ..apb::Acquire::default()
        })
        .expect("valid terms");
        leases.acquire(terms, Duration::ZERO).await
    }

    #[tokio::test]
    async fn a_denial_whose_reason_the_relay_cannot_read_is_an_admission_error_not_a_guess() {
        match acquire_from(apb::DenyReason::UserRpm as i32).await {
            Ok(Acquired::Denied(denial)) => assert_eq!(denial.reason, DenyReason::UserRpm),
            Ok(Acquired::Granted(_)) => panic!("granted"),
            Err(error) => panic!("a known reason is read: {error}"),
        }
        for unreadable in [99, apb::DenyReason::Unspecified as i32] {
            match acquire_from(unreadable).await {
                Err(ApiError::Unreadable(error)) => {
                    assert!(error.contains("invalid reason"), "{error}")
                }
                Err(error) => panic!("{unreadable}: not a conversion error: {error}"),
                Ok(Acquired::Denied(denial)) => panic!("{unreadable} read as {denial:?}"),
                Ok(Acquired::Granted(_)) => panic!("granted"),
            }
        }
    }
}
