//! `http-load`: a closed-loop HTTP load generator for any OpenAI- or Anthropic-compatible
//! endpoint (poolgate, LiteLLM, the fake upstream): fixed concurrency, POSTs a JSON body, reads
//! each response to its last byte; prints one line: rate, p50, p99, errors.
//!
//! ```text
//! http-load --url http://127.0.0.1:8080/v1/chat/completions --header 'authorization: Bearer K' \
//!   --body '{"model":"gpt-x","messages":[{"role":"user","content":"hi"}]}' --concurrency 16 --seconds 10
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::StreamExt;

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
}

async fn run(args: Args) -> Result<(), String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
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
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
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
                let ok = async {
                    let response = client
                        .post(&url)
                        .headers(headers.clone())
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
                    Some(())
                }
                .await;
                match ok {
                    Some(()) => micros.push(start.elapsed().as_micros() as u64),
                    None => errors += 1,
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
    let elapsed = started.elapsed().as_secs_f64();
    micros.sort_unstable();
    let percentile = |p: f64| {
        if micros.is_empty() {
            f64::NAN
        } else {
            micros[((micros.len() as f64 - 1.0) * p).round() as usize] as f64 / 1000.0
        }
    };
    println!(
        "{:<36} {:>9.1} req/s  p50 {:>8.3} ms  p99 {:>8.3} ms  ok {}  errors {}",
        args.label,
        micros.len() as f64 / elapsed,
        percentile(0.5),
        percentile(0.99),
        micros.len(),
        errors
    );
    Ok(())
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
