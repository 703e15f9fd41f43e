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

use crate::Traced;
use crate::balancer::ReplicaSet;
use crate::leases::TraceContext;
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

    /// Starts a conversation whose first message is `first`, carrying `trace` (the request's
    /// trace context), or hands `first` back when admission does not serve the channel (the
    /// caller opens a `Lease` stream instead).
    pub async fn start(
        &self,
        first: apb::lease_request::Kind,
        trace: &TraceContext,
    ) -> Result<Started, Status> {
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
                .send(super::leases::message(first), trace.clone())
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
            trace_context: Default::default(),
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
    /// Sends `request` with `trace`, the trace context of the request the lease serves (given
    /// with an acquire, a resume, a release; empty otherwise): the channel's own gRPC metadata is
    /// the channel's, not the request's.
    pub async fn send(
        &self,
        request: apb::LeaseRequest,
        trace: TraceContext,
    ) -> Result<(), Status> {
        if self.conn.is_broken() {
            return Err(Status::unavailable("lease channel broke"));
        }
        self.conn
            .writer
            .send(apb::ChannelRequest {
                tag: self.tag,
                kind: Some(apb::channel_request::Kind::Request(request)),
                trace_context: trace,
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
mod tests;
