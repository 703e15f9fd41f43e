//! Admission benchmark: lease acquire + release through the gRPC API — one `Lease` stream per
//! lease, and many leases on a few lease channels (`LeaseChannel`, shared by the concurrent
//! clients as a relay shares them) — against the bare acquire and release scripts called
//! directly on the same Redis, in one run.
//!
//! ```text
//! cargo run --release -p poolgate-bench --bin admission-bench -- [--redis-url URL] \
//!     [--concurrency 32] [--seconds 5] [--rate 5000] [--channels 2] [--contended-seconds 10]
//! ```
//!
//! `--contended-seconds` adds a phase of waits on one busy account: one replica, two replicas
//! that wake each other's waiters, and two that only poll (how it was before the wake).
//!
//! Without `--redis-url` it starts a private `redis-server` on a free port. The admission server
//! runs in this process (same runtime, same two cores as the load), which is the honest setup on
//! a small machine: the figures include everything the server costs.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use admission_svc::server::{self, Config};
use clap::Parser;
use poolgate_bench::stats::{Sample, pace};
use poolgate_core::lease::{LeaseId, LeaseTerms};
use poolgate_lease::LeaseStore;
use poolgate_lease::backend::{AcquireLimits, LeaseBackend};
use poolgate_lease::metrics::Metrics;
use poolgate_lease::redis_backend::RedisBackend;
use poolgate_proto::admission::v1 as pb;
use poolgate_proto::admission::v1::admission_client::AdmissionClient;
use poolgate_rpc::service_auth::{CallerCheck, WithToken};
use poolgate_runtime::redis::{RedisHandle, RedisOptions, RedisTarget};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

#[path = "admission_bench/contended.rs"]
mod contended;

/// The service token the bench's admission server requires and its clients send.
const BENCH_TOKEN: &str = "bench-service-token";

#[derive(Debug, Parser)]
struct Args {
    /// Redis to use; absent: start a private redis-server.
    #[arg(long)]
    redis_url: Option<String>,
    /// Concurrent workers in the closed-loop phases.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds per phase.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Offered leases/s in the open-loop phase (0 skips it).
    #[arg(long, default_value_t = 5000)]
    rate: u32,
    /// Accounts the load spreads over (limits high enough that nothing is refused).
    #[arg(long, default_value_t = 100)]
    accounts: i64,
    /// Lease channels the gRPC clients share in the channel phases (0 skips them).
    #[arg(long, default_value_t = 2)]
    channels: usize,
    /// Seconds per run of the contended phase (0 skips it): `contended_workers` clients on one
    /// account of `contended_limit` slots, each holding a lease `hold_ms`, their acquires
    /// waiting; on one replica, on two replicas that wake each other's waiters, and on two
    /// that do not (waiters find a slot freed on the other replica only at their next poll).
    #[arg(long, default_value_t = 0.0)]
    contended_seconds: f64,
    #[arg(long, default_value_t = 16)]
    contended_workers: usize,
    #[arg(long, default_value_t = 4)]
    contended_limit: i32,
    #[arg(long, default_value_t = 5)]
    hold_ms: u64,
}

fn terms(account_id: i64) -> LeaseTerms {
    LeaseTerms {
        account_id,
        concurrency_limit: 1_000_000,
        rpm_limit: 0,
        user: None,
        session_hash: None,
        session_window_limit_micros: 0,
        session_bound: false,
        ignore_cooldown: false,
        key: None,
    }
}

/// The bare scripts: acquire + release straight on Redis, no gRPC, no engine.
async fn bare_scripts(backend: Arc<RedisBackend>, args: &Args) -> Sample {
    let limits = AcquireLimits {
        ttl_ms: 120_000,
        rpm_window_ms: 60_000,
        window_limit_micros: 0,
        session_window_ms: 5 * 3600 * 1000,
    };
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..args.concurrency {
        let backend = backend.clone();
        let accounts = args.accounts;
        workers.push(tokio::spawn(async move {
            let mut micros = Vec::new();
            let mut errors = 0;
            let mut sequence = 0u64;
            while Instant::now() < deadline {
                sequence += 1;
                let account = 1 + (sequence as i64 + worker as i64) % accounts;
                let lease = LeaseId::new(account, &format!("bench{worker}"), sequence);
                let start = Instant::now();
                let acquired = backend.acquire(&terms(account), &lease, limits).await;
                // The release fence lives a ttl plus the default orphan grace, as in the engine.
                let fence_ms = limits.ttl_ms + 5_000;
                let released = backend
                    .release(&lease, 0, limits.session_window_ms, fence_ms)
                    .await;
                match (acquired, released) {
                    (Ok(None), Ok(_)) => micros.push(start.elapsed().as_micros() as u64),
                    other => {
                        if errors == 0 {
                            eprintln!("bare script error: {other:?}");
                        }
                        errors += 1
                    }
                }
            }
            (micros, errors)
        }));
    }
    collect(workers, started).await
}

