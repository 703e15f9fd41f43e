//! Selector benchmark: selects per second and latency over gRPC for a 1 000-account pool with a
//! warm load cache, and Redis round trips and commands per select at a fixed 1 000 selects/s.
//!
//! ```text
//! cargo run --release -p poolgate-bench --bin selector-bench -- [--accounts 1000] [--seconds 5]
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use poolgate_bench::stats::{Sample, pace};
use poolgate_proto::selector::v1 as pb;
use poolgate_proto::selector::v1::selector_client::SelectorClient;
use poolgate_stack as stack;
use selector_svc::store::AccountInput;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    accounts: usize,
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    #[arg(long, default_value_t = 1000)]
    rate: u32,
}

/// Account `n` of the pool, in group `bench`: three priority tiers, weights 1 to 5.
async fn store_account(backends: &stack::Backends, name: &str, n: usize) -> Result<(), String> {
    let account = AccountInput {
        group: "bench".into(),
        priority: (n % 3) as i32,
        weight: 1 + (n % 5) as i32,
        ..stack::account(name, "http://127.0.0.1:9", 10, 0)
    };
    backends
        .store
        .upsert_account(&account)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn request() -> pb::SelectRequest {
    pb::SelectRequest {
        group: "bench".into(),
        platform: pb::Platform::Anthropic as i32,
        model: "claude-x".into(),
        ..Default::default()
    }
}

async fn commands(redis: &poolgate_testkit::RedisServer) -> u64 {
    let Ok(mut conn) = redis.client().await else {
        return 0;
    };
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    info.lines()
        .filter_map(|line| line.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
}

async fn run(args: Args) -> Result<(), String> {
    let backends = stack::backends().await?;
    for n in 0..args.accounts {
        let name = format!("acct-{n}");
        store_account(&backends, &name, n).await?;
    }
    let (built, addr) = stack::selector(&backends).await?;
    let redis = &backends.redis;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let client = SelectorClient::new(poolgate_rpc::service_auth::WithToken::new(
        channel,
        Some(stack::SERVICE_TOKEN),
    ));
    let _ = client.clone().select(request()).await;

    println!(
        "selector bench: {} accounts in one group, concurrency {}, {} s per phase",
        args.accounts, args.concurrency, args.seconds
    );
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let mut client = client.clone();
        workers.push(tokio::spawn(async move {
            let mut micros = Vec::new();
            while Instant::now() < deadline {
                let start = Instant::now();
                if client.select(request()).await.is_ok() {
                    micros.push(start.elapsed().as_micros() as u64);
                }
            }
            micros
        }));
    }
    let mut closed = Sample::default();
    for worker in workers {
        closed.add(worker.await.unwrap_or_default(), 0);
    }
    closed.elapsed = started.elapsed();
    println!(
        "selects, closed loop (warm cache)        {:>8.0}/s  p50 {:>6.3} ms  p99 {:>6.3} ms",
        closed.rate(),
        closed.percentile(0.5),
        closed.percentile(0.99)
    );

    let trips_before = built.health.handle().round_trips();
    let commands_before = commands(redis).await;
    let total = (f64::from(args.rate) * args.seconds) as u64;
    let interval = Duration::from_secs_f64(1.0 / f64::from(args.rate.max(1)));
    let started = Instant::now();
    let (results, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    for n in 0..total {
        pace(started, interval, n).await;
        let (mut client, results) = (client.clone(), results.clone());
        tokio::spawn(async move {
            let start = Instant::now();
            let ok = client.select(request()).await.is_ok();
            let _ = results.send(ok.then(|| start.elapsed().as_micros() as u64));
        });
    }
    drop(results);
    let mut open = Sample::default();
    while let Some(result) = receiver.recv().await {
        open.micros.extend(result);
    }
    open.elapsed = started.elapsed();
    let selects = open.micros.len().max(1) as f64;
    let trips = built.health.handle().round_trips() - trips_before;
    // Minus the INFO call itself.
    let commands = commands(redis).await.saturating_sub(commands_before + 1);
    println!(
        "selects at {} offered/s                 {:>8.0}/s  p50 {:>6.3} ms  p99 {:>6.3} ms",
        args.rate,
        open.rate(),
        open.percentile(0.5),
        open.percentile(0.99)
    );
    println!(
        "Redis per select at {} selects/s: {:.3} round trips, {:.2} commands ({} trips, {} commands in {:.1} s; one fetch of {} accounts is {} pipelines)",
        args.rate,
        trips as f64 / selects,
        commands as f64 / selects,
        trips,
        commands,
        started.elapsed().as_secs_f64(),
        args.accounts,
        args.accounts.div_ceil(50)
    );
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("selector-bench: {error}");
            ExitCode::FAILURE
        }
    }
}
