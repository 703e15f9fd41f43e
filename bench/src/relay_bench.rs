//! Relay benchmark: the same requests straight to the fake upstream and through the relay
//! (standalone, and distributed over real Redis and Postgres), non-streaming and streaming;
//! prints throughput, latency, the relay's added latency, and Redis round trips per request.
//!
//! ```text
//! cargo run --release -p poolgate-bench --bin relay-bench -- [--seconds 5] [--concurrency 32] [--rate 1000]
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::StreamExt;
use poolgate_bench::stats::{Sample, pace};
use poolgate_stack as stack;
use poolgate_testkit::fake_upstream::FakeUpstream;
use relay_svc::proxy::RelaySettings;

#[global_allocator]
static ALLOCATOR: poolgate_runtime::Allocator = poolgate_runtime::Allocator;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Offered requests/s for the open-loop added-latency phase (0 skips it).
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// Skip the distributed phases (they start a private Redis and Postgres).
    #[arg(long)]
    no_distributed: bool,
    /// Distributed: the client key has every limit set (a user RPM, concurrency, TPM and all four
    /// budgets, each far above what the run uses), so every request is governed by all of them.
    #[arg(long)]
    key_limits: bool,
    /// Distributed: the relay's lease channels toward admission (`--lease-channels`; 0: one
    /// `Lease` stream per lease, as before the channel).
    #[arg(long, default_value_t = relay_svc::remote::DEFAULT_LEASE_CHANNELS)]
    lease_channels: usize,
}

fn body(stream: bool) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"model": "claude-x", "max_tokens": 16, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}))
        .unwrap_or_default()
}

async fn one(client: &reqwest::Client, url: &str, key: &str, body: &[u8]) -> Option<u64> {
    let start = Instant::now();
    let response = client
        .post(url)
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        chunk.ok()?;
    }
    Some(start.elapsed().as_micros() as u64)
}

async fn closed_loop(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    stream: bool,
    args: &Args,
) -> Sample {
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    let body = Arc::new(body(stream));
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (client, url, key, body) =
            (client.clone(), url.to_owned(), key.to_owned(), body.clone());
        workers.push(tokio::spawn(async move {
            let mut micros = Vec::new();
            let mut errors = 0;
            while Instant::now() < deadline {
                match one(&client, &url, &key, &body).await {
                    Some(us) => micros.push(us),
                    None => errors += 1,
                }
            }
            (micros, errors)
        }));
    }
    let mut sample = Sample::default();
    for worker in workers {
        if let Ok((micros, errors)) = worker.await {
            sample.add(micros, errors);
        }
    }
    sample.elapsed = started.elapsed();
    sample
}

async fn open_loop(client: &reqwest::Client, url: &str, key: &str, args: &Args) -> Sample {
    let total = (f64::from(args.rate) * args.seconds) as u64;
    let interval = Duration::from_secs_f64(1.0 / f64::from(args.rate.max(1)));
    let started = Instant::now();
    let body = Arc::new(body(false));
    let (results, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    for n in 0..total {
        pace(started, interval, n).await;
        let (client, url, key, body, results) = (
            client.clone(),
            url.to_owned(),
            key.to_owned(),
            body.clone(),
            results.clone(),
        );
        tokio::spawn(async move {
            let _ = results.send(one(&client, &url, &key, &body).await);
        });
    }
    drop(results);
    let mut sample = Sample::default();
    while let Some(result) = receiver.recv().await {
        match result {
            Some(us) => sample.micros.push(us),
            None => sample.errors += 1,
        }
    }
    sample.elapsed = started.elapsed();
    sample
}

/// One line per phase; with the direct phase's (p50, p99), what the relay added to each.
fn print(name: &str, sample: &mut Sample, direct: Option<(f64, f64)>) {
    let added = direct
        .map(|(d50, d99)| {
            format!(
                "  added p50 {:>6.3} ms p99 {:>6.3} ms",
                sample.percentile(0.5) - d50,
                sample.percentile(0.99) - d99
            )
        })
        .unwrap_or_default();
    println!("{}{added}", sample.line(name));
}

fn yaml(base: &str) -> String {
    format!(
        "api_keys:\n  - {{key: bench-key, group: default, user: bench}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{base}\", api_key: k-a, concurrency: 64}}\n  - {{name: b, platform: anthropic, base_url: \"{base}\", api_key: k-b, concurrency: 64}}\nprices:\n  - {{model: claude-x, input: 3, output: 15}}\n"
    )
}

async fn run(args: Args) -> Result<(), String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let upstream = FakeUpstream::start().await.map_err(|e| e.to_string())?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())?;
    let direct_url = format!("{}/v1/messages", upstream.base_url);
    let (_standalone, standalone) = stack::standalone(
        &yaml(&upstream.base_url),
        RelaySettings::default(),
        Default::default(),
    )
    .await?;
    let standalone_url = format!("http://{standalone}/v1/messages");
    println!(
        "relay bench: concurrency {}, {} s per phase, fake upstream with no delay",
        args.concurrency, args.seconds
    );
    // Warm-up.
    let warm = Args {
        seconds: 0.3,
        ..Args::parse_from(["relay-bench"])
    };
    let _ = closed_loop(&client, &direct_url, "k-a", false, &warm).await;
    let _ = closed_loop(&client, &standalone_url, "bench-key", false, &warm).await;

    for stream in [false, true] {
        let kind = if stream { "streaming" } else { "non-streaming" };
        let mut direct = closed_loop(&client, &direct_url, "k-a", stream, &args).await;
        let reference = (direct.percentile(0.5), direct.percentile(0.99));
        print(&format!("direct to upstream, {kind}"), &mut direct, None);
        let mut relayed = closed_loop(&client, &standalone_url, "bench-key", stream, &args).await;
        print(
            &format!("relay standalone, {kind}"),
            &mut relayed,
            Some(reference),
        );
        println!(
            "  standalone / direct throughput: {:.1} % (goal >= 50 %)",
            100.0 * relayed.rate() / direct.rate()
        );
    }
    if args.rate > 0 {
        let mut direct = open_loop(&client, &direct_url, "k-a", &args).await;
        let reference = (direct.percentile(0.5), direct.percentile(0.99));
        print(
            &format!("direct, {} offered/s", args.rate),
            &mut direct,
            None,
        );
        let mut relayed = open_loop(&client, &standalone_url, "bench-key", &args).await;
        print(
            &format!("relay standalone, {} offered/s", args.rate),
            &mut relayed,
            Some(reference),
        );
    }
    if !args.no_distributed {
        distributed(&args, &client, &upstream).await?;
    }
    Ok(())
}

