//! The admission-svc binary: flags (with env fallbacks, `cli.rs`) → config →
//! `admission_svc::run`. A bad configuration exits 2 (as clap does for a bad flag), a failure
//! while running 1.

mod cli;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use cli::Cli;
use poolgate_rpc::exit::{Failure, report};

#[global_allocator]
static ALLOCATOR: poolgate_runtime::Allocator = poolgate_runtime::Allocator;

#[tokio::main]
async fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    cli.service_token_on_command_line =
        matches.value_source("service_token") == Some(clap::parser::ValueSource::CommandLine);
    let _telemetry = poolgate_rpc::telemetry::init("admission-svc", cli.log_format.as_str());
    report("admission-svc", serve(&cli).await)
}

async fn serve(cli: &Cli) -> Result<(), Failure> {
    let config = cli.config().map_err(Failure::Config)?;
    let listener = bind(cli.listen, "").await?;
    let metrics_listener = bind(cli.metrics_listen, " (metrics)").await?;
    let shutdown = poolgate_runtime::shutdown::signal();
    admission_svc::run(config, listener, Some(metrics_listener), shutdown)
        .await
        .map_err(|e| Failure::Runtime(e.to_string()))
}

async fn bind(addr: SocketAddr, what: &str) -> Result<tokio::net::TcpListener, Failure> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::Runtime(format!("cannot listen on {addr}{what}: {e}")))
}
