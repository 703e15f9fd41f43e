//! Selector benchmark: selects per second and latency over gRPC for a 1 000-account pool with a
//! warm load cache, and Redis round trips and commands per select at a fixed 1 000 selects/s.
//!
//! ```text
//! cargo run --release -p poolgate-bench --bin selector-bench -- [--accounts 1000] [--seconds 5]
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use poolgate_core::account::{CredentialKind, Platform, Secret};
use poolgate_proto::selector::v1 as pb;
use poolgate_proto::selector::v1::selector_client::SelectorClient;
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use selector_svc::crypto::Keyring;
use selector_svc::store::{AccountInput, ConfigStore};

/// The service token the bench's servers require and their clients send.
const BENCH_TOKEN: &str = "bench-service-token";

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

fn percentile(micros: &mut [u64], p: f64) -> f64 {
    if micros.is_empty() {
        return f64::NAN;
    }
    micros.sort_unstable();
    micros[((micros.len() as f64 - 1.0) * p).round() as usize] as f64 / 1000.0
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
    let (postgres, redis) = tokio::join!(
        poolgate_testkit::PostgresServer::start(),
        poolgate_testkit::RedisServer::start()
    );
    let (postgres, redis) = (postgres?, redis?);
    let keyring = Keyring::parse(&format!("k1:{}", Keyring::generate_key()), None)
        .map_err(|e| e.to_string())?;
    let store = ConfigStore::connect(&postgres.url(), Arc::new(keyring.clone()))
        .await
        .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;
    for n in 0..args.accounts {
        store
            .upsert_account(&AccountInput {
                name: format!("acct-{n}"),
                group: "bench".into(),
                platform: Platform::Anthropic,
                base_url: "http://127.0.0.1:9".into(),
                credential_kind: CredentialKind::ApiKey,
                credential: Some(Secret::new(format!("sk-{n}"))),
                oauth: None,
                priority: (n % 3) as i32,
                weight: 1 + (n % 5) as i32,
                concurrency_limit: 10,
                rpm_limit: 0,
                session_window_limit_usd: 0.0,
                allowed_models: vec![],
                model_mapping: Default::default(),
                proxy_url: None,
                probe_model: None,
                stream_usage: true,
            })
            .await
            .map_err(|e| e.to_string())?;
    }
    let config = selector_svc::server::Config {
        database_url: postgres.url(),
        redis_target: RedisTarget::Single(redis.url()),
        redis_options: RedisOptions::default(),
        keyring,
        admin_token: None,
        settings: Default::default(),
        refresh: Default::default(),
        reload_interval: Duration::from_secs(3600),
        refresh_interval: Duration::from_secs(3600),
        max_concurrent_streams: 100_000,
        tls: None,
        callers: poolgate_runtime::service_auth::CallerCheck::Token(BENCH_TOKEN.into()),
    };
    let built = selector_svc::server::build(&config, selector_svc::metrics::Metrics::new())
        .await
        .map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let serving = built.serving();
    let serve_config = config.clone();
    tokio::spawn(async move {
        let _ = selector_svc::server::serve_selector(
            serving,
            &serve_config,
            listener,
            None,
            std::future::pending(),
        )
        .await;
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let client = SelectorClient::new(poolgate_runtime::service_auth::WithToken::new(
        channel,
        Some(BENCH_TOKEN),
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
    let mut micros = Vec::new();
    for worker in workers {
        micros.extend(worker.await.unwrap_or_default());
    }
    let elapsed = started.elapsed().as_secs_f64();
    let count = micros.len();
    println!(
        "selects, closed loop (warm cache)        {:>8.0}/s  p50 {:>6.3} ms  p99 {:>6.3} ms",
        count as f64 / elapsed,
        percentile(&mut micros, 0.5),
        percentile(&mut micros, 0.99)
    );

    let trips_before = built.health.handle().round_trips();
    let commands_before = commands(&redis).await;
    let total = (f64::from(args.rate) * args.seconds) as u64;
    let interval = Duration::from_secs_f64(1.0 / f64::from(args.rate.max(1)));
    let started = Instant::now();
    let (results, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    for n in 0..total {
        let due = started + interval.mul_f64(n as f64);
        let now = Instant::now();
        if due > now {
            tokio::time::sleep(due - now).await;
        }
        let (mut client, results) = (client.clone(), results.clone());
        tokio::spawn(async move {
            let start = Instant::now();
            let ok = client.select(request()).await.is_ok();
            let _ = results.send(ok.then(|| start.elapsed().as_micros() as u64));
        });
    }
    drop(results);
    let mut micros = Vec::new();
    while let Some(result) = receiver.recv().await {
        micros.extend(result);
    }
    let selects = micros.len().max(1) as f64;
    let trips = built.health.handle().round_trips() - trips_before;
    // Minus the INFO call itself.
    let commands = commands(&redis).await.saturating_sub(commands_before + 1);
    println!(
        "selects at {} offered/s                 {:>8.0}/s  p50 {:>6.3} ms  p99 {:>6.3} ms",
        args.rate,
        selects / started.elapsed().as_secs_f64(),
        percentile(&mut micros, 0.5),
        percentile(&mut micros, 0.99)
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