async fn collect(
    workers: Vec<tokio::task::JoinHandle<(Vec<u64>, u64)>>,
    started: Instant,
) -> Sample {
    let mut sample = Sample::default();
    for worker in workers {
        if let Ok((micros, errors)) = worker.await {
            sample.add(micros, errors);
        } else {
            sample.errors += 1;
        }
    }
    sample.elapsed = started.elapsed();
    sample
}

fn message(kind: pb::lease_request::Kind) -> pb::LeaseRequest {
    pb::LeaseRequest { kind: Some(kind) }
}

type Client = AdmissionClient<WithToken<Channel>>;

/// A `Lease` stream opened with `acquire`: where to send, and what admission answers.
struct LeaseCall {
    sender: mpsc::Sender<pb::LeaseRequest>,
    events: tonic::Streaming<pb::LeaseEvent>,
}

impl LeaseCall {
    async fn open(client: &mut Client, acquire: pb::Acquire) -> Option<Self> {
        let (sender, receiver) = mpsc::channel(2);
        sender
            .send(message(pb::lease_request::Kind::Acquire(acquire)))
            .await
            .ok()?;
        let events = client
            .lease(ReceiverStream::new(receiver))
            .await
            .ok()?
            .into_inner();
        Some(LeaseCall { sender, events })
    }

    /// Reads up to the grant (`Queued` events skipped); `None` for any other answer.
    async fn granted(&mut self) -> Option<()> {
        loop {
            match self.events.next().await {
                Some(Ok(pb::LeaseEvent {
                    kind: Some(pb::lease_event::Kind::Queued(_)),
                })) => continue,
                Some(Ok(pb::LeaseEvent {
                    kind: Some(pb::lease_event::Kind::Granted(_)),
                })) => return Some(()),
                _ => return None,
            }
        }
    }

    /// Release → Released.
    async fn release(&mut self) -> Option<()> {
        self.sender
            .send(message(pb::lease_request::Kind::Release(pb::Release {
                spend_usd: 0.0,
                tokens: 0,
            })))
            .await
            .ok()?;
        match self.events.next().await {
            Some(Ok(pb::LeaseEvent {
                kind: Some(pb::lease_event::Kind::Released(_)),
            })) => Some(()),
            _ => None,
        }
    }
}

/// One lease through the API: open the stream, Acquire → Granted, Release → Released.
/// Returns (acquire latency, whole cycle) in µs.
async fn one_lease(client: &mut Client, account_id: i64) -> Option<(u64, u64)> {
    let start = Instant::now();
    let acquire = pb::Acquire {
        account_id,
        concurrency_limit: 1_000_000,
        ..Default::default()
    };
    let mut call = LeaseCall::open(client, acquire).await?;
    call.granted().await?;
    let acquired = start.elapsed().as_micros() as u64;
    call.release().await?;
    Some((acquired, start.elapsed().as_micros() as u64))
}

/// One lease channel shared by several clients: their requests go out on one stream, and a
/// reader task hands each event to the lease waiting on its tag.
struct SharedChannel {
    sender: mpsc::Sender<pb::ChannelRequest>,
    waiting: Arc<Mutex<HashMap<u64, mpsc::Sender<pb::channel_event::Kind>>>>,
    next_tag: AtomicU64,
}

type Waiting = Mutex<HashMap<u64, mpsc::Sender<pb::channel_event::Kind>>>;

