//! The lease channel client against a fake admission that scripts its answers.

use std::collections::HashSet;
use std::pin::Pin;

use futures_util::Stream;
use poolgate_core::lease::LeaseTerms;
use poolgate_proto::admission::v1::admission_server::{Admission, AdmissionServer};
use poolgate_testkit::eventually;
use tonic::{Request, Response, Streaming};

use super::*;
use crate::{GrpcClient, RemoteLeases, balanced_channel_with_replicas};
use poolgate_core::api::ApiError;
use poolgate_lease::api::{Acquired, Lease, LeaseApi};

type Outbound = mpsc::Sender<Result<apb::ChannelEvent, Status>>;

/// What the fake admission saw, and the channels it serves (to break them).
#[derive(Default)]
struct Seen {
    channels_opened: usize,
    lease_streams: usize,
    acquires: HashSet<u64>,
    resumes: usize,
    releases: Vec<u64>,
    closes: Vec<u64>,
    channels: Vec<Outbound>,
}

/// How the fake admission answers.
#[derive(Clone, Copy, Default)]
struct Behaviour {
    /// `LeaseChannel` answers `UNIMPLEMENTED` (an admission older than the channel).
    no_channel: bool,
    /// Acquires wait (`Queued`) until withdrawn.
    queue: bool,
    /// Only the first acquire waits; later ones are granted.
    queue_first: bool,
    /// Acquires fail with this gRPC code (then `end`).
    fail_with: Option<tonic::Code>,
    /// `Released` is not followed by `end` (it comes late: the holder has its final answer
    /// and must not close the conversation meanwhile).
    late_end: bool,
}

/// An admission that grants every acquire and resume at once and records what it saw.
#[derive(Clone, Default)]
struct Fake {
    seen: Arc<Mutex<Seen>>,
    behaviour: Behaviour,
}

impl Fake {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fails every channel it serves, as a replica going away does.
    fn break_channels(&self) {
        for channel in self.seen().channels.drain(..) {
            let _ = channel.try_send(Err(Status::unavailable("replica gone")));
        }
    }

