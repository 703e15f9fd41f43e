//! The randomized model test of the lease invariants (ARCHITECTURE "Invariants").
//!
//! Three admission replicas over one shared store (the memory backend, one real Redis, a
//! 3-master Redis Cluster) are driven through their gRPC API by a random sequence of holder
//! operations: acquires (at once and waiting), heartbeats, stream and unary releases, dropped
//! streams, resumes on another replica, attempts, time passing beyond the orphan grace and the
//! ttl, Redis flushes, and replicas killed. After every step the store is checked against a
//! small reference model:
//!
//! - live leases ≤ the concurrency limit on every account (no grant at or over the limit);
//! - a lease released while the store kept its data is never renewed or resumed again;
//! - nothing phantom: the store never counts more live leases than the model allows (granted,
//!   not released, renewed less than a ttl ago, not orphaned longer than the grace ago), and
//!   never resumes a lease that surely expired.
//!
//! Some acquires carry a client key with a concurrency limit (docs/DESIGN.md §4; a few keys
//! shared across the accounts), and the same holds for every key's slot: its live leases never
//! exceed the key's limit, never exceed what the model allows (a released lease gave its key
//! slot back at once, an orphaned one after the grace, a fenced one is not restored), and a
//! `KEY_CONCURRENCY` refusal is only answered when the key's limit may really be taken.
//!
//! The memory store runs on a manual clock: `Op::Sleep` advances it instead of sleeping, and the
//! model reads its time from the same clock. The Redis stores keep real time. Each run prints
//! its steps per second.
//!
//! Every run prints its seed; a failure prints the seed and the operation sequence. Replay with
//! `POOLGATE_MODEL_SEED=<seed>`; bound the wall time per backend with `POOLGATE_MODEL_SECS`
//! (default 40). A failing sequence worth keeping becomes a plain test calling [`replay`].
//!
//! The driver reaches the replicas only through their published API: `Holder` holds one lease
//! on a `Transport` — its own lease stream, or one tag of a lease channel (`LeaseChannel`, a
//! few per replica, shared by the holders on them) — and `Op::Acquire`/`Op::Resume` pick the
//! transport from the seed (`Via`), so both kinds of holders mix over the same replicas in one
//! run. A channel's holder drops its lease with `close` on its tag; `Op::DropChannel` drops a
//! whole channel, orphaning every lease on it at once. The model and the checks are the same
//! for both transports.

use crate::support;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission_svc::server::{self, Config};
use poolgate_core::lease::Settings;
use poolgate_core::{Clock, ManualClock, millis};
use poolgate_lease::LeaseEngine;
use poolgate_lease::LeaseStore;
use poolgate_lease::backend::LeaseBackend;
use poolgate_lease::memory::MemoryBackend;
use poolgate_lease::metrics::Metrics;
use poolgate_proto::admission::v1 as pb;
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_testkit::{RedisCluster, RedisServer};
use support::{Answer, Client, LeaseChannel, LeaseStream, connect};
use tokio::sync::{Mutex, oneshot};

const REPLICAS: usize = 3;
/// Concurrency limit of each account of a run.
const LIMITS: [i32; 2] = [1, 2];
/// Concurrency limit of each client key of a run (each key used on every account).
const KEY_LIMITS: [i32; 2] = [1, 2];
const OPS_PER_RUN: usize = 40;
/// Lease channels each replica may have open (opened on first use).
const CHANNELS: usize = 2;
/// Clock granularity between the model's `Instant` and the store's millisecond clock.
const SLACK: Duration = Duration::from_millis(25);
/// Bound on how long a replica takes to notice a dropped stream and cut its lease.
const ORPHAN_SLACK: Duration = Duration::from_millis(300);

fn model_settings() -> Settings {
    Settings {
        lease_ttl: Duration::from_millis(900),
        orphan_grace: Duration::from_millis(150),
        wait_poll_initial: Duration::from_millis(20),
        wait_poll_max: Duration::from_millis(100),
        ..Settings::default()
    }
}

/// The shared store under the replicas.
pub enum Store {
    /// The memory backend on a manual clock (`Op::Sleep` advances it).
    Memory(Arc<MemoryBackend>, ManualClock),
    Redis(RedisServer),
    Cluster(RedisCluster),
}

impl Store {
    pub async fn memory() -> Self {
        let clock = ManualClock::starting_now();
        Store::Memory(Arc::new(MemoryBackend::new(clock.clock())), clock)
    }

    pub async fn redis() -> Self {
        Store::Redis(RedisServer::start().await.expect("redis starts"))
    }

    pub async fn cluster() -> Self {
        Store::Cluster(RedisCluster::start().await.expect("cluster starts"))
    }