async fn distributed(
    args: &Args,
    client: &reqwest::Client,
    upstream: &FakeUpstream,
) -> Result<(), String> {
    let backends = stack::backends().await?;
    for name in ["a", "b"] {
        backends
            .store
            .upsert_account(&stack::account(name, &upstream.base_url, 64, 0))
            .await
            .map_err(|e| e.to_string())?;
    }
    let (_, key) = if args.key_limits {
        let usd = |amount: f64| (amount * 1_000_000.0) as i64;
        let limits = poolgate_core::lease::KeyLimits {
            api_key_id: 0,
            concurrency_limit: 10_000,
            tpm_limit: 1_000_000_000_000,
            budget_total_micros: usd(900_000.0),
            budget_day_micros: usd(900_000.0),
            budget_week_micros: usd(900_000.0),
            budget_month_micros: usd(900_000.0),
        };
        backends
            .store
            .create_api_key_with_limits(
                "bench",
                "bench",
                "default",
                10_000_000,
                &Default::default(),
                &limits,
            )
            .await
    } else {
        backends
            .store
            .create_api_key("bench", "bench", "default", 0)
            .await
    }
    .map_err(|e| e.to_string())?;
    if args.key_limits {
        println!("client key: user RPM, concurrency, TPM and four budgets set");
    }
    let (selector, selector_addr) = stack::selector(&backends).await?;
    let (admission, admission_addr) =
        stack::admission(&backends.redis.url(), Default::default()).await?;
    let (_, relay) = stack::relay_with_lease_channels(
        vec![format!("http://{selector_addr}")],
        vec![format!("http://{admission_addr}")],
        RelaySettings::default(),
        args.lease_channels,
    )
    .await?;
    println!("lease channels: {}", args.lease_channels);
    let url = format!("http://{relay}/v1/messages");
    let key = key.expose().to_owned();
    let warm = Args {
        seconds: 0.5,
        ..Args::parse_from(["relay-bench"])
    };
    let _ = closed_loop(client, &url, &key, false, &warm).await;
    // (admission's, the selector's): admission's acquire and release are on the request path;
    // the selector's reads (load and windows, behind a cache) and writes (reports, bindings,
    // usage) are not, and are reported apart.
    let trips = || {
        (
            admission
                .policy()
                .map(|p| p.redis_round_trips())
                .unwrap_or(0),
            selector.health.handle().round_trips(),
        )
    };
    let per_request = |before: (u64, u64), after: (u64, u64), requests: usize| {
        let requests = requests.max(1) as f64;
        (
            (after.0 - before.0) as f64 / requests,
            (after.1 - before.1) as f64 / requests,
        )
    };
    for stream in [false, true] {
        let kind = if stream { "streaming" } else { "non-streaming" };
        let (before, cpu) = (trips(), process_cpu());
        let mut sample = closed_loop(client, &url, &key, stream, args).await;
        let (admitting, selecting) = per_request(before, trips(), sample.micros.len());
        print(&format!("relay distributed, {kind}"), &mut sample, None);
        println!(
            "  Redis round trips per request: {:.2} = admission {admitting:.2} (request path) + selector {selecting:.3} (background)",
            admitting + selecting
        );
        print_cpu(cpu, sample.micros.len());
    }
    if args.rate > 0 {
        let (before, cpu) = (trips(), process_cpu());
        let mut sample = open_loop(client, &url, &key, args).await;
        let (admitting, selecting) = per_request(before, trips(), sample.micros.len());
        print(
            &format!("relay distributed, {} offered/s", args.rate),
            &mut sample,
            None,
        );
        println!(
            "  Redis round trips per request at {} req/s: {:.2} = admission {admitting:.2} (request path) + selector {selecting:.3} (background)",
            args.rate,
            admitting + selecting
        );
        print_cpu(cpu, sample.micros.len());
    }
    Ok(())
}

/// This process's CPU time so far (user + system, every thread) from `/proc/self/stat`, in
/// microseconds; 0 where it cannot be read. The kernel reports it in USER_HZ ticks (100 per
/// second on Linux whatever the kernel's own tick rate).
fn process_cpu() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // After the command name (which may hold spaces) in parentheses: field 3 on; utime and
    // stime are fields 14 and 15.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) * 10_000
}

/// The bench process's CPU per request since `before`: the load generator, the relay, the
/// selector, admission and the fake upstream (Redis and Postgres are processes of their own).
fn print_cpu(before: u64, requests: usize) {
    let spent = process_cpu().saturating_sub(before);
    println!(
        "  bench process CPU per request (client, relay, selector, admission, upstream): {} us",
        spent / requests.max(1) as u64
    );
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("relay-bench: {error}");
            ExitCode::FAILURE
        }
    }
}
