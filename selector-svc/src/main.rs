//! The selector-svc binary: flags (`cli`) → telemetry → `selector_svc::server::run`; `migrate`,
//! `reencrypt` and `genkey` for the database and the keys; `admin`, the operator CLI
//! (`admin_cli`). A configuration that cannot run exits 2 (as clap does for a bad flag), a
//! failure while running 1.

mod admin_cli;
mod cli;

use std::process::ExitCode;

use poolgate_rpc::exit::{Failure, report};
use poolgate_select::crypto::Keyring;
use selector_svc::store::{PostgresSource, SchemaStatus};

use crate::cli::{Cli, Command, DatabaseArgs, ServeArgs};

#[global_allocator]
static ALLOCATOR: poolgate_runtime::Allocator = poolgate_runtime::Allocator;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse_noting_secrets();
    let result = match &cli.command {
        None => serve(&cli.serve).await,
        Some(Command::Serve(args)) => serve(args).await,
        Some(Command::Migrate(args)) => migrate(args).await,
        Some(Command::Reencrypt(args)) => reencrypt(args).await,
        Some(Command::Genkey) => {
            println!("{}", Keyring::generate_key());
            Ok(())
        }
        Some(Command::Admin(args)) => return admin_cli::run(args).await,
    };
    report("selector-svc", result)
}

async fn serve(args: &ServeArgs) -> Result<(), Failure> {
    let _telemetry =
        poolgate_rpc::telemetry::init("selector-svc", args.database.log_format.as_str());
    let config = args.config().map_err(Failure::Config)?;
    let bind = |addr, what: &'static str| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Failure::Runtime(format!("cannot listen on {addr}{what}: {e}")))
    };
    let listener = bind(args.listen, "").await?;
    let metrics = bind(args.metrics_listen, " (metrics)").await?;
    tracing::info!(addr = %args.listen, "selector serving");
    selector_svc::server::run(
        config,
        listener,
        Some(metrics),
        poolgate_runtime::shutdown::signal(),
    )
    .await
    .map_err(|e| Failure::Runtime(e.to_string()))
}

/// The store `migrate` and `reencrypt` work on.
async fn store(args: &DatabaseArgs) -> Result<PostgresSource, Failure> {
    let url = args.database_url().map_err(Failure::Config)?;
    let keyring = args.keyring().map_err(Failure::Config)?;
    PostgresSource::connect(&url, std::sync::Arc::new(keyring))
        .await
        .map_err(|e| Failure::Runtime(e.to_string()))
}

async fn migrate(args: &DatabaseArgs) -> Result<(), Failure> {
    let _telemetry = poolgate_rpc::telemetry::init("selector-svc", args.log_format.as_str());
    let store = store(args).await?;
    let status = store
        .migrate()
        .await
        .map_err(|e| Failure::Runtime(e.to_string()))?;
    match status {
        SchemaStatus::Current { version } => {
            println!("migrations applied (schema version {version})")
        }
        SchemaStatus::Newer {
            found,
            known,
            oldest_release,
        } => println!(
            "schema version {found} is newer than this build's {known} and runs releases from \
             {oldest_release} on: nothing applied"
        ),
    }
    Ok(())
}

async fn reencrypt(args: &DatabaseArgs) -> Result<(), Failure> {
    let _telemetry = poolgate_rpc::telemetry::init("selector-svc", args.log_format.as_str());
    let store = store(args).await?;
    let report = store
        .reencrypt_all()
        .await
        .map_err(|e| Failure::Runtime(e.to_string()))?;
    println!(
        "upgraded={}\talready_current={}\tchanged_meanwhile={}\tunreadable={}",
        report.upgraded, report.already_current, report.changed_meanwhile, report.unreadable
    );
    // A row changed meanwhile was rewritten by its writer (a refresh, an admin update) in that
    // writer's form; a second run checks it. Unreadable rows exit 2 (docs/SECURITY.md): most
    // often a key missing from the ring, which is the configuration's to fix.
    if report.unreadable > 0 {
        return Err(Failure::Config(format!(
            "{} account(s) could not be decrypted and were left as they are (see the log for \
             their ids; is the key ring complete?)",
            report.unreadable
        )));
    }
    Ok(())
}