fn lock(
    waiting: &Waiting,
) -> std::sync::MutexGuard<'_, HashMap<u64, mpsc::Sender<pb::channel_event::Kind>>> {
    waiting
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SharedChannel {
    async fn open(client: &Client) -> Result<Arc<Self>, String> {
        let (sender, receiver) = mpsc::channel(1024);
        let mut events = client
            .clone()
            .lease_channel(ReceiverStream::new(receiver))
            .await
            .map_err(|e| format!("lease channel: {e}"))?
            .into_inner();
        let waiting: Arc<Waiting> = Arc::default();
        let reader = waiting.clone();
        tokio::spawn(async move {
            while let Some(Ok(event)) = events.next().await {
                if let Some(kind) = event.kind
                    && let Some(lease) = lock(&reader).get(&event.tag)
                {
                    // A lease reads each answer before the next can come: never full.
                    let _ = lease.try_send(kind);
                }
            }
            // The channel ended: every lease waiting on it sees its queue close.
            lock(&reader).clear();
        });
        Ok(Arc::new(SharedChannel {
            sender,
            waiting,
            next_tag: AtomicU64::new(1),
        }))
    }

    /// One lease on the channel: Acquire → Granted, Release → Released, then the tag's end.
    /// Returns (acquire latency, whole cycle) in µs.
    async fn one_lease(&self, account_id: i64) -> Option<(u64, u64)> {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let (events, mut answers) = mpsc::channel(4);
        lock(&self.waiting).insert(tag, events);
        let result = self.converse(tag, account_id, &mut answers).await;
        lock(&self.waiting).remove(&tag);
        result
    }

    async fn converse(
        &self,
        tag: u64,
        account_id: i64,
        answers: &mut mpsc::Receiver<pb::channel_event::Kind>,
    ) -> Option<(u64, u64)> {
        use pb::channel_event::Kind;
        let request = |kind| pb::ChannelRequest {
            tag,
            kind: Some(pb::channel_request::Kind::Request(message(kind))),
            ..Default::default()
        };
        let start = Instant::now();
        let acquire = pb::Acquire {
            account_id,
            concurrency_limit: 1_000_000,
            ..Default::default()
        };
        self.sender
            .send(request(pb::lease_request::Kind::Acquire(acquire)))
            .await
            .ok()?;
        match answers.recv().await? {
            Kind::Event(pb::LeaseEvent {
                kind: Some(pb::lease_event::Kind::Granted(_)),
            }) => {}
            _ => return None,
        }
        let acquired = start.elapsed().as_micros() as u64;
        self.sender
            .send(request(pb::lease_request::Kind::Release(pb::Release {
                spend_usd: 0.0,
                tokens: 0,
            })))
            .await
            .ok()?;
        match answers.recv().await? {
            Kind::Event(pb::LeaseEvent {
                kind: Some(pb::lease_event::Kind::Released(_)),
            }) => {}
            _ => return None,
        }
        let cycle = start.elapsed().as_micros() as u64;
        // The tag is free again only after its end.
        match answers.recv().await? {
            Kind::End(_) => Some((acquired, cycle)),
            _ => None,
        }
    }
}

/// The path a client's leases take.
#[derive(Clone)]
enum Lane {
    /// One `Lease` stream per lease, on this client's connection.
    Stream(Client),
    /// Tags on a lease channel shared with other clients.
    Channel(Arc<SharedChannel>),
}

impl Lane {
    async fn one_lease(&mut self, account_id: i64) -> Option<(u64, u64)> {
        match self {
            Lane::Stream(client) => one_lease(client, account_id).await,
            Lane::Channel(channel) => channel.one_lease(account_id).await,
        }
    }
}

/// Closed loop: `concurrency` workers each run leases back to back.
async fn grpc_closed_loop(lanes: &[Lane], args: &Args) -> (Sample, Sample) {
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..args.concurrency {
        let mut lane = lanes[worker % lanes.len()].clone();
        let accounts = args.accounts;
        workers.push(tokio::spawn(async move {
            let mut acquire = Vec::new();
            let mut cycle = Vec::new();
            let mut errors = 0;
            let mut n = 0i64;
            while Instant::now() < deadline {
                n += 1;
                match lane.one_lease(1 + (n + worker as i64) % accounts).await {
                    Some((a, c)) => {
                        acquire.push(a);
                        cycle.push(c);
                    }
                    None => errors += 1,
                }
            }
            (acquire, cycle, errors)
        }));
    }
    let mut acquire = Sample::default();
    let mut cycle = Sample::default();
    for worker in workers {
        if let Ok((a, c, errors)) = worker.await {
            acquire.add(a, 0);
            cycle.add(c, errors);
        }
    }
    acquire.elapsed = started.elapsed();
    cycle.elapsed = acquire.elapsed;
    (acquire, cycle)
}

