//! The lease channel, the relay's side: many leases' conversations multiplexed on a few
//! `LeaseChannel` streams instead of one HTTP/2 stream per lease (each stream costs h2, hyper and
//! tonic work on both sides). Each conversation is exactly a `Lease` stream's (the keeper and the
//! acquire task do not know which one they hold), and each channel is one writer (a queue feeding
//! the request stream) and one reader task dispatching events to the conversations by tag.
//!
//! - Channels are opened lazily, each on its own connection to one replica of the balanced
//!   channel's set (every replica gets its share, in turn), and opened again by the next user
//!   after one breaks; a replica not known yet (a name not resolved) leaves the conversation to a
//!   `Lease` stream on the balanced channel; a channel that breaks fails every
//!   conversation on it with `UNAVAILABLE`, as a broken `Lease` stream does (its keepers resume).
//! - A conversation dropped before its final answer sends `close` for its tag: a held lease is
//!   orphaned and a waiting acquire withdrawn, as closing a `Lease` stream does.
//! - An admission that answers `UNIMPLEMENTED` (older than the channel) sends the relay back to
//!   one stream per lease for [`FALLBACK_FOR`], logged once.
//! - [`ResumePacer`]: resumes after a channel (or a replica) breaks with many leases go out at a
//!   bounded rate, a bounded number at a time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use poolgate_proto::admission::v1 as apb;
use poolgate_proto::admission::v1::admission_client::AdmissionClient;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::transport::Endpoint;

use super::Traced;
use super::balancer::ReplicaSet;
use crate::metrics::Metrics;

/// Requests queued toward one channel before a sender waits for the stream to take them.
const WRITE_QUEUE: usize = 1024;
/// How long the relay keeps to one stream per lease after admission answered `UNIMPLEMENTED`
/// (then it tries the channel again: the replicas may have been upgraded meanwhile).
pub const FALLBACK_FOR: Duration = Duration::from_secs(60);
/// How long a channel that could not be opened fails its slot's users at once (each would
/// otherwise wait its turn for the same failure).
const FAILED_OPEN_KEPT: Duration = Duration::from_millis(200);

type Slot = tokio::sync::Mutex<SlotState>;

#[derive(Default)]
struct SlotState {
    conn: Option<Arc<Conn>>,
    failed: Option<(Instant, Status)>,
}

/// A client of one admission replica (its own connection), with the endpoint it is built from.
pub type Connect = Arc<dyn Fn(&Endpoint) -> AdmissionClient<Traced> + Send + Sync>;

/// The relay's lease channels toward admission: `count` channels spread over the replicas
/// (`count / replicas` rounded up each, at least one), conversations spread over them in turn.
pub struct Channels {
    replicas: ReplicaSet,
    connect: Connect,
    count: usize,
    /// The channels of each replica in the set, by its key.
    per_replica: Mutex<HashMap<String, Arc<Replica>>>,
    next: AtomicUsize,
    next_tag: AtomicU64,
    fallback_until: Mutex<Option<Instant>>,
    fallback_logged: AtomicBool,
    metrics: Metrics,
}

/// One replica's client and channel slots (as many as `count`; those used depend on how many
/// replicas share the count).
struct Replica {
    client: AdmissionClient<Traced>,
    slots: Vec<Slot>,
}

impl Channels {
    /// `None` for a count of 0: one stream per lease.
    pub fn new(
        replicas: ReplicaSet,
        connect: Connect,
        count: usize,
        metrics: Metrics,
    ) -> Option<Self> {
        (count > 0).then(|| Channels {
            replicas,
            connect,
            count,
            per_replica: Mutex::new(HashMap::new()),
            next: AtomicUsize::new(0),
            // Tags are > 0 and never reused on a channel.
            next_tag: AtomicU64::new(1),
            fallback_until: Mutex::new(None),
            fallback_logged: AtomicBool::new(false),
            metrics,
        })
    }

