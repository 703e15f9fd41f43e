//! `relay-svc admin …`: the operator CLI, a client of a running standalone relay's admin
//! endpoint (`poolgate_operator::http`). Its flags and its one entry point live here alone, so the
//! operator CLI can be replaced in one place.

use std::path::PathBuf;
use std::process::ExitCode;

use poolgate_runtime::secret_flags::SecretFlag;

use poolgate_operator::Verb;
use poolgate_operator::http::HttpAdmin;
use poolgate_operator::signin::{SignInVerb, Terminal};

/// The `admin` subcommand's flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The admin endpoint.
    #[arg(long, env = "RELAY_ADMIN_URL", default_value = "http://127.0.0.1:9464")]
    pub url: String,
    /// The admin token (visible to every local user on the command line: prefer
    /// --token-file).
    #[arg(long, env = "RELAY_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the admin token (a trailing newline is ignored).
    #[arg(long, env = "RELAY_ADMIN_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    #[command(subcommand)]
    pub verb: AdminVerb,
}

/// The read and repair verbs, and the sign-in and import verbs.
#[derive(Debug, clap::Subcommand)]
pub enum AdminVerb {
    #[command(flatten)]
    Verb(Verb),
    #[command(flatten)]
    SignIn(SignInVerb),
}

/// Runs one verb and prints its JSON answer. Exit codes: 2 for a missing or unreadable token, 1
/// when the endpoint refused or could not be reached. `token_on_command_line`: `--token` came
/// from the command line (it earns a warning), not from its environment variable.
pub async fn execute(args: &Args, token_on_command_line: bool) -> ExitCode {
    // No telemetry here: the verb's answer is the output, warnings go to stderr.
    let flag = SecretFlag {
        flag: "--token",
        value: args.token.as_deref(),
        on_command_line: token_on_command_line,
        file: args.token_file.as_deref(),
    };
    if let Some(warning) = flag.warning() {
        eprintln!("relay-svc admin: warning: {warning}");
    }
    let token = match flag.read() {
        Ok(Some(token)) => token,
        Ok(None) => {
            eprintln!("relay-svc admin: --token-file (or RELAY_ADMIN_TOKEN) is required");
            return ExitCode::from(2);
        }
        Err(message) => {
            eprintln!("relay-svc admin: {message}");
            return ExitCode::from(2);
        }
    };
    let endpoint = match HttpAdmin::new(&args.url, &token) {
        Ok(endpoint) => endpoint,
        Err(error) => {
            eprintln!("relay-svc admin: {error}");
            return ExitCode::from(error.exit_code());
        }
    };
    match &args.verb {
        AdminVerb::Verb(verb) => poolgate_operator::run("relay-svc admin", &endpoint, verb).await,
        AdminVerb::SignIn(verb) => {
            poolgate_operator::signin::run("relay-svc admin", &endpoint, verb, &mut Terminal).await
        }
    }
}