/// Open loop: leases started at a fixed rate, whatever the latency.
async fn grpc_open_loop(lanes: &[Lane], args: &Args) -> (Sample, Sample) {
    let total = (args.rate as f64 * args.seconds) as u64;
    let interval = Duration::from_secs_f64(1.0 / args.rate.max(1) as f64);
    let started = Instant::now();
    let (results, mut receiver) = mpsc::unbounded_channel();
    for n in 0..total {
        pace(started, interval, n).await;
        let mut lane = lanes[n as usize % lanes.len()].clone();
        let results = results.clone();
        let account = 1 + n as i64 % args.accounts;
        tokio::spawn(async move {
            let _ = results.send(lane.one_lease(account).await);
        });
    }
    drop(results);
    let mut acquire = Vec::new();
    let mut cycle = Vec::new();
    let mut errors = 0;
    while let Some(result) = receiver.recv().await {
        match result {
            Some((a, c)) => {
                acquire.push(a);
                cycle.push(c);
            }
            None => errors += 1,
        }
    }
    let elapsed = started.elapsed();
    (
        Sample::new(acquire, 0, elapsed),
        Sample::new(cycle, errors, elapsed),
    )
}

/// Starts an admission server on `store` in this process and opens `connections` clients to it.
async fn replica(store: LeaseStore, connections: usize) -> Result<Vec<Client>, String> {
    let config = Config {
        backend: store,
        callers: CallerCheck::Token(BENCH_TOKEN.into()),
        ..Config::default()
    };
    let admission = server::build_engine(&config, Metrics::new())
        .await
        .map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = server::serve(admission, &config, listener, None, std::future::pending()).await;
    });
    let mut clients = Vec::new();
    for _ in 0..connections {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        clients.push(AdmissionClient::new(WithToken::new(
            channel,
            Some(BENCH_TOKEN),
        )));
    }
    Ok(clients)
}

async fn run(args: Args) -> Result<(), String> {
    let _private_redis;
    let redis_url = match &args.redis_url {
        Some(url) => url.clone(),
        None => {
            let server = poolgate_testkit::RedisServer::start().await?;
            let url = server.url();
            _private_redis = server;
            url
        }
    };
    let target = RedisTarget::parse(&redis_url)?;
    let options = RedisOptions::default();
    let round_trips = Metrics::new().redis_round_trips;
    let handle = RedisHandle::connect(&target, &options, round_trips)
        .await
        .map_err(|e| e.to_string())?;
    let bare = Arc::new(RedisBackend::new(handle));

    let store = LeaseStore::Redis {
        target: target.clone(),
        options: options.clone(),
        policy: Default::default(),
    };
    let clients = replica(store, 2).await?;

    let streams: Vec<Lane> = clients.iter().cloned().map(Lane::Stream).collect();
    let mut channels = Vec::new();
    for n in 0..args.channels {
        channels.push(Lane::Channel(
            SharedChannel::open(&clients[n % clients.len()]).await?,
        ));
    }

    println!(
        "admission bench: concurrency {}, {} s per phase, {} accounts, {} lease channels, redis {}",
        args.concurrency,
        args.seconds,
        args.accounts,
        args.channels,
        if args.redis_url.is_some() {
            "given"
        } else {
            "private"
        }
    );
    // Warm-up: load the scripts, fill the pools.
    let warm = Args {
        seconds: 0.3,
        ..Args::parse_from(["admission-bench"])
    };
    let _ = bare_scripts(bare.clone(), &warm).await;
    let _ = grpc_closed_loop(&streams, &warm).await;
    if !channels.is_empty() {
        let _ = grpc_closed_loop(&channels, &warm).await;
    }

    let mut scripts = bare_scripts(bare.clone(), &args).await;
    println!("{}", scripts.line("bare scripts (acquire + release)"));
    let mut paths = vec![("gRPC lease stream", &streams)];
    if !channels.is_empty() {
        paths.push(("gRPC lease channel", &channels));
    }
    for (name, lanes) in &paths {
        let (mut acquire, mut cycle) = grpc_closed_loop(lanes, &args).await;
        println!(
            "{}",
            cycle.line(&format!("{name} (acquire + release), closed loop"))
        );
        println!("{}", acquire.line("  of which acquire → granted"));
        println!(
            "ratio {name} / bare scripts: {:.1} % (goal >= 50 %)",
            100.0 * cycle.rate() / scripts.rate()
        );
    }
    if args.rate > 0 {
        for (name, lanes) in &paths {
            let (mut acquire, mut cycle) = grpc_open_loop(lanes, &args).await;
            println!(
                "{}",
                cycle.line(&format!("{name} at {} offered/s, open loop", args.rate))
            );
            println!("{}", acquire.line("  of which acquire → granted"));
            println!(
                "p99 acquire → granted at {} leases/s, {name}: {:.3} ms (goal < 1 ms)",
                args.rate,
                acquire.percentile(0.99)
            );
        }
    }
    if args.contended_seconds > 0.0 {
        contended::phase(&target, &options, &args).await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("admission-bench: {error}");
            ExitCode::FAILURE
        }
    }
}
