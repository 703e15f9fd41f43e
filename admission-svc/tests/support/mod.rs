//! Shared helpers for admission integration tests: an in-process server on port 0 over a chosen
//! backend, and a small lease-stream client.

#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use admission_svc::server::{self, Config};
use poolgate_core::lease::Settings;
use poolgate_core::{Clock, ManualClock};
use poolgate_lease::LeaseEngine;
use poolgate_lease::LeaseStore;
use poolgate_lease::metrics::Metrics;
use poolgate_proto::admission::v1 as pb;
use poolgate_proto::admission::v1::admission_client::AdmissionClient;
use poolgate_rpc::service_auth::{CallerCheck, WithToken};
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_testkit::{RedisServer, free_port};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

pub type Client = AdmissionClient<WithToken<Channel>>;

/// The service token every test server requires; test clients send it.
pub const SERVICE_TOKEN: &str = "test-service-token";

/// Settings short enough for tests: ttl 3 s, orphan grace 300 ms, fast polls.
pub fn test_settings() -> Settings {
    Settings {
        lease_ttl: Duration::from_secs(3),
        orphan_grace: Duration::from_millis(300),
        wait_poll_initial: Duration::from_millis(20),
        wait_poll_max: Duration::from_millis(200),
        ..Settings::default()
    }
}

/// Which backend a suite run uses.
pub enum Store {
    Memory,
    /// The memory backend on a manual clock, which `pass` advances.
    MemoryOnAManualClock(ManualClock),
    Redis(RedisServer),
}

impl Store {
    pub async fn memory() -> Self {
        Store::Memory
    }

    pub async fn memory_on_a_manual_clock() -> Self {
        Store::MemoryOnAManualClock(ManualClock::starting_now())
    }

    /// The clock a server on this store runs on.
    pub fn clock(&self) -> Clock {
        match self {
            Store::MemoryOnAManualClock(manual) => manual.clock(),
            Store::Memory | Store::Redis(_) => Clock::system(),
        }
    }

    /// Lets `time` pass: a manual clock is advanced, otherwise the test sleeps.
    pub async fn pass(&self, time: Duration) {
        match self {
            Store::MemoryOnAManualClock(manual) => manual.advance(time),
            Store::Memory | Store::Redis(_) => tokio::time::sleep(time).await,
        }
    }

    pub async fn redis() -> Self {
        Store::Redis(RedisServer::start().await.expect("redis starts"))
    }

    pub fn backend_config(&self) -> LeaseStore {
        match self {
            Store::Memory | Store::MemoryOnAManualClock(_) => LeaseStore::Memory,
            Store::Redis(server) => LeaseStore::Redis {
                target: RedisTarget::Single(server.url()),
                options: RedisOptions::default(),
                policy: Default::default(),
            },
        }
    }

    pub fn redis_server(&self) -> Option<&RedisServer> {
        match self {
            Store::Memory | Store::MemoryOnAManualClock(_) => None,
            Store::Redis(server) => Some(server),
        }
    }
}