    fn name(&self) -> &'static str {
        match self {
            Store::Memory(..) => "memory",
            Store::Redis(_) => "redis",
            Store::Cluster(_) => "cluster",
        }
    }

    /// Restarts Redis empty (on the Cluster: one master, which comes back with its slots);
    /// connections break, the replicas go through their failure policy (`open`) and recover.
    /// `false` on memory.
    async fn restart(&mut self) -> bool {
        match self {
            Store::Redis(server) => {
                server.restart().await.expect("redis restarts");
                true
            }
            Store::Cluster(cluster) => {
                let node = fastrand::usize(0..3);
                cluster
                    .restart_node(node)
                    .await
                    .expect("cluster node restarts");
                true
            }
            Store::Memory(..) => false,
        }
    }

    /// The clock the store (and the model) run on.
    fn clock(&self) -> Clock {
        match self {
            Store::Memory(_, manual) => manual.clock(),
            Store::Redis(_) | Store::Cluster(_) => Clock::system(),
        }
    }

    /// Lets `time` pass: the manual clock moves on memory; Redis' time is real.
    async fn pass(&self, time: Duration) {
        match self {
            Store::Memory(_, manual) => manual.advance(time),
            Store::Redis(_) | Store::Cluster(_) => tokio::time::sleep(time).await,
        }
    }

    /// Drops all data; `false` when the store cannot lose data (memory).
    async fn flush(&self) -> bool {
        match self {
            Store::Memory(..) => false,
            Store::Redis(server) => {
                server.flush().await.expect("flush");
                true
            }
            Store::Cluster(cluster) => {
                cluster.flush().await.expect("flush");
                true
            }
        }
    }

    async fn engine(&self, settings: &Settings) -> (Arc<LeaseEngine>, Config) {
        let target = match self {
            Store::Memory(backend, manual) => {
                let backend: Arc<dyn LeaseBackend> = backend.clone();
                let config = Config {
                    settings: settings.clone(),
                    backend: LeaseStore::Memory,
                    shutdown_grace: Duration::ZERO,
                    clock: manual.clock(),
                    ..Config::default()
                };
                let engine =
                    LeaseEngine::new(backend, settings.clone(), Metrics::new(), manual.clock());
                return (engine, config);
            }
            Store::Redis(server) => RedisTarget::Single(server.url()),
            Store::Cluster(cluster) => RedisTarget::parse(&cluster.url()).expect("cluster url"),
        };
        let config = Config {
            settings: settings.clone(),
            backend: LeaseStore::Redis {
                target,
                options: RedisOptions::default(),
                policy: Default::default(),
            },
            shutdown_grace: Duration::ZERO,
            ..Config::default()
        };
        let engine = server::build_engine(&config, Metrics::new())
            .await
            .expect("admission builds");
        (engine, config)
    }
}

/// A lease channel shared by the holders on it (the driver is sequential: one op at a time).
type SharedChannel = Arc<Mutex<LeaseChannel>>;

/// One admission replica serving gRPC on port 0; `kill` drops its connections at once.
pub struct Replica {
    pub admission: Arc<LeaseEngine>,
    pub client: Client,
    /// Its lease channels, opened on first use (they outlive a run).
    channels: [Option<SharedChannel>; CHANNELS],
    /// The last tag used on its channels: a tag is never reused, even across runs (a holder
    /// left open by one run may still hold its tag in the next).
    last_tag: u64,
    stop: Option<oneshot::Sender<()>>,
}

impl Replica {
    async fn start(store: &Store, settings: &Settings) -> Self {
        let (admission, config) = store.engine(settings).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = admission.clone();
        tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            let _ = server::serve(serving, &config, listener, None, shutdown).await;
        });
        let client = connect(addr).await;
        Replica {
            admission,
            client,
            channels: Default::default(),
            last_tag: 0,
            stop: Some(stop),
        }
    }

    /// Shutdown with a zero grace: the open lease streams break.
    fn kill(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The transport an acquire or resume opens its holder on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A lease stream of its own.
    Stream,
    /// A new tag on one of the replica's lease channels.
    Channel(usize),
}

/// One step of a run. Leases are named by their grant order in the run; an operation on a
/// lease (or stream) that does not exist or is in the wrong state is skipped.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Acquire {
        replica: usize,
        account: usize,
        wait_ms: u32,
        /// The client key (index into `KEY_LIMITS`) the request carries, if any.
        key: Option<usize>,
        via: Via,
    },
    Heartbeat {
        lease: usize,
        stream: usize,
    },
    /// `Release` on the lease's stream.
    StreamRelease {
        lease: usize,
        stream: usize,
    },
    /// The unary `Release` RPC, from any replica.
    UnaryRelease {
        lease: usize,
        replica: usize,
    },
    /// The holder goes away without `Release`.
    Drop {
        lease: usize,
        stream: usize,
    },
    Resume {
        lease: usize,
        replica: usize,
        via: Via,
    },
    /// A lease channel goes away: every lease on it is orphaned at once.
    DropChannel {
        replica: usize,
        channel: usize,
    },
    Attempt {
        lease: usize,
        stream: usize,
    },
    Sleep {
        ms: u64,
    },
    Flush,
    /// Redis restarts empty: an outage, the `open` fallback, and recovery.
    Restart,
    KillReplica {
        replica: usize,
    },
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Acquire {
                via: Via::Channel(_),
                ..
            } => "acquire_on_channel",
            Op::Acquire { .. } => "acquire",
            Op::Heartbeat { .. } => "heartbeat",
            Op::StreamRelease { .. } => "stream_release",
            Op::UnaryRelease { .. } => "unary_release",
            Op::Drop { .. } => "drop",
            Op::Resume {
                via: Via::Channel(_),
                ..
            } => "resume_on_channel",
            Op::Resume { .. } => "resume",
            Op::DropChannel { .. } => "drop_channel",
            Op::Attempt { .. } => "attempt",
            Op::Sleep { .. } => "sleep",
            Op::Flush => "flush",
            Op::Restart => "restart",
            Op::KillReplica { .. } => "kill_replica",
        }
    }

    fn random(rng: &mut fastrand::Rng, leases: usize) -> Op {
        let lease = if leases == 0 {
            0
        } else {
            // Recent leases more often: they are the ones still held.
            let recent = leases.saturating_sub(4);
            if rng.bool() {
                rng.usize(recent..leases)
            } else {
                rng.usize(0..leases)
            }
        };
        let stream = rng.usize(0..2);
        let replica = rng.usize(0..REPLICAS);
        let via = if rng.bool() {
            Via::Stream
        } else {
            Via::Channel(rng.usize(0..CHANNELS))
        };
        match rng.u32(0..100) {
            0..=21 => Op::Acquire {
                replica,
                account: rng.usize(0..LIMITS.len()),
                wait_ms: if rng.u32(0..4) == 0 { 300 } else { 0 },
                key: match rng.usize(0..KEY_LIMITS.len() + 1) {
                    0 => None,
                    n => Some(n - 1),
                },
                via,
            },
            22..=43 => Op::Heartbeat { lease, stream },
            44..=51 => Op::StreamRelease { lease, stream },
            52..=59 => Op::UnaryRelease { lease, replica },
            60..=67 => Op::Drop { lease, stream },
            68..=77 => Op::Resume {
                lease,
                replica,
                via,
            },
            78..=82 => Op::Attempt { lease, stream },
            83..=90 => Op::Sleep {
                ms: [60, 200, 1000][rng.usize(0..3)],
            },
            91..=92 => Op::DropChannel {
                replica,
                channel: rng.usize(0..CHANNELS),
            },
            93..=95 => Op::Flush,
            96 => Op::Restart,
            _ => Op::KillReplica { replica },
        }
    }
}