    /// Starts a conversation whose first message is `first`, or hands `first` back when
    /// admission does not serve the channel (the caller opens a `Lease` stream instead).
    pub async fn start(&self, first: apb::lease_request::Kind) -> Result<Started, Status> {
        if self.falling_back() {
            return Ok(Started::NotServed(first));
        }
        // No replica known yet (a name not resolved yet): the balanced channel's stream.
        let Some((replica, slot)) = self.pick() else {
            return Ok(Started::NotServed(first));
        };
        // A channel that broke between the pick and the registration is opened again, once.
        for _ in 0..2 {
            let conn = match self.conn(&replica, slot).await {
                Ok(conn) => conn,
                Err(status) if status.code() == tonic::Code::Unimplemented => {
                    self.fall_back(&status);
                    return Ok(Started::NotServed(first));
                }
                Err(status) => return Err(status),
            };
            let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
            let Some(receiver) = conn.register(tag) else {
                continue;
            };
            let requests = Requests {
                conn: conn.clone(),
                tag,
            };
            let events = Events {
                receiver,
                conn,
                tag,
                granted: false,
                over: false,
            };
            requests
                .send(super::leases::message(first))
                .await
                .map_err(|_| Status::unavailable("lease channel closed"))?;
            return Ok(Started::On(requests, events));
        }
        Err(Status::unavailable("lease channel broke while opening"))
    }

    /// The next replica in turn, and which of its channels: every replica gets at least one, so
    /// each one's share of the leases follows the relay's turn, not chance.
    fn pick(&self) -> Option<(Arc<Replica>, usize)> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let replicas = self.replicas.borrow();
        let (key, endpoint) = replicas.iter().nth(n % replicas.len().max(1))?;
        let per_replica = self.count.div_ceil(replicas.len()).max(1);
        let slot = (n / replicas.len()) % per_replica;
        let mut known = self.per_replica.lock().unwrap_or_else(|p| p.into_inner());
        // A replica that left the set: its channels break with it (or end when it shuts down).
        known.retain(|key, _| replicas.contains_key(key));
        if let Some(replica) = known.get(key) {
            return Some((replica.clone(), slot));
        }
        let replica = Arc::new(Replica {
            client: (self.connect)(endpoint),
            slots: (0..self.count).map(|_| Slot::default()).collect(),
        });
        known.insert(key.clone(), replica.clone());
        Some((replica, slot))
    }

    /// The channel in `slot` of `replica`, opened when it has none or its last one broke.
    async fn conn(&self, replica: &Replica, slot: usize) -> Result<Arc<Conn>, Status> {
        let Some(slot) = replica.slots.get(slot) else {
            return Err(Status::internal("no such lease channel slot"));
        };
        let mut state = slot.lock().await;
        if let Some(conn) = state.conn.as_ref().filter(|conn| !conn.is_broken()) {
            return Ok(conn.clone());
        }
        state.conn = None;
        if let Some((at, status)) = &state.failed
            && at.elapsed() < FAILED_OPEN_KEPT
        {
            return Err(status.clone());
        }
        match self.open(&replica.client).await {
            Ok(conn) => {
                state.failed = None;
                state.conn = Some(conn.clone());
                Ok(conn)
            }
            Err(status) => {
                state.failed = Some((Instant::now(), status.clone()));
                Err(status)
            }
        }
    }

    async fn open(&self, client: &AdmissionClient<Traced>) -> Result<Arc<Conn>, Status> {
        let (writer, receiver) = mpsc::channel(WRITE_QUEUE);
        // A trace of its own: the channel outlives the request whose acquire opened it, and
        // carries the leases of many.
        let span = tracing::info_span!(parent: None, "lease_channel");
        let response = tracing::Instrument::instrument(
            client.clone().lease_channel(ReceiverStream::new(receiver)),
            span,
        )
        .await?;
        let conn = Arc::new(Conn {
            writer,
            routes: Mutex::new(Routes::default()),
        });
        tokio::spawn(read(
            conn.clone(),
            response.into_inner(),
            self.metrics.clone(),
        ));
        self.metrics.lease_channel_event("opened");
        Ok(conn)
    }

    fn falling_back(&self) -> bool {
        let until = self
            .fallback_until
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        until.is_some_and(|until| Instant::now() < until)
    }

    fn fall_back(&self, status: &Status) {
        *self
            .fallback_until
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + FALLBACK_FOR);
        self.metrics.lease_channel_event("fallback");
        if !self.fallback_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                message = status.message(),
                "admission does not serve the lease channel (an older version?): one stream per lease instead"
            );
        }
    }
}

/// A conversation started on a channel, or its first message back when the channels are not
/// served.
pub enum Started {
    On(Requests, Events),
    NotServed(apb::lease_request::Kind),
}

/// One lease channel: its writer, and where its reader sends each conversation's events.
struct Conn {
    writer: mpsc::Sender<apb::ChannelRequest>,
    routes: Mutex<Routes>,
}

type EventSender = mpsc::UnboundedSender<Result<apb::LeaseEvent, Status>>;