/// An admission server running in this process.
pub struct TestServer {
    pub admission: Arc<LeaseEngine>,
    pub client: Client,
    pub addr: std::net::SocketAddr,
    pub metrics_addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl TestServer {
    pub async fn start(backend: LeaseStore, settings: Settings) -> Self {
        Self::start_with(Config {
            settings,
            backend,
            callers: CallerCheck::Token(SERVICE_TOKEN.into()),
            ..Config::default()
        })
        .await
    }

    /// A server with this config (its callers must accept `SERVICE_TOKEN`).
    pub async fn start_with(config: Config) -> Self {
        let admission = server::build_engine(&config, Metrics::new())
            .await
            .expect("admission builds");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let metrics_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let metrics_addr = metrics_listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = admission.clone();
        tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(error) =
                server::serve(serving, &config, listener, Some(metrics_listener), shutdown).await
            {
                eprintln!("test server failed: {error}");
            }
        });
        let client = connect(addr).await;
        TestServer {
            admission,
            client,
            addr,
            metrics_addr,
            stop: Some(stop),
        }
    }

    /// A server on `store` (on its clock) with the test settings.
    pub async fn on(store: &Store) -> Self {
        Self::on_with(store, test_settings()).await
    }

    /// A server on `store` (on its clock) with `settings`.
    pub async fn on_with(store: &Store, settings: Settings) -> Self {
        Self::start_with(Config {
            settings,
            backend: store.backend_config(),
            callers: CallerCheck::Token(SERVICE_TOKEN.into()),
            clock: store.clock(),
            ..Config::default()
        })
        .await
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub async fn connect(addr: std::net::SocketAddr) -> Client {
    let endpoint = format!("http://{addr}");
    for _ in 0..100 {
        if let Ok(endpoint) = tonic::transport::Endpoint::from_shared(endpoint.clone())
            && let Ok(channel) = endpoint.connect().await
        {
            return AdmissionClient::new(WithToken::new(channel, Some(SERVICE_TOKEN)));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("admission at {addr} never accepted a connection");
}

/// An `Acquire` for `account` with a concurrency limit and nothing else.
pub fn acquire(account: i64, concurrency: i32) -> pb::Acquire {
    pb::Acquire {
        account_id: account,
        concurrency_limit: concurrency,
        ..Default::default()
    }
}

fn request(kind: pb::lease_request::Kind) -> pb::LeaseRequest {
    pb::LeaseRequest { kind: Some(kind) }
}

/// One open lease stream.
pub struct LeaseStream {
    sender: Option<mpsc::Sender<pb::LeaseRequest>>,
    events: Streaming<pb::LeaseEvent>,
    pub lease_id: Option<String>,
    pub queued: Vec<u32>,
}

/// The answer to an acquire, after any `Queued` events.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Granted(String),
    Denied(pb::DenyReason, u64),
    /// A `Resume` of a released lease.
    Lost(pb::LostReason),
    Error(tonic::Code, String),
}

impl Answer {
    pub fn is_granted(&self) -> bool {
        matches!(self, Answer::Granted(_))
    }

    pub fn denied_reason(&self) -> Option<pb::DenyReason> {
        match self {
            Answer::Denied(reason, _) => Some(*reason),
            _ => None,
        }
    }
}

impl LeaseStream {
    /// Opens a stream whose first message is `first`, and reads the answer.
    pub async fn open(client: &Client, first: pb::lease_request::Kind) -> (LeaseStream, Answer) {
        match Self::try_open(client, first).await {
            Ok(opened) => opened,
            Err(status) => panic!("lease call failed: {status}"),
        }
    }

    /// Like `open`, but a failed call (replica gone) is an error instead of a panic.
    pub async fn try_open(
        client: &Client,
        first: pb::lease_request::Kind,
    ) -> Result<(LeaseStream, Answer), tonic::Status> {
        let mut stream = Self::start(client, first).await?;
        let answer = stream.answer().await;
        Ok((stream, answer))
    }

    /// Opens a stream whose first message is `first`, reading nothing yet.
    async fn start(
        client: &Client,
        first: pb::lease_request::Kind,
    ) -> Result<LeaseStream, tonic::Status> {
        let (sender, receiver) = mpsc::channel(8);
        sender
            .send(request(first))
            .await
            .expect("queue first message");
        let mut client = client.clone();
        let events = client
            .lease(ReceiverStream::new(receiver))
            .await?
            .into_inner();
        Ok(LeaseStream {
            sender: Some(sender),
            events,
            lease_id: None,
            queued: Vec::new(),
        })
    }

    /// Sends `acquire` for an account with no room and returns once admission says it queued
    /// (its position): the test acts knowing the waiter waits, and reads the answer with
    /// `answer` later.
    pub async fn queued(client: &Client, acquire: pb::Acquire) -> (LeaseStream, u32) {
        let mut waiter = match Self::start(client, pb::lease_request::Kind::Acquire(acquire)).await
        {
            Ok(stream) => stream,
            Err(status) => panic!("lease call failed: {status}"),
        };
        match waiter.next_event().await {
            Ok(Some(pb::lease_event::Kind::Queued(queued))) => (waiter, queued.position),
            other => panic!("the waiter should be told it queued first: {other:?}"),
        }
    }

    pub async fn acquire(client: &Client, acquire: pb::Acquire) -> (LeaseStream, Answer) {
        Self::open(client, pb::lease_request::Kind::Acquire(acquire)).await
    }

    pub async fn resume(
        client: &Client,
        lease_id: &str,
        terms: pb::Acquire,
    ) -> (LeaseStream, Answer) {
        Self::open(
            client,
            pb::lease_request::Kind::Resume(pb::Resume {
                lease_id: lease_id.to_owned(),
                terms: Some(terms),
            }),
        )
        .await
    }

    /// Reads events up to the answer to an acquire or resume (`Queued` events are kept in
    /// `queued`; a grant's lease id in `lease_id`).
    pub async fn answer(&mut self) -> Answer {
        let answer = self.read_answer().await;
        if let Answer::Granted(id) = &answer {
            self.lease_id = Some(id.clone());
        }
        answer
    }

    async fn read_answer(&mut self) -> Answer {
        loop {
            match self.next_event().await {
                Ok(Some(pb::lease_event::Kind::Queued(queued))) => {
                    self.queued.push(queued.position)
                }
                Ok(Some(pb::lease_event::Kind::Granted(granted))) => {
                    return Answer::Granted(granted.lease_id);
                }
                Ok(Some(pb::lease_event::Kind::Denied(denied))) => {
                    return Answer::Denied(denied.reason(), denied.retry_after_ms);
                }
                Ok(Some(pb::lease_event::Kind::Lost(lost))) => {
                    return Answer::Lost(lost.lost_reason());
                }
                Ok(other) => panic!("unexpected answer to acquire: {other:?}"),
                Err(status) => return Answer::Error(status.code(), status.message().to_owned()),
            }
        }
    }

    pub async fn next_event(&mut self) -> Result<Option<pb::lease_event::Kind>, tonic::Status> {
        match tokio::time::timeout(Duration::from_secs(20), self.events.next()).await {
            Ok(Some(Ok(event))) => Ok(event.kind),
            Ok(Some(Err(status))) => Err(status),
            Ok(None) => Ok(None),
            Err(_) => panic!("no lease event within 20 s"),
        }
    }

    pub async fn send(&mut self, kind: pb::lease_request::Kind) {
        if let Some(sender) = &self.sender {
            let _ = sender.send(request(kind)).await;
        }
    }

    pub async fn heartbeat(&mut self) -> Result<Option<pb::lease_event::Kind>, tonic::Status> {
        self.send(pb::lease_request::Kind::Heartbeat(pb::Heartbeat {}))
            .await;
        self.next_event().await
    }

    pub async fn attempt(&mut self) -> Result<Option<pb::lease_event::Kind>, tonic::Status> {
        self.send(pb::lease_request::Kind::Attempt(pb::Attempt {}))
            .await;
        self.next_event().await
    }

    /// Releases and waits for `Released`.
    pub async fn release(mut self, spend_usd: f64) {
        self.send(pb::lease_request::Kind::Release(pb::Release {
            spend_usd,
            tokens: 0,
        }))
        .await;
        match self.next_event().await {
            Ok(Some(pb::lease_event::Kind::Released(_))) => {}
            other => panic!("expected Released, got {other:?}"),
        }
    }

    /// Releases; `false` when the stream broke instead of answering `Released`.
    pub async fn try_release(mut self) -> bool {
        self.send(pb::lease_request::Kind::Release(pb::Release {
            spend_usd: 0.0,
            tokens: 0,
        }))
        .await;
        matches!(
            self.next_event().await,
            Ok(Some(pb::lease_event::Kind::Released(_)))
        )
    }

    /// Ends the stream without `Release` (the holder went away).
    pub fn abandon(mut self) {
        self.sender.take();
    }
}

/// Opens a lease stream with `Acquire` and sends `Release` after `delay` without waiting for the
/// answer (a holder that no longer needs the lease); returns every event until the stream ends.
pub async fn acquire_then_withdraw(
    client: &Client,
    acquire: pb::Acquire,
    delay: Duration,
) -> Vec<pb::lease_event::Kind> {
    let (sender, receiver) = mpsc::channel(8);
    sender
        .send(request(pb::lease_request::Kind::Acquire(acquire)))
        .await
        .expect("queue acquire");
    let mut events = client
        .clone()
        .lease(ReceiverStream::new(receiver))
        .await
        .expect("lease call")
        .into_inner();
    tokio::time::sleep(delay).await;
    sender
        .send(request(pb::lease_request::Kind::Release(pb::Release {
            spend_usd: 0.0,
            tokens: 0,
        })))
        .await
        .expect("queue release");
    let mut seen = Vec::new();
    while let Ok(Some(Ok(event))) =
        tokio::time::timeout(Duration::from_secs(10), events.next()).await
    {
        seen.extend(event.kind);
    }
    seen
}

pub async fn inflight(client: &Client, accounts: &[i64]) -> Vec<u32> {
    let mut client = client.clone();
    client
        .inflight(pb::InflightRequest {
            account_ids: accounts.to_vec(),
        })
        .await
        .expect("inflight answers")
        .into_inner()
        .accounts
        .into_iter()
        .map(|a| a.inflight)
        .collect()
}

pub async fn inflight_one(client: &Client, account: i64) -> u32 {
    inflight(client, &[account]).await[0]
}

pub async fn record_spend(client: &Client, account: i64, usd: f64) -> f64 {
    let mut client = client.clone();
    client
        .record_spend(pb::RecordSpendRequest {
            account_id: account,
            usd,
        })
        .await
        .expect("record spend answers")
        .into_inner()
        .window_spend_usd
}

/// An admission-svc process (spawned from the test's binary path), killed on drop.
pub struct AdmissionProcess {
    pub child: Child,
    pub addr: std::net::SocketAddr,
}

impl AdmissionProcess {
    pub fn spawn(binary: &str, redis_url: &str, extra_args: &[&str]) -> Self {
        let port = free_port().expect("port");
        let metrics_port = free_port().expect("port");
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let child = Command::new(binary)
            .args(["--listen", &addr.to_string()])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
            .args(["--redis-url", redis_url])
            .args(extra_args)
            .env("POOLGATE_SERVICE_TOKEN", SERVICE_TOKEN)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("admission-svc starts");
        AdmissionProcess { child, addr }
    }
}

impl Drop for AdmissionProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a lease channel said about one conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Said {
    Event(pb::lease_event::Kind),
    /// The conversation failed (the code a lease stream would have ended with); `End` follows.
    Error(tonic::Code, String),
    End,
}

/// One open lease channel: many conversations by tag. Reading for one tag keeps what arrives
/// for the others until asked.
pub struct LeaseChannel {
    sender: Option<mpsc::Sender<pb::ChannelRequest>>,
    events: Option<Streaming<pb::ChannelEvent>>,
    pending: std::collections::HashMap<u64, std::collections::VecDeque<Said>>,
    /// How the channel itself ended, once it has: `None` cleanly, else its status.
    pub ended: Option<Option<tonic::Status>>,
}

impl LeaseChannel {
    pub async fn open(client: &Client) -> LeaseChannel {
        match Self::try_open(client).await {
            Ok(channel) => channel,
            Err(status) => panic!("lease channel call failed: {status}"),
        }
    }

    /// Like `open`, but a failed call (replica gone) is an error instead of a panic.
    pub async fn try_open(client: &Client) -> Result<LeaseChannel, tonic::Status> {
        let (sender, receiver) = mpsc::channel(64);
        let events = client
            .clone()
            .lease_channel(ReceiverStream::new(receiver))
            .await?
            .into_inner();
        Ok(LeaseChannel {
            sender: Some(sender),
            events: Some(events),
            pending: Default::default(),
            ended: None,
        })
    }

    /// Sends a raw channel message; `false` when the channel is gone.
    pub async fn send_raw(&mut self, request: pb::ChannelRequest) -> bool {
        match &self.sender {
            Some(sender) => sender.send(request).await.is_ok(),
            None => false,
        }
    }

    pub async fn send(&mut self, tag: u64, kind: pb::lease_request::Kind) -> bool {
        self.send_raw(pb::ChannelRequest {
            tag,
            kind: Some(pb::channel_request::Kind::Request(request(kind))),
            ..Default::default()
        })
        .await
    }

    /// Ends the holder's side of one conversation.
    pub async fn close(&mut self, tag: u64) -> bool {
        self.send_raw(pb::ChannelRequest {
            tag,
            kind: Some(pb::channel_request::Kind::Close(pb::ChannelClose {})),
            ..Default::default()
        })
        .await
    }

    pub async fn send_acquire(&mut self, tag: u64, acquire: pb::Acquire) -> bool {
        self.send(tag, pb::lease_request::Kind::Acquire(acquire))
            .await
    }

    /// The next thing said on `tag`; `None` once the channel has ended (see `ended`).
    pub async fn next(&mut self, tag: u64) -> Option<Said> {
        if let Some(said) = self
            .pending
            .get_mut(&tag)
            .and_then(|queue| queue.pop_front())
        {
            return Some(said);
        }
        loop {
            let (event_tag, said) = self.next_any().await?;
            if event_tag == tag {
                return Some(said);
            }
            self.pending.entry(event_tag).or_default().push_back(said);
        }
    }

    /// The next message of the channel, whatever its tag; `None` once the channel has ended.
    pub async fn next_any(&mut self) -> Option<(u64, Said)> {
        let events = self.events.as_mut()?;
        match tokio::time::timeout(Duration::from_secs(20), events.next()).await {
            Ok(Some(Ok(event))) => {
                let said = match event.kind {
                    Some(pb::channel_event::Kind::Event(event)) => match event.kind {
                        Some(kind) => Said::Event(kind),
                        None => panic!("a channel event without a lease event"),
                    },
                    Some(pb::channel_event::Kind::Error(error)) => {
                        Said::Error(tonic::Code::from_i32(error.code), error.message)
                    }
                    Some(pb::channel_event::Kind::End(_)) => Said::End,
                    None => panic!("a channel event without a kind"),
                };
                Some((event.tag, said))
            }
            Ok(Some(Err(status))) => {
                self.ended = Some(Some(status));
                self.events = None;
                None
            }
            Ok(None) => {
                self.ended = Some(None);
                self.events = None;
                None
            }
            Err(_) => panic!("nothing on the lease channel within 20 s"),
        }
    }

    /// The next lease event on `tag`, as a lease stream reads it: an error as its status, the
    /// conversation's end (or the channel's) as `Ok(None)`. The `End` after an error or a final
    /// event is left for `finish`.
    pub async fn next_event(
        &mut self,
        tag: u64,
    ) -> Result<Option<pb::lease_event::Kind>, tonic::Status> {
        match self.next(tag).await {
            Some(Said::Event(kind)) => Ok(Some(kind)),
            Some(Said::Error(code, message)) => Err(tonic::Status::new(code, message)),
            Some(Said::End) => Ok(None),
            None => match &self.ended {
                Some(Some(status)) => Err(status.clone()),
                _ => Ok(None),
            },
        }
    }

    /// Reads `tag` up to its `End`; what was said before it.
    pub async fn finish(&mut self, tag: u64) -> Vec<Said> {
        let mut seen = Vec::new();
        while let Some(said) = self.next(tag).await {
            if said == Said::End {
                return seen;
            }
            seen.push(said);
        }
        seen
    }

    /// The answer to an acquire or resume on `tag`, after any `Queued` events (kept in
    /// `queued`).
    pub async fn answer(&mut self, tag: u64, queued: &mut Vec<u32>) -> Answer {
        loop {
            match self.next_event(tag).await {
                Ok(Some(pb::lease_event::Kind::Queued(position))) => queued.push(position.position),
                Ok(Some(pb::lease_event::Kind::Granted(granted))) => {
                    return Answer::Granted(granted.lease_id);
                }
                Ok(Some(pb::lease_event::Kind::Denied(denied))) => {
                    return Answer::Denied(denied.reason(), denied.retry_after_ms);
                }
                Ok(Some(pb::lease_event::Kind::Lost(lost))) => {
                    return Answer::Lost(lost.lost_reason());
                }
                // The conversation (or the whole channel) ended without an answer.
                Ok(None) => {
                    return Answer::Error(tonic::Code::Unavailable, "ended unanswered".into());
                }
                Ok(other) => panic!("unexpected answer on tag {tag}: {other:?}"),
                Err(status) => return Answer::Error(status.code(), status.message().to_owned()),
            }
        }
    }

    /// Acquires on `tag` and reads the answer.
    pub async fn acquire(&mut self, tag: u64, acquire: pb::Acquire) -> Answer {
        self.send_acquire(tag, acquire).await;
        self.answer(tag, &mut Vec::new()).await
    }

    /// Resumes `lease_id` on `tag` and reads the answer.
    pub async fn resume(&mut self, tag: u64, lease_id: &str, terms: pb::Acquire) -> Answer {
        self.send(
            tag,
            pb::lease_request::Kind::Resume(pb::Resume {
                lease_id: lease_id.to_owned(),
                terms: Some(terms),
            }),
        )
        .await;
        self.answer(tag, &mut Vec::new()).await
    }

    pub async fn heartbeat(
        &mut self,
        tag: u64,
    ) -> Result<Option<pb::lease_event::Kind>, tonic::Status> {
        self.send(tag, pb::lease_request::Kind::Heartbeat(pb::Heartbeat {}))
            .await;
        self.next_event(tag).await
    }

    pub async fn attempt(
        &mut self,
        tag: u64,
    ) -> Result<Option<pb::lease_event::Kind>, tonic::Status> {
        self.send(tag, pb::lease_request::Kind::Attempt(pb::Attempt {}))
            .await;
        self.next_event(tag).await
    }

    /// Releases on `tag`; the answer (`Released` expected), its `End` read.
    pub async fn release(
        &mut self,
        tag: u64,
    ) -> Result<Option<pb::lease_event::Kind>, tonic::Status> {
        self.send(
            tag,
            pb::lease_request::Kind::Release(pb::Release {
                spend_usd: 0.0,
                tokens: 0,
            }),
        )
        .await;
        let answer = self.next_event(tag).await;
        if matches!(answer, Ok(Some(_)) | Err(_)) {
            self.finish(tag).await;
        }
        answer
    }

    /// The holder goes away: both directions of the channel dropped at once.
    pub fn drop_channel(&mut self) {
        self.sender.take();
        self.events.take();
    }

    /// Ends the holder's side of the whole channel (half close), still reading.
    pub fn half_close(&mut self) {
        self.sender.take();
    }
}