/// A violated invariant.
#[derive(Debug)]
pub struct Violation(String);

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

macro_rules! violation {
    ($($arg:tt)*) => { return Err(Violation(format!($($arg)*))) };
}

/// How a holder reaches its lease.
enum Transport {
    Stream(Box<LeaseStream>),
    /// One tag of a replica's lease channel (tags are never reused in a run).
    Channel {
        channel: SharedChannel,
        index: usize,
        tag: u64,
    },
}

impl Transport {
    async fn heartbeat(&mut self) -> Result<Option<pb::lease_event::Kind>, tonic::Status> {
        match self {
            Transport::Stream(stream) => stream.heartbeat().await,
            Transport::Channel { channel, tag, .. } => channel.lock().await.heartbeat(*tag).await,
        }
    }

    async fn attempt(&mut self) -> Result<Option<pb::lease_event::Kind>, tonic::Status> {
        match self {
            Transport::Stream(stream) => stream.attempt().await,
            Transport::Channel { channel, tag, .. } => channel.lock().await.attempt(*tag).await,
        }
    }

    /// Sends `Release` and reads the answer.
    async fn release(&mut self) -> Result<Option<pb::lease_event::Kind>, tonic::Status> {
        let release = pb::lease_request::Kind::Release(pb::Release {
            spend_usd: 0.0,
            tokens: 0,
        });
        match self {
            Transport::Stream(stream) => {
                stream.send(release).await;
                stream.next_event().await
            }
            Transport::Channel { channel, tag, .. } => {
                let mut channel = channel.lock().await;
                channel.send(*tag, release).await;
                channel.next_event(*tag).await
            }
        }
    }

    /// The holder goes away without `Release`: its stream ends, or `close` on its tag.
    async fn abandon(self) {
        match self {
            Transport::Stream(stream) => (*stream).abandon(),
            Transport::Channel { channel, tag, .. } => {
                channel.lock().await.close(tag).await;
            }
        }
    }

    /// Whether this holder is on channel `index` (of its replica).
    fn on_channel(&self, channel: usize) -> bool {
        matches!(self, Transport::Channel { index, .. } if *index == channel)
    }
}

/// One holder of a lease in the model.
struct Holder {
    replica: usize,
    stream: Transport,
    /// Unique in the run: names the stream that holds the lease now (`ModelLease::current`).
    serial: u64,
}

/// What the model knows of one granted lease.
struct ModelLease {
    id: String,
    account: usize,
    key: Option<usize>,
    holders: Vec<Holder>,
    /// Released (by a stream or unary release) in this data generation: never live again.
    released_in: Option<u64>,
    /// The last moment the store may have set its expiry (a grant, renewal or resume answered
    /// then): it is surely expired a ttl later.
    renewed_at: Instant,
    /// When its current holder went away without `Release`: the store cuts it to the orphan
    /// grace. Cleared by anything that may renew it.
    orphaned_at: Option<Instant>,
    /// The holder whose end cuts the lease (the acquiring stream, then the last resume); `None`
    /// when the model cannot tell (a resume without a clear answer).
    current: Option<u64>,
}

/// The reference model and the system under test for one run.
pub struct Run<'a> {
    store: &'a mut Store,
    replicas: &'a mut Vec<Replica>,
    settings: &'a Settings,
    accounts: [i64; LIMITS.len()],
    keys: [i64; KEY_LIMITS.len()],
    leases: Vec<ModelLease>,
    /// The next `Holder::serial`.
    next_serial: u64,
    /// Bumped on every flush: releases of older generations are no longer fenced.
    generation: u64,
    /// Redis restarted in this run: under the `open` policy the replicas admitted on their own
    /// (up to the limit each, adopting what their holders say is running), so from here on only
    /// the answers' protocol is checked; `Harness::run` waits for every replica's recovery
    /// before the next run. (Recovery itself is held by the failure_policy tests.)
    outage: bool,
    /// Operations applied (not skipped), by kind.
    applied: HashMap<&'static str, usize>,
}

fn terms(account_id: i64, limit: i32, wait_ms: u32) -> pb::Acquire {
    pb::Acquire {
        account_id,
        concurrency_limit: limit,
        rpm_limit: 10_000,
        wait_ms,
        ..Default::default()
    }
}

/// `terms` with a client key and its concurrency limit.
fn keyed_terms(account_id: i64, limit: i32, wait_ms: u32, key: Option<(i64, i32)>) -> pb::Acquire {
    let (api_key_id, key_concurrency_limit) = key.unwrap_or((0, 0));
    pb::Acquire {
        api_key_id,
        key_concurrency_limit,
        ..terms(account_id, limit, wait_ms)
    }
}

impl<'a> Run<'a> {
    fn new(
        store: &'a mut Store,
        replicas: &'a mut Vec<Replica>,
        settings: &'a Settings,
        first_account: i64,
        first_key: i64,
    ) -> Self {
        Run {
            store,
            replicas,
            settings,
            accounts: [first_account, first_account + 1],
            keys: [first_key, first_key + 1],
            next_serial: 0,
            leases: Vec::new(),
            generation: 0,
            outage: false,
            applied: HashMap::new(),
        }
    }

