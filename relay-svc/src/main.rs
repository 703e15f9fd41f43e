//! The relay-svc binary: flags → telemetry → listeners → [`relay_svc::run`]. A configuration
//! that cannot run exits 2 (as clap does for a bad flag), a failure while running 1.

use std::process::ExitCode;

use relay_svc::cli::{self, Cli, Command};
use relay_svc::run::{Listeners, RunError};

#[global_allocator]
static ALLOCATOR: poolgate_runtime::Allocator = poolgate_runtime::Allocator;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse_noting_secrets();
    if let Some(Command::Admin(args)) = &cli.command {
        return relay_svc::admin_client::execute(args, cli.on_command_line.admin_verb_token).await;
    }
    let _telemetry = poolgate_rpc::telemetry::init("relay-svc", cli.log_format.as_str());
    match serve(&cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("relay-svc: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

async fn serve(cli: &Cli) -> Result<(), RunError> {
    let config = cli::config(cli).map_err(RunError::Config)?;
    let addresses = cli::addresses(cli, &config).map_err(RunError::Config)?;
    let listeners = Listeners::bind(&addresses, &config).await?;
    relay_svc::run(config, listeners, poolgate_runtime::shutdown::signal()).await
}