    /// The events answering one message of conversation `tag`.
    fn answer(&self, tag: u64, kind: apb::lease_request::Kind) -> Vec<apb::channel_event::Kind> {
        use apb::channel_event::Kind as Event;
        use apb::lease_event::Kind as Lease;
        let event = |kind| Event::Event(apb::LeaseEvent { kind: Some(kind) });
        let granted = || {
            event(Lease::Granted(apb::Granted {
                lease_id: format!("1.fake.{tag}"),
                ttl_ms: 30_000,
            }))
        };
        match kind {
            apb::lease_request::Kind::Acquire(_) => {
                let first = {
                    let mut seen = self.seen();
                    seen.acquires.insert(tag);
                    seen.acquires.len() == 1
                };
                let queue = self.behaviour.queue || (self.behaviour.queue_first && first);
                match (self.behaviour.fail_with, queue) {
                    (Some(code), _) => vec![
                        Event::Error(apb::ChannelError {
                            code: code as i32,
                            message: "account_id: must be > 0".into(),
                        }),
                        Event::End(apb::ChannelEnd {}),
                    ],
                    (None, true) => vec![event(Lease::Queued(apb::Queued { position: 1 }))],
                    (None, false) => vec![granted()],
                }
            }
            apb::lease_request::Kind::Resume(_) => {
                self.seen().resumes += 1;
                vec![granted()]
            }
            apb::lease_request::Kind::Heartbeat(_) => {
                vec![event(Lease::Renewed(apb::Renewed {
                    ttl_ms: 30_000,
                    restored: false,
                }))]
            }
            apb::lease_request::Kind::Attempt(_) => {
                vec![event(Lease::AttemptAccepted(apb::AttemptAccepted {}))]
            }
            apb::lease_request::Kind::Release(_) => {
                self.seen().releases.push(tag);
                let released = event(Lease::Released(apb::Released {}));
                if self.behaviour.late_end {
                    vec![released]
                } else {
                    vec![released, Event::End(apb::ChannelEnd {})]
                }
            }
        }
    }
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Admission for Fake {
    type LeaseStream = Boxed<apb::LeaseEvent>;
    type LeaseChannelStream = Boxed<apb::ChannelEvent>;

    async fn lease_channel(
        &self,
        request: Request<Streaming<apb::ChannelRequest>>,
    ) -> Result<Response<Self::LeaseChannelStream>, Status> {
        if self.behaviour.no_channel {
            return Err(Status::unimplemented("older admission"));
        }
        let (sender, receiver) = mpsc::channel(1024);
        {
            let mut seen = self.seen();
            seen.channels_opened += 1;
            seen.channels.push(sender.clone());
        }
        let fake = self.clone();
        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                let events = match message.kind {
                    Some(apb::channel_request::Kind::Request(apb::LeaseRequest {
                        kind: Some(kind),
                    })) => fake.answer(message.tag, kind),
                    Some(apb::channel_request::Kind::Close(_)) => {
                        fake.seen().closes.push(message.tag);
                        vec![apb::channel_event::Kind::End(apb::ChannelEnd {})]
                    }
                    _ => vec![],
                };
                for kind in events {
                    let event = apb::ChannelEvent {
                        tag: message.tag,
                        kind: Some(kind),
                    };
                    if sender.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }

    async fn lease(
        &self,
        request: Request<Streaming<apb::LeaseRequest>>,
    ) -> Result<Response<Self::LeaseStream>, Status> {
        let tag = {
            let mut seen = self.seen();
            seen.lease_streams += 1;
            1000 + seen.lease_streams as u64
        };
        let (sender, receiver) = mpsc::channel(16);
        let fake = self.clone();
        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            while let Ok(Some(apb::LeaseRequest { kind: Some(kind) })) = inbound.message().await {
                for event in fake.answer(tag, kind) {
                    if let apb::channel_event::Kind::Event(event) = event
                        && sender.send(Ok(event)).await.is_err()
                    {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }

    async fn release(
        &self,
        _request: Request<apb::ReleaseRequest>,
    ) -> Result<Response<apb::ReleaseResponse>, Status> {
        Ok(Response::new(apb::ReleaseResponse { released: true }))
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

/// `fake` served on a free port, and a client of it with `channels` lease channels.
async fn serve(fake: Fake, channels: usize) -> (RemoteLeases, Metrics) {
    serve_replicas(vec![fake], channels).await
}

/// Each fake a replica on a free port, and a client balanced over them.
async fn serve_replicas(fakes: Vec<Fake>, channels: usize) -> (RemoteLeases, Metrics) {
    let mut urls = Vec::new();
    for fake in fakes {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        urls.push(format!(
            "http://{}",
            listener.local_addr().expect("address")
        ));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AdmissionServer::new(fake))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
    }
    let metrics = Metrics::new();
    let grpc_metrics = poolgate_rpc::grpc_metrics::GrpcMetrics::client(&metrics.registry);
    let (channel, replicas) =
        balanced_channel_with_replicas(&urls, &GrpcClient::default()).expect("channel");
    let leases = RemoteLeases::new(
        channel,
        replicas,
        None,
        metrics.clone(),
        &grpc_metrics,
        channels,
    );
    (leases, metrics)
}

fn terms() -> LeaseTerms {
    LeaseTerms::try_from(apb::Acquire {
        account_id: 1,
        concurrency_limit: 100,
        ..apb::Acquire::default()
    })
    .expect("valid terms")
}

async fn granted(leases: &RemoteLeases) -> Box<dyn Lease> {
    match leases.acquire(terms(), Duration::ZERO).await {
        Ok(Acquired::Granted(lease)) => lease,
        Ok(Acquired::Denied(denial)) => panic!("denied: {denial:?}"),
        Err(error) => panic!("acquire failed: {error}"),
    }
}

fn event_count(metrics: &Metrics, event: &str) -> u64 {
    metrics.lease_channel.with_label_values(&[event]).get()
}

const WITHIN: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_leases_share_one_channel_each_on_its_own_tag() {
    let fake = Fake::default();
    let (leases, metrics) = serve(fake.clone(), 1).await;
    let leases = Arc::new(leases);
    let mut acquires = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let leases = leases.clone();
        acquires.spawn(async move { granted(&leases).await });
    }
    let mut held = Vec::new();
    while let Some(lease) = acquires.join_next().await {
        held.push(lease.expect("acquire task"));
    }
    for lease in held {
        lease.release(0.01, 10).await;
    }
    let seen = fake.seen();
    assert_eq!(seen.channels_opened, 1, "one channel carries every lease");
    assert_eq!(seen.lease_streams, 0);
    assert_eq!(seen.acquires.len(), 50, "each lease on a tag of its own");
    assert_eq!(seen.releases.len(), 50, "each released on its tag");
    assert!(seen.closes.is_empty(), "released leases are not closed");
    assert_eq!(event_count(&metrics, "opened"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_channels_are_spread_over_every_replica_and_leases_take_turns() {
    let replicas = [Fake::default(), Fake::default()];
    let (leases, _metrics) = serve_replicas(replicas.to_vec(), 4).await;
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(granted(&leases).await);
    }
    for replica in &replicas {
        let seen = replica.seen();
        assert_eq!(seen.channels_opened, 2, "4 channels over 2 replicas");
        assert_eq!(seen.acquires.len(), 4, "leases in turn");
    }
    for lease in held {
        lease.release(0.0, 0).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_channel_fails_its_leases_which_resume_and_the_next_acquire_opens_another() {
    let fake = Fake::default();
    let (leases, metrics) = serve(fake.clone(), 1).await;
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(granted(&leases).await);
    }
    fake.break_channels();
    eventually(WITHIN, || async {
        (metrics.leases_resumed.get() == 10).then_some(())
    })
    .await
    .expect("every lease on the broken channel resumed");
    assert_eq!(fake.seen().resumes, 10);
    assert_eq!(event_count(&metrics, "broken"), 1);
    let next = granted(&leases).await;
    assert_eq!(
        fake.seen().channels_opened,
        2,
        "a new channel after the break"
    );
    for lease in held {
        assert!(
            !*lease.lost().expect("a lost signal").borrow(),
            "resumed, not lost"
        );
        lease.release(0.0, 0).await;
    }
    next.release(0.0, 0).await;
    assert_eq!(fake.seen().releases.len(), 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_replica_breaks_after_a_long_wait_is_tried_again_and_granted() {
    let fake = Fake {
        behaviour: Behaviour {
            queue_first: true,
            ..Behaviour::default()
        },
        ..Fake::default()
    };
    let (leases, _metrics) = serve(fake.clone(), 1).await;
    let leases = Arc::new(leases);
    let waiting = tokio::spawn({
        let leases = leases.clone();
        async move { leases.acquire(terms(), Duration::from_secs(20)).await }
    });
    // Queued for longer than the retry window before its replica goes away.
    eventually(WITHIN, || async {
        (fake.seen().acquires.len() == 1).then_some(())
    })
    .await
    .expect("the acquire is queued");
    tokio::time::sleep(super::super::leases::ACQUIRE_RETRY_FOR + Duration::from_millis(500)).await;
    fake.break_channels();
    let answer = tokio::time::timeout(WITHIN, waiting)
        .await
        .expect("answered")
        .expect("acquire task");
    match answer {
        Ok(Acquired::Granted(lease)) => lease.release(0.0, 0).await,
        Ok(Acquired::Denied(denial)) => panic!("denied: {denial:?}"),
        Err(error) => panic!("the broken wait was not tried again: {error}"),
    }
    assert_eq!(fake.seen().acquires.len(), 2, "asked again after the break");
}

/// Starts a conversation with an `Acquire` on `leases`' channels and reads its answer.
async fn conversation(leases: &RemoteLeases) -> (Requests, Events, u64) {
    let channels = leases.link_channels().expect("channels");
    let first = apb::lease_request::Kind::Acquire(super::super::leases::acquire_pb(
        &terms(),
        Duration::ZERO,
    ));
    let Ok(Started::On(requests, mut events)) = channels.start(first, &Default::default()).await
    else {
        panic!("a conversation on the channel");
    };
    match events.next().await {
        Some(Ok(apb::LeaseEvent {
            kind: Some(apb::lease_event::Kind::Granted(_)),
        })) => {}
        other => panic!("not granted: {other:?}"),
    }
    let tag = events.tag;
    (requests, events, tag)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_dropped_before_its_final_answer_is_closed_and_an_answered_one_is_not() {
    let fake = Fake {
        behaviour: Behaviour {
            late_end: true,
            ..Behaviour::default()
        },
        ..Fake::default()
    };
    let (leases, _metrics) = serve(fake.clone(), 1).await;
    let (requests, events, dropped) = conversation(&leases).await;
    drop((requests, events));
    eventually(WITHIN, || async {
        fake.seen().closes.contains(&dropped).then_some(())
    })
    .await
    .expect("the dropped conversation's tag is closed");

    let (requests, mut events, released) = conversation(&leases).await;
    let release = apb::lease_request::Kind::Release(apb::Release {
        spend_usd: 0.0,
        tokens: 0,
    });
    requests
        .send(super::super::leases::message(release), Default::default())
        .await
        .expect("sent");
    assert!(matches!(
        events.next().await,
        Some(Ok(apb::LeaseEvent {
            kind: Some(apb::lease_event::Kind::Released(_))
        }))
    ));
    // Dropped with its final answer, before admission's `end`.
    drop((requests, events));
    // A third conversation after the drop: the channel handles messages in order, so a
    // close of the released tag would have been seen before its acquire.
    let (_requests, _events, third) = conversation(&leases).await;
    let seen = fake.seen();
    assert!(seen.acquires.contains(&third));
    assert_eq!(
        seen.closes,
        vec![dropped],
        "no close for a released conversation"
    );
    assert_eq!(seen.releases, vec![released]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_whose_caller_leaves_is_withdrawn_on_its_tag() {
    let fake = Fake {
        behaviour: Behaviour {
            queue: true,
            ..Behaviour::default()
        },
        ..Fake::default()
    };
    let (leases, _metrics) = serve(fake.clone(), 2).await;
    let waiting = tokio::spawn(async move {
        let _ = leases.acquire(terms(), Duration::from_secs(30)).await;
    });
    let tag = eventually(WITHIN, || async {
        fake.seen().acquires.iter().next().copied()
    })
    .await
    .expect("the acquire waits");
    waiting.abort();
    eventually(WITHIN, || async {
        fake.seen().releases.contains(&tag).then_some(())
    })
    .await
    .expect("withdrawn with a release on its tag");
    assert!(fake.seen().closes.is_empty(), "withdrawn, not closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_without_the_channel_gets_one_stream_per_lease_and_is_asked_once() {
    let fake = Fake {
        behaviour: Behaviour {
            no_channel: true,
            ..Behaviour::default()
        },
        ..Fake::default()
    };
    let (leases, metrics) = serve(fake.clone(), 4).await;
    for _ in 0..3 {
        granted(&leases).await.release(0.0, 0).await;
    }
    assert_eq!(fake.seen().lease_streams, 3, "one stream per lease");
    assert_eq!(fake.seen().releases.len(), 3);
    assert_eq!(
        event_count(&metrics, "fallback"),
        1,
        "asked once, remembered"
    );
    assert_eq!(event_count(&metrics, "opened"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_error_is_the_status_its_lease_stream_would_fail_with() {
    let fake = Fake {
        behaviour: Behaviour {
            fail_with: Some(tonic::Code::InvalidArgument),
            ..Behaviour::default()
        },
        ..Fake::default()
    };
    let (leases, _metrics) = serve(fake.clone(), 1).await;
    match leases.acquire(terms(), Duration::ZERO).await {
        // The stream's INVALID_ARGUMENT, with its words.
        Err(ApiError::Invalid { message, .. }) => {
            assert!(message.contains("account_id"), "{message}");
        }
        Err(error) => panic!("another error: {error}"),
        Ok(_) => panic!("answered"),
    }
    assert!(
        fake.seen().closes.is_empty(),
        "an errored conversation is over"
    );
}

#[tokio::test]
async fn resumes_past_the_burst_or_the_bound_in_flight_wait_their_turn_and_are_counted() {
    let metrics = Metrics::new();
    let started = Instant::now();
    let pacer = ResumePacer::with_limits(2, 20.0, 2.0, metrics.clone());
    let first = pacer.admit().await;
    let second = pacer.admit().await;
    assert_eq!(
        event_count(&metrics, "resume_paced"),
        0,
        "the burst goes at once"
    );
    drop(first);
    let _third = pacer.admit().await;
    // A lower bound only (a busy machine makes it longer): the token takes 1/rate = 50 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(45),
        "past the burst: one per 1/rate ({:?})",
        started.elapsed()
    );
    assert_eq!(event_count(&metrics, "resume_paced"), 1);
    // Two in flight: the next waits for one to finish.
    let waiting = pacer.admit();
    tokio::pin!(waiting);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut waiting)
            .await
            .is_err(),
        "no turn while two are in flight"
    );
    drop(second);
    let _fourth = waiting.await;
    assert_eq!(event_count(&metrics, "resume_paced"), 2);
}