    fn ttl(&self) -> Duration {
        self.settings.lease_ttl
    }

    /// The model's time: the store's clock (manual on memory).
    fn now(&self) -> Instant {
        self.store.clock().now()
    }

    /// On the manual clock, waits (in real time, bounded) until the store shows the cut of each
    /// of `ids`, orphaned just now: time must not move on before the replica noticed the end
    /// of the stream, or the grace would run from a later instant than the model's
    /// `orphaned_at` (in real time `ORPHAN_SLACK` covers the notice). Best effort: a cut that
    /// never shows is left to the checks.
    async fn settle_cuts(&self, ids: &[String]) {
        let Store::Memory(backend, _) = &*self.store else {
            return;
        };
        if ids.is_empty() {
            return;
        }
        let grace_ms = millis(self.grace());
        let rpm_window_ms = millis(self.settings.rpm_window);
        let _ = poolgate_testkit::eventually(Duration::from_secs(1), || async {
            let snapshot = backend.snapshot(rpm_window_ms);
            let cut = ids.iter().all(|id| {
                snapshot
                    .accounts
                    .iter()
                    .flat_map(|account| &account.leases)
                    .find(|(lease, _)| lease == id)
                    .is_none_or(|(_, remaining_ms)| *remaining_ms <= grace_ms)
            });
            cut.then_some(())
        })
        .await;
    }

    fn fenced(&self, lease: usize) -> bool {
        !self.outage && self.leases[lease].released_in == Some(self.generation)
    }

    fn serial(&mut self) -> u64 {
        self.next_serial += 1;
        self.next_serial
    }

    fn grace(&self) -> Duration {
        self.settings.orphan_grace
    }

    /// The terms of an acquire on `account` with `key` (also what a resume of it sends).
    fn lease_terms(&self, account: usize, key: Option<usize>, wait_ms: u32) -> pb::Acquire {
        keyed_terms(
            self.accounts[account],
            LIMITS[account],
            wait_ms,
            key.map(|key| (self.keys[key], KEY_LIMITS[key])),
        )
    }

    /// Whether the store may still count lease `index` live at `at`: not fenced, renewed less
    /// than a ttl before, not orphaned longer than the grace before.
    fn may_live(&self, index: usize, at: Instant) -> bool {
        let lease = &self.leases[index];
        !self.fenced(index)
            && lease.renewed_at + self.ttl() + SLACK >= at
            && lease
                .orphaned_at
                .is_none_or(|orphaned| orphaned + self.grace() + ORPHAN_SLACK >= at)
    }

    /// Leases of key `key` the store may count live at `at`.
    fn key_may_live(&self, key: usize, at: Instant) -> usize {
        (0..self.leases.len())
            .filter(|&index| self.leases[index].key == Some(key) && self.may_live(index, at))
            .count()
    }

    /// Opens a holder on `replica` via `via` with `first` (an acquire or resume), and reads the
    /// answer. `Err`: the call failed (replica gone).
    async fn open(
        &mut self,
        replica: usize,
        via: Via,
        first: pb::lease_request::Kind,
    ) -> Result<(Transport, Answer), tonic::Status> {
        let client = self.replicas[replica].client.clone();
        let index = match via {
            Via::Stream => {
                let (stream, answer) = LeaseStream::try_open(&client, first).await?;
                return Ok((Transport::Stream(Box::new(stream)), answer));
            }
            Via::Channel(index) => index,
        };
        let channel = match &self.replicas[replica].channels[index] {
            Some(channel) => channel.clone(),
            None => {
                let channel = Arc::new(Mutex::new(LeaseChannel::try_open(&client).await?));
                self.replicas[replica].channels[index] = Some(channel.clone());
                channel
            }
        };
        self.replicas[replica].last_tag += 1;
        let tag = self.replicas[replica].last_tag;
        let answer = {
            let mut open = channel.lock().await;
            open.send(tag, first).await;
            open.answer(tag, &mut Vec::new()).await
        };
        Ok((
            Transport::Channel {
                channel,
                index,
                tag,
            },
            answer,
        ))
    }

    fn pick_holder(&mut self, lease: usize, stream: usize) -> Option<(usize, usize)> {
        let found = self.leases.get(lease)?;
        if found.holders.is_empty() {
            return None;
        }
        Some((lease, stream % found.holders.len()))
    }

