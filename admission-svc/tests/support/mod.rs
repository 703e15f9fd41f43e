//! Shared helpers for admission integration tests: an in-process server on port 0 over a chosen
//! backend, and a small lease-stream client.

#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use admission_svc::server::{self, Config};
use poolgate_core::lease::Settings;
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
    Redis(RedisServer),
}

impl Store {
    pub async fn memory() -> Self {
        Store::Memory
    }

    pub async fn redis() -> Self {
        Store::Redis(RedisServer::start().await.expect("redis starts"))
    }

    pub fn backend_config(&self) -> LeaseStore {
        match self {
            Store::Memory => LeaseStore::Memory,
            Store::Redis(server) => LeaseStore::Redis {
                target: RedisTarget::Single(server.url()),
                options: RedisOptions::default(),
                policy: Default::default(),
            },
        }
    }

    pub fn redis_server(&self) -> Option<&RedisServer> {
        match self {
            Store::Memory => None,
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
        let config = Config {
            settings,
            backend,
            callers: CallerCheck::Token(SERVICE_TOKEN.into()),
            ..Config::default()
        };
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

    pub async fn on(store: &Store) -> Self {
        Self::start(store.backend_config(), test_settings()).await
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
        let mut stream = LeaseStream {
            sender: Some(sender),
            events,
            lease_id: None,
            queued: Vec::new(),
        };
        let answer = stream.answer().await;
        if let Answer::Granted(id) = &answer {
            stream.lease_id = Some(id.clone());
        }
        Ok((stream, answer))
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

    async fn answer(&mut self) -> Answer {
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
