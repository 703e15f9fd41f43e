//! Selector benchmark: selects per second and latency over gRPC for a 1 000-account pool with a
//! warm load cache (closed loop), then an open loop at a fixed rate (1 000 selects/s): p50, p99
//! and p99.9 counted from when each select was due, not from when it was sent, so a stalled
//! sender or a stalled selector shows as latency; and Redis round trips and commands per select.
//!
//! ```text
//! cargo run --release -p poolgate-bench --bin selector-bench -- [--accounts 1000] [--seconds 5]
//!     [--closed-seconds 5] [--rate 1000] [--stale-periods 3] [--pause-ms 0]
//! ```
//!
//! The selector runs in this process (on the allocator the selector binary uses): profile it with
//! `perf record -g -p <pid>` during the pause `--pause-ms` leaves before the open loop (the pid is
//! printed).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use poolgate_bench::stats::{Sample, pace};
use poolgate_proto::selector::v1 as pb;
use poolgate_proto::selector::v1::selector_client::SelectorClient;
use poolgate_rpc::service_auth::WithToken;
use poolgate_stack as stack;
use selector_svc::store::AccountInput;

#[global_allocator]
static ALLOCATOR: poolgate_runtime::Allocator = poolgate_runtime::Allocator;

#[derive(Debug, Parser)]
struct Args {
    /// Accounts in the one group every select asks for.
    #[arg(long, default_value_t = 1000)]
    accounts: usize,
    /// Length of the open loop.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Length of the closed loop (0: skipped).
    #[arg(long)]
    closed_seconds: Option<f64>,
    /// Concurrent clients of the closed loop.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Selects offered per second in the open loop.
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// Load-cache periods a reading is served stale while one fetch replaces it (1: never).
    #[arg(long, default_value_t = poolgate_select::load_cache::LoadCacheSettings::default().stale_periods)]
    stale_periods: u32,
    /// Waits this long before the open loop (time to attach a profiler).
    #[arg(long, default_value_t = 0)]
    pause_ms: u64,
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

type Client = SelectorClient<WithToken<tonic::transport::Channel>>;

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
    let mut settings = poolgate_select::engine::SelectorSettings::default();
    settings.load_cache.stale_periods = args.stale_periods;
    let (built, addr) = stack::selector_with(&backends, settings).await?;
    let redis = &backends.redis;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let client: Client = SelectorClient::new(WithToken::new(channel, Some(stack::SERVICE_TOKEN)));
    let _ = client.clone().select(request()).await;

    println!(
        "selector bench: {} accounts in one group; stale periods {}; closed loop {} clients {} s; open loop {} selects/s {} s; pid {}",
        args.accounts,
        args.stale_periods,
        args.concurrency,
        args.closed_seconds.unwrap_or(args.seconds),
        args.rate,
        args.seconds,
        std::process::id()
    );
    let closed_seconds = args.closed_seconds.unwrap_or(args.seconds);
    if closed_seconds > 0.0 {
        let mut closed = closed_loop(&client, args.concurrency, closed_seconds).await;
        println!(
            "{}",
            summary("selects, closed loop (warm cache)", &mut closed)
        );
    }
    if args.pause_ms > 0 {
        tokio::time::sleep(Duration::from_millis(args.pause_ms)).await;
    }

    let trips_before = built.health.handle().round_trips();
    let commands_before = commands(redis).await;
    let started = Instant::now();
    let cpu_before = process_cpu();
    let mut open = open_loop(&client, args.rate, args.seconds).await;
    let cpu = process_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    let label = format!("selects at {} offered/s (from due time)", args.rate);
    println!("{}", summary(&label, &mut open));
    if let Some(cpu) = cpu {
        println!(
            "CPU of this process (selector and client) per select at {} selects/s: {:.0} µs",
            args.rate,
            cpu.as_secs_f64() * 1e6 / (open.micros.len().max(1) as f64)
        );
    }
    let selects = open.micros.len().max(1) as f64;
    let trips = built.health.handle().round_trips() - trips_before;
    // Minus the INFO call itself.
    let commands = commands(redis).await.saturating_sub(commands_before + 1);
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

/// `concurrency` clients each sending the next select when the last one is answered.
async fn closed_loop(client: &Client, concurrency: usize, seconds: f64) -> Sample {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let mut client = client.clone();
        workers.push(tokio::spawn(async move {
            let (mut micros, mut errors) = (Vec::new(), 0);
            while Instant::now() < deadline {
                let start = Instant::now();
                match client.select(request()).await {
                    Ok(_) => micros.push(start.elapsed().as_micros() as u64),
                    Err(_) => errors += 1,
                }
            }
            (micros, errors)
        }));
    }
    let mut closed = Sample::default();
    for worker in workers {
        let (micros, errors) = worker.await.unwrap_or_default();
        closed.add(micros, errors);
    }
    closed.elapsed = started.elapsed();
    closed
}

/// One select due every `1 / rate` s for `seconds`, each sent on its own task; its latency runs
/// from when it was due (a sender that falls behind counts against the select, as it would for a
/// client on a schedule), not from when it was sent.
async fn open_loop(client: &Client, rate: u32, seconds: f64) -> Sample {
    let total = (f64::from(rate) * seconds) as u64;
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let started = Instant::now();
    let (results, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    for n in 0..total {
        pace(started, interval, n).await;
        let due = started + interval.mul_f64(n as f64);
        let (mut client, results) = (client.clone(), results.clone());
        tokio::spawn(async move {
            let ok = client.select(request()).await.is_ok();
            let _ = results.send(ok.then(|| due.elapsed().as_micros() as u64));
        });
    }
    drop(results);
    let mut open = Sample::default();
    while let Some(result) = receiver.recv().await {
        match result {
            Some(micros) => open.micros.push(micros),
            None => open.errors += 1,
        }
    }
    open.elapsed = started.elapsed();
    open
}

/// utime + stime of this process (`/proc/self/stat`, in clock ticks of 10 ms); `None` off Linux.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces), from field 3 on.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// One line: rate, p50, p99, p99.9, failures.
fn summary(name: &str, sample: &mut Sample) -> String {
    let (p50, p99, p999) = (
        sample.percentile(0.5),
        sample.percentile(0.99),
        sample.percentile(0.999),
    );
    format!(
        "{name:<42} {:>8.0}/s  p50 {p50:>6.3} ms  p99 {p99:>6.3} ms  p99.9 {p999:>6.3} ms  errors {}",
        sample.rate(),
        sample.errors
    )
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