    /// Applies one operation; `Ok(false)` when it was skipped (no such lease or stream).
    async fn step(&mut self, op: &Op) -> Result<bool, Violation> {
        match *op {
            Op::Acquire {
                replica,
                account,
                wait_ms,
                key,
                via,
            } => {
                let acquire = self.lease_terms(account, key, wait_ms);
                let sent_at = self.now();
                let Ok((stream, answer)) = self
                    .open(replica, via, pb::lease_request::Kind::Acquire(acquire))
                    .await
                else {
                    return Ok(false);
                };
                if let Some(key) = key
                    && !self.outage
                    && answer.denied_reason() == Some(pb::DenyReason::KeyConcurrency)
                {
                    // Refused for the key: its limit must have been taken when the acquire was
                    // sent (live leases only go away while it runs; the model renews nothing).
                    let may_live = self.key_may_live(key, sent_at);
                    if may_live < KEY_LIMITS[key] as usize {
                        violation!(
                            "key {} refused key_concurrency with at most {may_live} live leases \
                             on a limit of {}",
                            self.keys[key],
                            KEY_LIMITS[key]
                        );
                    }
                }
                if let Answer::Granted(id) = answer {
                    if key.is_some() != id.contains(".k") {
                        violation!("lease {id} granted for key {key:?}: the id does not say so");
                    }
                    let serial = self.serial();
                    self.leases.push(ModelLease {
                        id,
                        account,
                        key,
                        holders: vec![Holder {
                            replica,
                            stream,
                            serial,
                        }],
                        released_in: None,
                        renewed_at: self.now(),
                        orphaned_at: None,
                        current: Some(serial),
                    });
                }
            }
            Op::Heartbeat { lease, stream } => {
                let Some((lease, stream)) = self.pick_holder(lease, stream) else {
                    return Ok(false);
                };
                let event = self.leases[lease].holders[stream].stream.heartbeat().await;
                match event {
                    Ok(Some(pb::lease_event::Kind::Renewed(_))) => {
                        if self.fenced(lease) {
                            violation!(
                                "released lease {} renewed by its old holder",
                                self.leases[lease].id
                            );
                        }
                        self.leases[lease].released_in = None;
                        self.leases[lease].renewed_at = self.now();
                        self.leases[lease].orphaned_at = None;
                    }
                    // The backend did not answer (not with `open` on Redis, which falls back).
                    Ok(Some(pb::lease_event::Kind::NotRenewed(_))) => {}
                    Ok(Some(pb::lease_event::Kind::Lost(_))) => {
                        self.leases[lease].holders.remove(stream);
                    }
                    // No answer: the renewal may have gone through (the model stays an upper
                    // bound).
                    Ok(None) | Err(_) => {
                        self.leases[lease].holders.remove(stream);
                        self.leases[lease].renewed_at = self.now();
                        self.leases[lease].orphaned_at = None;
                    }
                    Ok(Some(other)) => violation!("heartbeat answered {other:?}"),
                }
            }
            Op::StreamRelease { lease, stream } => {
                let Some((lease, stream)) = self.pick_holder(lease, stream) else {
                    return Ok(false);
                };
                let mut holder = self.leases[lease].holders.remove(stream);
                if let Ok(Some(pb::lease_event::Kind::Released(_))) = holder.stream.release().await
                {
                    self.leases[lease].released_in = Some(self.generation);
                }
            }
            Op::UnaryRelease { lease, replica } => {
                let Some(id) = self.leases.get(lease).map(|l| l.id.clone()) else {
                    return Ok(false);
                };
                let mut client = self.replicas[replica].client.clone();
                if client
                    .release(pb::ReleaseRequest {
                        lease_id: id,
                        ..Default::default()
                    })
                    .await
                    .is_ok()
                {
                    self.leases[lease].released_in = Some(self.generation);
                }
            }
            Op::Drop { lease, stream } => {
                let Some((lease, stream)) = self.pick_holder(lease, stream) else {
                    return Ok(false);
                };
                let holder = self.leases[lease].holders.remove(stream);
                let current = self.leases[lease].current == Some(holder.serial);
                holder.stream.abandon().await;
                // Only the current holder's end cuts the lease (holder epochs); an older
                // stream's end leaves it as it is.
                if current && self.leases[lease].orphaned_at.is_none() {
                    self.leases[lease].orphaned_at = Some(self.now());
                }
                if current {
                    let id = self.leases[lease].id.clone();
                    self.settle_cuts(&[id]).await;
                }
            }
            Op::Resume {
                lease,
                replica,
                via,
            } => {
                let Some(found) = self.leases.get(lease) else {
                    return Ok(false);
                };
                let resume = pb::lease_request::Kind::Resume(pb::Resume {
                    lease_id: found.id.clone(),
                    terms: Some(self.lease_terms(found.account, found.key, 0)),
                });
                let sent_at = self.now();
                let Ok((stream, answer)) = self.open(replica, via, resume).await else {
                    // The resume may have been applied before the call failed.
                    self.leases[lease].renewed_at = self.now();
                    self.leases[lease].orphaned_at = None;
                    self.leases[lease].current = None;
                    return Ok(false);
                };
                if let Answer::Error(..) = answer {
                    self.leases[lease].renewed_at = self.now();
                    self.leases[lease].orphaned_at = None;
                    self.leases[lease].current = None;
                }
                if answer.is_granted() {
                    if self.fenced(lease) {
                        violation!("released lease {} resumed", self.leases[lease].id);
                    }
                    if !self.outage && self.leases[lease].renewed_at + self.ttl() + SLACK < sent_at
                    {
                        violation!("expired lease {} resumed", self.leases[lease].id);
                    }
                    self.leases[lease].renewed_at = self.now();
                    let serial = self.serial();
                    self.leases[lease].orphaned_at = None;
                    self.leases[lease].current = Some(serial);
                    self.leases[lease].holders.push(Holder {
                        replica,
                        stream,
                        serial,
                    });
                }
            }
            Op::Attempt { lease, stream } => {
                let Some((lease, stream)) = self.pick_holder(lease, stream) else {
                    return Ok(false);
                };
                match self.leases[lease].holders[stream].stream.attempt().await {
                    Ok(Some(
                        pb::lease_event::Kind::AttemptAccepted(_)
                        | pb::lease_event::Kind::Denied(_),
                    )) => {}
                    Ok(Some(pb::lease_event::Kind::Lost(_))) | Ok(None) | Err(_) => {
                        self.leases[lease].holders.remove(stream);
                    }
                    Ok(Some(other)) => violation!("attempt answered {other:?}"),
                }
            }
            Op::DropChannel { replica, channel } => {
                let Some(dropped) = self.replicas[replica].channels[channel].take() else {
                    return Ok(false);
                };
                dropped.lock().await.drop_channel();
                let now = self.now();
                let mut cut = Vec::new();
                for lease in &mut self.leases {
                    let (gone, kept) = std::mem::take(&mut lease.holders).into_iter().partition(
                        |holder: &Holder| {
                            holder.replica == replica && holder.stream.on_channel(channel)
                        },
                    );
                    lease.holders = kept;
                    // As for `Drop`: only the current holder's end cuts the lease.
                    let current = gone
                        .iter()
                        .any(|holder| lease.current == Some(holder.serial));
                    if current && lease.orphaned_at.is_none() {
                        lease.orphaned_at = Some(now);
                    }
                    if current {
                        cut.push(lease.id.clone());
                    }
                }
                self.settle_cuts(&cut).await;
            }
            Op::Sleep { ms } => self.store.pass(Duration::from_millis(ms)).await,
            Op::Flush => {
                if !self.store.flush().await {
                    return Ok(false);
                }
                self.generation += 1;
            }
            Op::Restart => {
                if !self.store.restart().await {
                    return Ok(false);
                }
                self.generation += 1;
                self.outage = true;
            }
            Op::KillReplica { replica } => {
                self.replicas[replica].kill();
                let fresh = Replica::start(&*self.store, self.settings).await;
                self.replicas[replica] = fresh;
                for lease in &mut self.leases {
                    lease.holders.retain(|holder| holder.replica != replica);
                }
            }
        }
        Ok(true)
    }

