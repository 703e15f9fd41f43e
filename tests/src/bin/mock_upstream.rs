//! `mock-upstream`: the project's fake LLM server as a process (Anthropic and OpenAI APIs, SSE
//! with usage, per-credential scripts and concurrency peaks; see `poolgate_testkit::fake_upstream`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use poolgate_testkit::fake_upstream::FakeUpstream;

/// A fake upstream LLM server for demos, tests and benchmarks.
#[derive(Debug, Parser)]
struct Cli {
    #[arg(long, env = "MOCK_UPSTREAM_LISTEN", default_value = "127.0.0.1:9100")]
    listen: SocketAddr,
    /// Simulated model latency before each answer, ms.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Pause between stream events, ms.
    #[arg(long, default_value_t = 0)]
    chunk_delay_ms: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let upstream = match FakeUpstream::start_on(cli.listen).await {
        Ok(upstream) => upstream,
        Err(error) => {
            eprintln!("mock-upstream: cannot listen on {}: {error}", cli.listen);
            return ExitCode::from(1);
        }
    };
    upstream.set_delay(Duration::from_millis(cli.delay_ms));
    upstream.set_chunk_delay(Duration::from_millis(cli.chunk_delay_ms));
    eprintln!("mock-upstream: serving on {}", upstream.base_url);
    let _ = tokio::signal::ctrl_c().await;
    ExitCode::SUCCESS
}
