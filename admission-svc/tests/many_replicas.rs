//! Many admission replicas on one Redis never over-admit (docs/DESIGN.md §4): three admission-svc processes, 200 concurrent lease streams on one account with
//! limit 5, and an independent observer — the test's own count of granted-and-not-yet-released
//! leases.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use poolgate_proto::admission::v1 as pb;
use poolgate_testkit::{RedisServer, eventually};
use support::{AdmissionProcess, Answer, Client, LeaseStream, acquire, connect, inflight_one};

const ACCOUNT: i64 = 900;
const LIMIT: i32 = 5;
const CLIENTS: usize = 200;

/// Counts leases the test holds: +1 after `Granted`, -1 before `Release`, so it never counts
/// more than the backend holds. Its peak is what "never more than the limit" is checked on.
#[derive(Default)]
struct Observer {
    current: AtomicI64,
    peak: AtomicI64,
}

impl Observer {
    fn enter(&self) {
        let now = self.current.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.current.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Outcome {
    /// Index of the replica that granted the lease.
    replica: usize,
    released: bool,
}

/// One client request: acquire (waiting), hold, release. A replica that fails the stream sends
/// the client to the next replica.
async fn client(
    clients: Arc<Vec<Client>>,
    dead: Arc<Vec<AtomicBool>>,
    first: usize,
    observer: Arc<Observer>,
) -> Result<Outcome, String> {
    let mut replica = first;
    for _ in 0..20 {
        replica %= clients.len();
        if dead[replica].load(Ordering::SeqCst) {
            replica += 1;
            continue;
        }
        let terms = pb::Acquire {
            wait_ms: 60_000,
            ..acquire(ACCOUNT, LIMIT)
        };
        let opened =
            LeaseStream::try_open(&clients[replica], pb::lease_request::Kind::Acquire(terms)).await;
        match opened {
            Ok((stream, Answer::Granted(_))) => {
                observer.enter();
                tokio::time::sleep(Duration::from_millis(fastrand::u64(5..30))).await;
                observer.leave();
                let released = stream.try_release().await;
                return Ok(Outcome { replica, released });
            }
            Ok((_, Answer::Denied(reason, _))) => {
                return Err(format!("denied {reason:?} despite a long wait"));
            }
            Ok((_, Answer::Lost(reason))) => {
                return Err(format!("an acquire answered lost {reason:?}"));
            }
            // The replica went away mid-stream or refused the connection: next one.
            Ok((_, Answer::Error(..))) | Err(_) => replica += 1,
        }
    }
    Err("no replica served the request".into())
}

async fn start_replicas(redis: &RedisServer) -> (Vec<AdmissionProcess>, Arc<Vec<Client>>) {
    let mut processes = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..3 {
        let process = AdmissionProcess::spawn(
            env!("CARGO_BIN_EXE_admission-svc"),
            &redis.url(),
            &[
                "--lease-ttl-ms",
                "2000",
                "--max-waiting",
                "1000",
                "--registry-interval-ms",
                "200",
            ],
        );
        clients.push(connect(process.addr).await);
        processes.push(process);
    }
    (processes, Arc::new(clients))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_never_admit_more_than_the_limit_and_everyone_gets_through() {
    let redis = RedisServer::start().await.expect("redis");
    let (_processes, clients) = start_replicas(&redis).await;
    let dead = Arc::new((0..3).map(|_| AtomicBool::new(false)).collect::<Vec<_>>());
    let observer = Arc::new(Observer::default());
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(client(clients.clone(), dead.clone(), i, observer.clone())))
        .collect();
    let mut served = 0;
    for task in tasks {
        let outcome = task.await.expect("client task").expect("client served");
        assert!(outcome.released, "every release answered");
        served += 1;
    }
    assert_eq!(served, CLIENTS);
    let peak = observer.peak.load(Ordering::SeqCst);
    assert!(
        peak <= LIMIT as i64,
        "observer saw {peak} leases at once, limit {LIMIT}"
    );
    assert!(peak >= 2, "the test exercised concurrency (peak {peak})");
    assert_eq!(inflight_one(&clients[0], ACCOUNT).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_replica_midway_reaps_only_its_leases_and_never_over_admits() {
    let redis = RedisServer::start().await.expect("redis");
    let (mut processes, clients) = start_replicas(&redis).await;
    let dead = Arc::new((0..3).map(|_| AtomicBool::new(false)).collect::<Vec<_>>());
    let observer = Arc::new(Observer::default());
    let done = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (clients, dead, observer, done) = (
                clients.clone(),
                dead.clone(),
                observer.clone(),
                done.clone(),
            );
            tokio::spawn(async move {
                let outcome = client(clients, dead, i, observer).await;
                done.fetch_add(1, Ordering::SeqCst);
                outcome
            })
        })
        .collect();
    eventually(Duration::from_secs(30), || async {
        (done.load(Ordering::SeqCst) >= CLIENTS / 4).then_some(())
    })
    .await
    .expect("a quarter of the clients finished");
    dead[0].store(true, Ordering::SeqCst);
    processes[0].child.kill().expect("kill -9");
    let _ = processes[0].child.wait();
    let mut served = 0;
    for task in tasks {
        let outcome = task.await.expect("client task").expect("client served");
        if outcome.replica != 0 {
            assert!(
                outcome.released,
                "a survivor's lease is untouched by the kill"
            );
        }
        served += 1;
    }
    assert_eq!(served, CLIENTS, "everyone got through");
    let peak = observer.peak.load(Ordering::SeqCst);
    assert!(
        peak <= LIMIT as i64,
        "observer saw {peak} leases at once, limit {LIMIT}"
    );
    // Whatever the dead replica held is gone within its ttl (2 s); nothing else remains.
    eventually(Duration::from_secs(4), || async {
        (inflight_one(&clients[1], ACCOUNT).await == 0).then_some(())
    })
    .await
    .expect("the dead replica's leases are reaped");
}
