//! The contended phase of `admission-bench` (`--contended-seconds`): more workers than slots on
//! one account, every acquire waiting; on one replica, on two replicas that wake each other's
//! waiters, and on two that only poll (`LeaseStore::SharedRedis` runs the same scripts without
//! the wake subscription: how waiters across replicas fared before it). What it reports is how
//! long a waiter waits.

use std::time::{Duration, Instant};

use poolgate_bench::stats::Sample;
use poolgate_lease::LeaseStore;
use poolgate_lease::metrics::Metrics;
use poolgate_proto::admission::v1 as pb;
use poolgate_runtime::redis::{RedisHandle, RedisOptions, RedisTarget};

use super::{Args, Client, LeaseCall, collect, replica};

/// One contended lease: Acquire (waiting up to 30 s) → Granted, hold, Release → Released.
/// Returns the wait (acquire → granted) in µs.
async fn lease(client: &mut Client, account_id: i64, limit: i32, hold: Duration) -> Option<u64> {
    let start = Instant::now();
    let acquire = pb::Acquire {
        account_id,
        concurrency_limit: limit,
        wait_ms: 30_000,
        ..Default::default()
    };
    let mut call = LeaseCall::open(client, acquire).await?;
    call.granted().await?;
    let waited = start.elapsed().as_micros() as u64;
    tokio::time::sleep(hold).await;
    call.release().await?;
    Some(waited)
}

/// The contended phase on `replicas` (one client each): every worker runs contended leases on
/// its replica back to back on one account. Returns the waits on each replica.
async fn run(replicas: &[Client], account_id: i64, args: &Args) -> Vec<Sample> {
    let deadline = Instant::now() + Duration::from_secs_f64(args.contended_seconds);
    let started = Instant::now();
    let hold = Duration::from_millis(args.hold_ms);
    let mut workers: Vec<Vec<_>> = replicas.iter().map(|_| Vec::new()).collect();
    for worker in 0..args.contended_workers {
        let on = worker % replicas.len();
        let mut client = replicas[on].clone();
        let limit = args.contended_limit;
        workers[on].push(tokio::spawn(async move {
            let mut waits = Vec::new();
            let mut errors = 0;
            while Instant::now() < deadline {
                match lease(&mut client, account_id, limit, hold).await {
                    Some(waited) => waits.push(waited),
                    None => errors += 1,
                }
            }
            (waits, errors)
        }));
    }
    let mut samples = Vec::new();
    for on_replica in workers {
        samples.push(collect(on_replica, started).await);
    }
    samples
}

/// One account, more workers than slots, on one replica and on two: how long a waiter waits.
pub(super) async fn phase(
    target: &RedisTarget,
    options: &RedisOptions,
    args: &Args,
) -> Result<(), String> {
    let listening = || LeaseStore::Redis {
        target: target.clone(),
        options: options.clone(),
        policy: Default::default(),
    };
    // The same scripts on a shared handle, without the wake subscription: how waiters across
    // replicas fared before it.
    let deaf = || async {
        let handle = RedisHandle::connect(target, options, Metrics::new().redis_round_trips)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(LeaseStore::SharedRedis(handle))
    };
    let one = replica(listening(), 1).await?;
    let mut two = replica(listening(), 1).await?;
    two.extend(replica(listening(), 1).await?);
    let mut two_deaf = replica(deaf().await?, 1).await?;
    two_deaf.extend(replica(deaf().await?, 1).await?);
    let ideal = f64::from(args.contended_limit) * 1000.0 / args.hold_ms.max(1) as f64;
    println!(
        "contended: {} workers on one account of {} slots, each lease held {} ms (at most {ideal:.0} leases/s), {} s per run",
        args.contended_workers, args.contended_limit, args.hold_ms, args.contended_seconds
    );
    // Each run on an account of its own, so no run inherits another's waiters.
    let runs = [
        ("one replica", &one, 9_001),
        ("two replicas, woken across", &two, 9_002),
        ("two replicas, polling only (before)", &two_deaf, 9_003),
    ];
    // Per replica too: when one replica's waiters take most slots, the other's long waits are
    // too few to show in the whole run's p99.
    for (name, replicas, account) in runs {
        let per_replica = run(replicas, account, args).await;
        let mut all = Sample::default();
        for sample in &per_replica {
            all.add(sample.micros.clone(), sample.errors);
            all.elapsed = sample.elapsed;
        }
        println!("{}", all.line(&format!("wait → granted, {name}")));
        if per_replica.len() > 1 {
            for (n, mut sample) in per_replica.into_iter().enumerate() {
                let max = sample.percentile(1.0);
                println!(
                    "{}  max {max:>8.3} ms",
                    sample.line(&format!("  on replica {}", n + 1))
                );
            }
        }
    }
    Ok(())
}