#[derive(Default)]
struct Routes {
    /// Conversations admission has not ended. Unbounded per conversation: admission only sends
    /// what answers the holder's own messages, and a slow reader must not stall the channel.
    open: HashMap<u64, EventSender>,
    broken: bool,
}

impl Conn {
    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_broken(&self) -> bool {
        self.routes().broken
    }

    /// The events of a new conversation `tag`; `None` if the channel broke meanwhile (checked
    /// under the lock its reader fails every conversation under, so none is left unanswered).
    fn register(
        &self,
        tag: u64,
    ) -> Option<mpsc::UnboundedReceiver<Result<apb::LeaseEvent, Status>>> {
        let mut routes = self.routes();
        if routes.broken {
            return None;
        }
        let (sender, receiver) = mpsc::unbounded_channel();
        routes.open.insert(tag, sender);
        Some(receiver)
    }

    /// Whether admission had not ended conversation `tag` yet (it is forgotten either way).
    fn forget(&self, tag: u64) -> bool {
        let mut routes = self.routes();
        routes.open.remove(&tag).is_some() && !routes.broken
    }

    fn dispatch(&self, event: apb::ChannelEvent) {
        let mut routes = self.routes();
        match event.kind {
            Some(apb::channel_event::Kind::Event(lease_event)) => {
                if let Some(sender) = routes.open.get(&event.tag) {
                    let _ = sender.send(Ok(lease_event));
                }
            }
            Some(apb::channel_event::Kind::Error(error)) => {
                if let Some(sender) = routes.open.get(&event.tag) {
                    let _ = sender.send(Err(status_of(error)));
                }
            }
            Some(apb::channel_event::Kind::End(_)) => {
                routes.open.remove(&event.tag);
            }
            None => tracing::debug!(
                tag = event.tag,
                "lease channel event without a kind; ignored"
            ),
        }
    }

    /// Fails every open conversation as a broken `Lease` stream fails.
    fn break_all(&self) {
        let mut routes = self.routes();
        routes.broken = true;
        for (_, sender) in routes.open.drain() {
            let _ = sender.send(Err(Status::unavailable("lease channel broke")));
        }
    }

    fn close(&self, tag: u64) {
        let close = apb::ChannelRequest {
            tag,
            kind: Some(apb::channel_request::Kind::Close(apb::ChannelClose {})),
        };
        if let Err(mpsc::error::TrySendError::Full(close)) = self.writer.try_send(close)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let writer = self.writer.clone();
            runtime.spawn(async move {
                let _ = writer.send(close).await;
            });
        }
    }
}

/// A conversation's failure as the `Lease` stream would have failed: its gRPC code and message.
fn status_of(error: apb::ChannelError) -> Status {
    let code = match tonic::Code::from_i32(error.code) {
        // A failure that says "OK" is not one this relay can act on as such.
        tonic::Code::Ok => tonic::Code::Unknown,
        code => code,
    };
    Status::new(code, error.message)
}

/// The channel's reader: dispatches events until the channel ends or breaks, then fails every
/// conversation still open on it.
async fn read(conn: Arc<Conn>, mut events: tonic::Streaming<apb::ChannelEvent>, metrics: Metrics) {
    let error = loop {
        match events.message().await {
            Ok(Some(event)) => conn.dispatch(event),
            Ok(None) => break None,
            Err(status) => break Some(status),
        }
    };
    let open = conn.routes().open.len();
    match error {
        Some(status) => {
            tracing::warn!(code = ?status.code(), message = status.message(), open, "lease channel broke")
        }
        None => tracing::info!(open, "admission ended the lease channel"),
    }
    metrics.lease_channel_event("broken");
    conn.break_all();
}

/// The holder's messages of one conversation.
pub struct Requests {
    conn: Arc<Conn>,
    tag: u64,
}

impl Requests {
    pub async fn send(&self, request: apb::LeaseRequest) -> Result<(), Status> {
        if self.conn.is_broken() {
            return Err(Status::unavailable("lease channel broke"));
        }
        self.conn
            .writer
            .send(apb::ChannelRequest {
                tag: self.tag,
                kind: Some(apb::channel_request::Kind::Request(request)),
            })
            .await
            .map_err(|_| Status::unavailable("lease channel closed"))
    }
}

/// The events of one conversation, as a `Lease` stream's: `None` once admission ended it.
/// Dropped before its final answer, it closes the conversation (see the module docs).
pub struct Events {
    receiver: mpsc::UnboundedReceiver<Result<apb::LeaseEvent, Status>>,
    conn: Arc<Conn>,
    tag: u64,
    granted: bool,
    /// A final answer came (`Released`, `Lost`, a denial of the acquire, an error): admission
    /// ends the conversation by itself.
    over: bool,
}