    /// The store's live counts against the limits and the model.
    async fn check(&self) -> Result<(), Violation> {
        if self.outage {
            return Ok(());
        }
        let asked_at = self.now();
        let counts = self.replicas[0]
            .admission
            .inflight(&self.accounts)
            .await
            .map_err(|error| Violation(format!("inflight failed: {error}")))?;
        for (account, &count) in counts.iter().enumerate() {
            let limit = LIMITS[account];
            if count as i32 > limit {
                violation!(
                    "account {} holds {count} live leases on a limit of {limit}",
                    self.accounts[account]
                );
            }
            let may_live = (0..self.leases.len())
                .filter(|&index| {
                    self.leases[index].account == account && self.may_live(index, asked_at)
                })
                .count();
            if count as usize > may_live {
                violation!(
                    "account {} holds {count} live leases, the model allows {may_live} (phantom)",
                    self.accounts[account]
                );
            }
        }
        // The keys' slots: within each key's limit, and nothing the model does not allow (a
        // released keyed lease gave its key slot back, an orphaned one after the grace).
        let counts = self.replicas[0]
            .admission
            .key_inflight(&self.keys)
            .await
            .map_err(|error| Violation(format!("key inflight failed: {error}")))?;
        for (key, &count) in counts.iter().enumerate() {
            let limit = KEY_LIMITS[key];
            if count as i32 > limit {
                violation!(
                    "key {} holds {count} live leases on a limit of {limit}",
                    self.keys[key]
                );
            }
            let may_live = self.key_may_live(key, asked_at);
            if count as usize > may_live {
                violation!(
                    "key {} holds {count} live leases, the model allows {may_live} (phantom)",
                    self.keys[key]
                );
            }
        }
        Ok(())
    }

    /// Applies `ops` in order, checking after each. On a violation returns the operations that
    /// were applied (skipped ones left out), the failing one last.
    async fn apply(&mut self, ops: &[Op]) -> Result<(), Failure> {
        let mut applied = Vec::new();
        for op in ops {
            let result = match self.step(op).await {
                Ok(true) => self.check().await,
                Ok(false) => continue,
                Err(violation) => Err(violation),
            };
            applied.push(op.clone());
            *self.applied.entry(op.name()).or_default() += 1;
            if let Err(violation) = result {
                return Err(Failure { applied, violation });
            }
        }
        Ok(())
    }
}

/// A run that broke an invariant.
#[derive(Debug)]
pub struct Failure {
    pub applied: Vec<Op>,
    pub violation: Violation,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}; the operations applied:", self.violation)?;
        for (index, op) in self.applied.iter().enumerate() {
            writeln!(f, "  {index:>2}: {op:?},")?;
        }
        Ok(())
    }
}

/// The replicas of one backend, shared by the runs of a test (each run uses fresh accounts).
pub struct Harness {
    pub store: Store,
    pub replicas: Vec<Replica>,
    pub settings: Settings,
    next_account: i64,
    next_key: i64,
    /// Operations applied over every run, by kind.
    applied: HashMap<&'static str, usize>,
}

impl Harness {
    pub async fn start(store: Store) -> Self {
        Self::start_with(store, model_settings()).await
    }

    pub async fn start_with(store: Store, settings: Settings) -> Self {
        let mut replicas = Vec::new();
        for _ in 0..REPLICAS {
            replicas.push(Replica::start(&store, &settings).await);
        }
        Harness {
            store,
            replicas,
            settings,
            next_account: 1_000,
            next_key: 1_000,
            applied: HashMap::new(),
        }
    }

    /// Runs `ops` on fresh accounts.
    pub async fn run(&mut self, ops: &[Op]) -> Result<(), Failure> {
        let first_account = self.next_account;
        self.next_account += LIMITS.len() as i64;
        let first_key = self.next_key;
        self.next_key += KEY_LIMITS.len() as i64;
        let mut run = Run::new(
            &mut self.store,
            &mut self.replicas,
            &self.settings,
            first_account,
            first_key,
        );
        let result = run.apply(ops).await;
        let outage = run.outage;
        for (name, count) in run.applied {
            *self.applied.entry(name).or_default() += count;
        }
        if outage {
            self.recover().await;
        }
        result
    }

    /// After a Redis restart: every replica notices the outage (a read fails on its broken
    /// connections) and recovers (its registry tick), before the next run starts.
    async fn recover(&self) {
        for replica in &self.replicas {
            let _ = replica.admission.inflight(&[1]).await;
        }
        let replicas = &self.replicas;
        poolgate_testkit::eventually(Duration::from_secs(15), || async move {
            replicas
                .iter()
                .all(|replica| !replica.admission.is_degraded())
                .then_some(())
        })
        .await
        .expect("every replica recovers after the restart");
    }
}

