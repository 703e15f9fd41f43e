//! `http-load`: an HTTP load generator for any OpenAI- or Anthropic-compatible endpoint
//! (poolgate, LiteLLM, the fake upstream). POSTs a JSON body and reads each response to its last
//! byte. Closed loop by default (fixed concurrency: measures throughput); with `--rate` open loop
//! (requests start on a fixed schedule whatever the answers: measures latency at an offered
//! load, from each request's scheduled start, so a stalled server cannot hide its queueing; a
//! timer wake-up less than 1 ms late counts from the actual send); `--count` fixes the number of
//! requests an open loop sends (a fixed amount of work, for CPU per request).
//! Prints one line: rate, p50, p99, p99.9, errors; `--csv` prints
//! `label,offered,achieved,p50_ms,p99_ms,ok,errors,p999_ms` instead (the newest column last, so
//! scripts that cut the first seven keep working).
//!
//! ```text
//! http-load --url http://127.0.0.1:8080/v1/chat/completions --header 'authorization: Bearer K' \
//!   --body '{"model":"gpt-x","messages":[{"role":"user","content":"hi"}]}' --concurrency 16 --seconds 10
//! http-load ... --rate 500 --seconds 5 --csv
//! http-load ... --rate 1000 --count 20000 --csv
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::StreamExt;
use poolgate_bench::stats::Sample;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long)]
    url: String,
    /// `name: value`, repeatable.
    #[arg(long)]
    header: Vec<String>,
    #[arg(long)]
    body: String,
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// A label printed first on the result line.
    #[arg(long, default_value = "load")]
    label: String,
    /// Open loop: start this many requests per second (`--concurrency` is ignored).
    #[arg(long)]
    rate: Option<f64>,
    /// Open loop: send exactly this many requests (`--seconds` is then ignored).
    #[arg(long)]
    count: Option<u64>,
    /// Open loop: requests in flight at most; a request due beyond it counts as an error.
    #[arg(long, default_value_t = 4096)]
    max_in_flight: usize,
    /// Print a CSV line instead of the text line.
    #[arg(long)]
    csv: bool,
    /// A request unanswered after this many seconds counts as an error.
    #[arg(long, default_value_t = 30.0)]
    timeout_seconds: f64,
}

/// One request to its last byte; `false` on any failure or a non-2xx status.
async fn one(
    client: &reqwest::Client,
    url: &str,
    headers: &reqwest::header::HeaderMap,
    body: &[u8],
) -> bool {
    let Ok(response) = client
        .post(url)
        .headers(headers.clone())
        .body(body.to_vec())
        .send()
        .await
    else {
        return false;
    };
    if !response.status().is_success() {
        return false;
    }
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        if chunk.is_err() {
            return false;
        }
    }
    true
}

/// A timer wake-up this late is the timer's granularity, not a backlog.
const TIMER_SLACK: Duration = Duration::from_millis(1);

/// Open loop: starts requests at `rate` per second for `seconds`; latencies are measured from
/// each request's scheduled start.
async fn open_loop(
    client: reqwest::Client,
    args: &Args,
    rate: f64,
    headers: reqwest::header::HeaderMap,
    body: Arc<Vec<u8>>,
) -> (Vec<u64>, u64, Duration) {
    let total = args
        .count
        .unwrap_or_else(|| (rate * args.seconds).round().max(1.0) as u64);
    let interval = Duration::from_secs_f64(1.0 / rate);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(args.max_in_flight));
    let started = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut errors = 0u64;
    for n in 0..total {
        let due = started + interval.mul_f64(n as f64);
        tokio::time::sleep_until(due).await;
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            errors += 1;
            continue;
        };
        let (client, headers, body, url) = (
            client.clone(),
            headers.clone(),
            body.clone(),
            args.url.clone(),
        );
        // Latency counts from the scheduled start when the generator is behind (the server made
        // it wait), but not the timer's own lateness (tokio timers tick in milliseconds).
        let now = tokio::time::Instant::now();
        let start = if now.duration_since(due) <= TIMER_SLACK {
            now
        } else {
            due
        };
        tasks.spawn(async move {
            let ok = one(&client, &url, &headers, &body).await;
            drop(permit);
            ok.then(|| start.elapsed().as_micros() as u64)
        });
    }
    let mut micros = Vec::new();
    while let Some(result) = tasks.join_next().await {
        match result {
            Ok(Some(latency)) => micros.push(latency),
            _ => errors += 1,
        }
    }
    (micros, errors, started.elapsed())
}

fn positive_seconds(flag: &str, seconds: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{flag} {seconds}: must be a positive number of seconds"))
}

async fn run(args: Args) -> Result<(), String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
        .timeout(positive_seconds("--timeout-seconds", args.timeout_seconds)?)
        .build()
        .map_err(|e| e.to_string())?;
    let mut headers = reqwest::header::HeaderMap::new();
    for header in &args.header {
        let (name, value) = header
            .split_once(':')
            .ok_or_else(|| format!("--header {header:?}: expected name: value"))?;
        headers.insert(
            reqwest::header::HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|e| e.to_string())?,
            reqwest::header::HeaderValue::from_str(value.trim()).map_err(|e| e.to_string())?,
        );
    }
    headers.insert(
        reqwest::header::CONTENT_TYPE,
        reqwest::header::HeaderValue::from_static("application/json"),
    );
    let body = Arc::new(args.body.clone().into_bytes());
    if let Some(rate) = args.rate {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(format!("--rate {rate}: must be a positive number"));
        }
        if args.count == Some(0) {
            return Err("--count 0: must be at least 1".to_string());
        }
        if args.count.is_none() {
            positive_seconds("--seconds", args.seconds)?;
        }
        let (micros, errors, elapsed) = open_loop(client, &args, rate, headers, body).await;
        report(&args, Some(rate), micros, errors, elapsed);
        return Ok(());
    }
    let deadline = Instant::now() + positive_seconds("--seconds", args.seconds)?;
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (client, headers, body, url) = (
            client.clone(),
            headers.clone(),
            body.clone(),
            args.url.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut micros = Vec::new();
            let mut errors = 0u64;
            while Instant::now() < deadline {
                let start = Instant::now();
                if one(&client, &url, &headers, &body).await {
                    micros.push(start.elapsed().as_micros() as u64);
                } else {
                    errors += 1;
                }
            }
            (micros, errors)
        }));
    }
    let mut micros = Vec::new();
    let mut errors = 0;
    for worker in workers {
        if let Ok((m, e)) = worker.await {
            micros.extend(m);
            errors += e;
        }
    }
    report(&args, None, micros, errors, started.elapsed());
    Ok(())
}

fn report(args: &Args, offered: Option<f64>, micros: Vec<u64>, errors: u64, elapsed: Duration) {
    let mut sample = Sample::new(micros, errors, elapsed);
    let (p50, p99, p999) = (
        sample.percentile(0.5),
        sample.percentile(0.99),
        sample.percentile(0.999),
    );
    let (achieved, ok) = (sample.rate(), sample.micros.len());
    if args.csv {
        println!(
            "{},{},{achieved:.1},{p50:.3},{p99:.3},{ok},{errors},{p999:.3}",
            args.label,
            offered.map(|r| format!("{r}")).unwrap_or_default(),
        );
        return;
    }
    println!(
        "{:<36} {achieved:>9.1} req/s  p50 {p50:>8.3} ms  p99 {p99:>8.3} ms  p99.9 {p999:>8.3} ms  ok {ok}  errors {errors}",
        args.label,
    );
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("http-load: {error}");
            ExitCode::FAILURE
        }
    }
}