impl Events {
    pub async fn next(&mut self) -> Option<Result<apb::LeaseEvent, Status>> {
        let item = self.receiver.recv().await;
        match &item {
            Some(Ok(apb::LeaseEvent { kind: Some(kind) })) => match kind {
                apb::lease_event::Kind::Granted(_) => self.granted = true,
                apb::lease_event::Kind::Released(_) | apb::lease_event::Kind::Lost(_) => {
                    self.over = true
                }
                // A denial of an `Attempt` (after the grant) leaves the lease held.
                apb::lease_event::Kind::Denied(_) => self.over |= !self.granted,
                _ => {}
            },
            Some(Ok(_)) => {}
            Some(Err(_)) | None => self.over = true,
        }
        item
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        if self.conn.forget(self.tag) && !self.over {
            self.conn.close(self.tag);
        }
    }
}

/// Most resumes in flight at once, over every channel and stream.
const RESUMES_IN_FLIGHT: usize = 64;
/// Resumes per second once the burst is spent: a channel that broke with a few thousand leases
/// resumes them within the orphan grace (5 s by default) without one burst of that size on the
/// replicas left.
const RESUMES_PER_SECOND: f64 = 1000.0;
const RESUME_BURST: f64 = 100.0;

/// Paces resumes: a bounded number in flight, and a token bucket. The keeper's own backoff
/// between its tries stays; this only spreads a storm.
pub struct ResumePacer {
    in_flight: Arc<Semaphore>,
    bucket: Mutex<Bucket>,
    rate: f64,
    burst: f64,
    metrics: Metrics,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl ResumePacer {
    pub fn new(metrics: Metrics) -> Self {
        Self::with_limits(RESUMES_IN_FLIGHT, RESUMES_PER_SECOND, RESUME_BURST, metrics)
    }

    fn with_limits(in_flight: usize, rate: f64, burst: f64, metrics: Metrics) -> Self {
        ResumePacer {
            in_flight: Arc::new(Semaphore::new(in_flight)),
            bucket: Mutex::new(Bucket {
                tokens: burst,
                at: Instant::now(),
            }),
            rate,
            burst,
            metrics,
        }
    }

    /// Waits for a resume's turn; the permit is held until its answer. A resume that had to
    /// wait is counted (`relay_lease_channel_events_total{event="resume_paced"}`).
    pub async fn admit(&self) -> Option<OwnedSemaphorePermit> {
        let mut paced = false;
        let permit = match self.in_flight.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                paced = true;
                self.in_flight.clone().acquire_owned().await.ok()
            }
        };
        while let Some(wait) = self.take_token() {
            paced = true;
            tokio::time::sleep(wait).await;
        }
        if paced {
            self.metrics.lease_channel_event("resume_paced");
        }
        permit
    }

    /// Takes a token, or says how long until one is there.
    fn take_token(&self) -> Option<Duration> {
        let mut bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let earned = now.duration_since(bucket.at).as_secs_f64() * self.rate;
        bucket.tokens = (bucket.tokens + earned).min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return None;
        }
        Some(Duration::from_secs_f64((1.0 - bucket.tokens) / self.rate))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::pin::Pin;

    use futures_util::Stream;
    use poolgate_core::lease::LeaseTerms;
    use poolgate_proto::admission::v1::admission_server::{Admission, AdmissionServer};
    use poolgate_testkit::eventually;
    use tonic::{Request, Response, Streaming};

    use super::*;
    use crate::ports::{Acquired, BackendError, Lease, Leases};
    use crate::remote::{GrpcClient, RemoteLeases, balanced_channel_with_replicas};

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
        fn answer(
            &self,
            tag: u64,
            kind: apb::lease_request::Kind,
        ) -> Vec<apb::channel_event::Kind> {
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
                while let Ok(Some(apb::LeaseRequest { kind: Some(kind) })) = inbound.message().await
                {
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
        tokio::time::sleep(super::super::leases::ACQUIRE_RETRY_FOR + Duration::from_millis(500))
            .await;
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
        let Ok(Started::On(requests, mut events)) = channels.start(first).await else {
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
            .send(super::super::leases::message(release))
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
            Err(BackendError::Status { code, message }) => {
                assert_eq!(code, tonic::Code::InvalidArgument);
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
}