/// A sequence of `OPS_PER_RUN` random operations from `seed`. The generator only needs the
/// number of leases so far, which it guesses (every acquire counted): replaying a seed gives the
/// same sequence whatever the store answers.
pub fn sequence(seed: u64) -> Vec<Op> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut acquires = 0;
    let mut ops = Vec::with_capacity(OPS_PER_RUN);
    for _ in 0..OPS_PER_RUN {
        let op = Op::random(&mut rng, acquires);
        if matches!(op, Op::Acquire { .. }) {
            acquires += 1;
        }
        ops.push(op);
    }
    ops
}

/// Leases are named by grant order, so the indices of a replayed sequence match the original
/// when the grants do; a sequence whose lease index points past the grants skips that step.
pub async fn replay(store: Store, ops: &[Op]) {
    let mut harness = Harness::start(store).await;
    if let Err(failure) = harness.run(ops).await {
        panic!("replay on {}: {failure}", harness.store.name());
    }
}

/// Shortens a failing sequence: drops one operation at a time (last first) and keeps the drop
/// when the rest still fails (on fresh accounts). Timing makes this best effort.
async fn shrink(harness: &mut Harness, failure: Failure) -> Failure {
    let mut best = failure;
    let mut index = best.applied.len().saturating_sub(1);
    while index > 0 {
        index -= 1;
        let mut candidate = best.applied.clone();
        candidate.remove(index);
        if let Err(smaller) = harness.run(&candidate).await {
            best = smaller;
            index = index.min(best.applied.len().saturating_sub(1));
        }
    }
    best
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Random runs until the time budget is spent; the first violation fails the test with its
/// seed and sequence.
async fn explore(store: Store) {
    let budget = Duration::from_secs(env_u64("POOLGATE_MODEL_SECS").unwrap_or(40));
    let fixed = env_u64("POOLGATE_MODEL_SEED");
    let first_seed = fixed.unwrap_or_else(|| fastrand::u64(..));
    let mut harness = Harness::start(store).await;
    let name = harness.store.name();
    println!(
        "lease model on {name}: first seed {first_seed} (replay: POOLGATE_MODEL_SEED={first_seed})"
    );
    let started = Instant::now();
    let mut runs = 0u64;
    let mut steps = 0usize;
    loop {
        let seed = first_seed.wrapping_add(runs);
        let ops = sequence(seed);
        runs += 1;
        if let Err(failure) = harness.run(&ops).await {
            let shrunk = shrink(&mut harness, failure).await;
            panic!(
                "lease model on {name}: seed {seed} (replay: POOLGATE_MODEL_SEED={seed}) broke \
                 an invariant: {shrunk}"
            );
        }
        steps += ops.len();
        if fixed.is_some() || started.elapsed() >= budget {
            break;
        }
    }
    let mut applied: Vec<_> = harness.applied.iter().collect();
    applied.sort();
    let elapsed = started.elapsed();
    println!(
        "lease model on {name}: {runs} runs, {steps} steps in {elapsed:?} ({:.1} steps/s), no \
         violation; applied: {applied:?}",
        steps as f64 / elapsed.as_secs_f64().max(f64::EPSILON)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_invariants_hold_on_memory() {
    explore(Store::memory().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_invariants_hold_on_redis() {
    explore(Store::redis().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_invariants_hold_on_a_redis_cluster() {
    explore(Store::cluster().await).await;
}

// The sequences the model found on the code before the invariants were fixed (shrunk), replayed as plain
// tests. Both ended with the old holder's heartbeat answered `Renewed` for a released lease.

/// Found on memory (seed 15494168160578800756) and on the Cluster (seed 15935339091107387932).
fn unary_release_then_old_heartbeat() -> Vec<Op> {
    vec![
        Op::Acquire {
            replica: 2,
            account: 0,
            wait_ms: 0,
            key: None,
            via: Via::Stream,
        },
        Op::UnaryRelease {
            lease: 0,
            replica: 0,
        },
        Op::Acquire {
            replica: 1,
            account: 0,
            wait_ms: 0,
            key: None,
            via: Via::Stream,
        },
        Op::Heartbeat {
            lease: 0,
            stream: 0,
        },
    ]
}

/// Found on Redis (seed 15312692336594586171): released on the resumed stream, renewed by the
/// stream the resume replaced.
fn release_on_a_resumed_stream_then_old_heartbeat() -> Vec<Op> {
    vec![
        Op::Acquire {
            replica: 1,
            account: 1,
            wait_ms: 0,
            key: None,
            via: Via::Stream,
        },
        Op::Resume {
            lease: 0,
            replica: 2,
            via: Via::Stream,
        },
        Op::StreamRelease {
            lease: 0,
            stream: 1,
        },
        Op::Heartbeat {
            lease: 0,
            stream: 1,
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_unary_release_then_old_heartbeat_on_memory() {
    replay(Store::memory().await, &unary_release_then_old_heartbeat()).await;
    replay(
        Store::memory().await,
        &release_on_a_resumed_stream_then_old_heartbeat(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_unary_release_then_old_heartbeat_on_redis() {
    replay(Store::redis().await, &unary_release_then_old_heartbeat()).await;
    replay(
        Store::redis().await,
        &release_on_a_resumed_stream_then_old_heartbeat(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_unary_release_then_old_heartbeat_on_a_redis_cluster() {
    let store = Store::cluster().await;
    let mut harness = Harness::start(store).await;
    for ops in [
        unary_release_then_old_heartbeat(),
        release_on_a_resumed_stream_then_old_heartbeat(),
    ] {
        if let Err(failure) = harness.run(&ops).await {
            panic!("replay on cluster: {failure}");
        }
    }
}

/// Leases held on a channel (one of them resumed on a stream elsewhere, one closed by its tag),
/// then the channel dropped: the store must free every lease on it within the grace, not the
/// ttl (the model counts them phantom from grace + slack on), and keep the resumed one.
fn channel_dropped_under_held_leases() -> Vec<Op> {
    let acquire = |account| Op::Acquire {
        replica: 0,
        account,
        wait_ms: 0,
        key: None,
        via: Via::Channel(0),
    };
    vec![
        acquire(0),
        acquire(1),
        acquire(1),
        Op::Drop {
            lease: 1,
            stream: 0,
        },
        Op::Resume {
            lease: 1,
            replica: 1,
            via: Via::Stream,
        },
        Op::DropChannel {
            replica: 0,
            channel: 0,
        },
        Op::Sleep { ms: 200 },
        Op::Sleep { ms: 200 },
        Op::Sleep { ms: 200 },
        Op::Heartbeat {
            lease: 1,
            stream: 0,
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_channel_frees_its_leases_within_the_grace() {
    replay(Store::memory().await, &channel_dropped_under_held_leases()).await;
    replay(Store::redis().await, &channel_dropped_under_held_leases()).await;
}

/// A flush under held leases: 50 leases held over 5 accounts (limit 10) on 3 replicas, the data
/// flushed under them. No new acquire is granted while the accounts recount (the first one
/// notices the loss), every old lease comes back (put back by its replica's restore pass or by
/// its holder's heartbeat, whatever the limit: they ran within it), and after the recount every
/// account is at its limit with exactly the old leases: nothing new fits until one ends
/// (docs/DESIGN.md §3, "When Redis is wiped").
async fn flush_under_held_leases_keeps_every_account_within_its_limit(store: Store) {
    const ACCOUNTS: i64 = 5;
    const LIMIT: i32 = 10;
    // A long ttl: no lease may expire while the test runs.
    let settings = Settings {
        lease_ttl: Duration::from_secs(30),
        ..model_settings()
    };
    let harness = Harness::start_with(store, settings).await;
    let accounts: Vec<i64> = (0..ACCOUNTS).map(|n| 7_000 + n).collect();
    let terms = |account: i64| terms(account, LIMIT, 0);
    let mut old = Vec::new();
    for (n, &account) in accounts.iter().enumerate() {
        for k in 0..LIMIT as usize {
            let client = &harness.replicas[(n + k) % REPLICAS].client;
            let (stream, answer) = LeaseStream::acquire(client, terms(account)).await;
            assert!(answer.is_granted(), "{answer:?}");
            old.push((account, stream));
        }
    }
    assert_eq!(old.len(), 50);
    assert!(harness.store.flush().await);
    // New acquires on every replica find the accounts recounting: none is granted, though
    // Redis holds no lease of them now.
    for (n, &account) in accounts.iter().enumerate() {
        for replica in &harness.replicas {
            let (_, answer) = LeaseStream::acquire(&replica.client, terms(account)).await;
            assert_eq!(
                answer.denied_reason(),
                Some(pb::DenyReason::Concurrency),
                "account {n} right after the flush: {answer:?}"
            );
        }
    }
    // Every old holder keeps its lease: its replica put it back, or its heartbeat does now.
    for (account, stream) in &mut old {
        match stream.heartbeat().await {
            Ok(Some(pb::lease_event::Kind::Renewed(_))) => {}
            other => panic!("account {account}: the old holder's heartbeat answered {other:?}"),
        }
    }
    let live = harness.replicas[0]
        .admission
        .inflight(&accounts)
        .await
        .expect("inflight");
    assert_eq!(
        live,
        vec![LIMIT as u32; ACCOUNTS as usize],
        "every old lease is back"
    );
    // Every replica noticed the loss by itself (the acquire that found a marker gone, or its
    // own registry entry gone) and ran its restore pass over every lease it holds.
    for (n, replica) in harness.replicas.iter().enumerate() {
        poolgate_testkit::eventually(Duration::from_secs(5), || async {
            (replica.admission.metrics().redis_state_lost.get() >= 1).then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("replica {n} did not notice the loss"));
    }
    // Each pass counts when it ends (its notice is counted as it starts).
    let put_back = || -> u64 {
        harness
            .replicas
            .iter()
            .map(|replica| replica.admission.metrics().leases_put_back.get())
            .sum()
    };
    poolgate_testkit::eventually(Duration::from_secs(5), || async {
        (put_back() >= 50).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the restore passes counted {} of 50 held leases",
            put_back()
        )
    });
    // After the recount the accounts count their running leases again: full, nothing new fits;
    // one old lease ends, and exactly one new one fits.
    tokio::time::sleep(poolgate_lease::redis_backend::DEFAULT_RECOUNT + Duration::from_millis(200))
        .await;
    for &account in &accounts {
        let (_, answer) = LeaseStream::acquire(&harness.replicas[1].client, terms(account)).await;
        assert_eq!(answer.denied_reason(), Some(pb::DenyReason::Concurrency));
    }
    let (account, first) = old.swap_remove(0);
    first.release(0.0).await;
    let (_new, answer) = LeaseStream::acquire(&harness.replicas[2].client, terms(account)).await;
    assert!(
        answer.is_granted(),
        "after the recount, the freed slot: {answer:?}"
    );
    let (_, answer) = LeaseStream::acquire(&harness.replicas[0].client, terms(account)).await;
    assert_eq!(answer.denied_reason(), Some(pb::DenyReason::Concurrency));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_under_50_held_leases_keeps_every_account_within_its_limit_on_redis() {
    flush_under_held_leases_keeps_every_account_within_its_limit(Store::redis().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_under_50_held_leases_keeps_every_account_within_its_limit_on_a_redis_cluster() {
    flush_under_held_leases_keeps_every_account_within_its_limit(Store::cluster().await).await;
}
