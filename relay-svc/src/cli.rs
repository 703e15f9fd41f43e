//! The relay's flags (each with an environment fallback) and what they make: the run
//! configuration and the addresses to listen on. A value that cannot run is an error naming its
//! flag.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use poolgate_core::account::Secret;
pub use poolgate_rpc::telemetry::LogFormat;
use poolgate_runtime::secret_flags::SecretFlag;

use crate::proxy::{EdgeSettings, RelaySettings};
use crate::run::{self, Addresses};
use crate::server::{self, Mode};
use crate::standalone::StandaloneFile;
use poolgate_core::lease::Weekday;

/// poolgate relay: an Anthropic- and OpenAI-compatible endpoint over pooled upstream accounts.
#[derive(Debug, Parser)]
#[command(version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// HTTP listen address (default: the config file's `listen`, else 127.0.0.1:8080).
    #[arg(long, env = "RELAY_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Run everything in this process (memory backends, accounts from --config).
    #[arg(long, env = "RELAY_STANDALONE")]
    pub standalone: bool,
    /// YAML config for --standalone: accounts, API keys, prices (see examples/standalone.yaml).
    #[arg(long, alias = "accounts", env = "RELAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// --standalone: where refreshed OAuth tokens, retirements and the usage ledger are kept
    /// across restarts (default: `<config>.state.json` beside --config when its directory is
    /// writable).
    #[arg(long, env = "RELAY_STATE_FILE")]
    pub state_file: Option<PathBuf>,
    /// --standalone: the admin endpoint's address (accounts, blocks, windows, restore,
    /// clear-block, usage); it runs only with --admin-token.
    #[arg(long, env = "RELAY_ADMIN_LISTEN", default_value = "127.0.0.1:9464")]
    pub admin_listen: SocketAddr,
    /// --standalone: the token the admin endpoint requires (`Authorization: Bearer …`). On the
    /// command line it is visible to every local user: prefer --admin-token-file.
    #[arg(long, env = "RELAY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A file holding the admin token (a trailing newline is ignored).
    #[arg(long, env = "RELAY_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// --standalone: the time zone of client keys' calendar budgets (day, week, month), an IANA
    /// name (distributed: admission's and the selector's flag of the same name).
    #[arg(long, env = "ADMISSION_BUDGET_TIME_ZONE", default_value = "UTC")]
    pub budget_time_zone: String,
    /// --standalone: the first day of a budget week (`monday` … `sunday`).
    #[arg(long, env = "ADMISSION_BUDGET_WEEK_START", default_value = "monday", value_parser = Weekday::parse)]
    pub budget_week_start: Weekday,
    /// Largest request body accepted, bytes.
    #[arg(long, env = "RELAY_MAX_BODY_BYTES", default_value_t = 32 << 20)]
    pub max_body_bytes: usize,
    /// Request body bytes held across all connections at once; past it, 503 in the client's
    /// format.
    #[arg(long, env = "RELAY_MAX_BUFFERED_BYTES", default_value_t = 512 << 20)]
    pub max_buffered_bytes: usize,
    /// Longest wait for a request's headers, ms (HTTP/1).
    #[arg(long, env = "RELAY_HEADER_READ_TIMEOUT_MS", default_value_t = 20_000)]
    pub header_read_timeout_ms: u64,
    /// Longest pause between two chunks of a request body, ms; past it, 408 and the connection
    /// closed.
    #[arg(long, env = "RELAY_BODY_IDLE_TIMEOUT_MS", default_value_t = 30_000)]
    pub body_idle_timeout_ms: u64,
    /// After the first --body-rate-grace-ms, a body must average at least this many bytes per
    /// second (slower: 408 and the connection closed).
    #[arg(long, env = "RELAY_BODY_MIN_RATE", default_value_t = 16 << 10)]
    pub body_min_rate: u64,
    #[arg(long, env = "RELAY_BODY_RATE_GRACE_MS", default_value_t = 10_000)]
    pub body_rate_grace_ms: u64,
    /// HTTP/2 streams per client connection.
    #[arg(long, env = "RELAY_H2_MAX_STREAMS", default_value_t = 128)]
    pub h2_max_streams: u32,
    /// Selector gRPC endpoints, comma-separated (one per replica).
    #[arg(long, env = "RELAY_SELECTOR_URL", value_delimiter = ',')]
    pub selector_url: Vec<String>,
    /// Admission gRPC endpoints, comma-separated (one per replica).
    #[arg(long, env = "RELAY_ADMISSION_URL", value_delimiter = ',')]
    pub admission_url: Vec<String>,
    /// Prometheus `/metrics` listen address (its own port, off the client port).
    #[arg(long, env = "RELAY_METRICS_LISTEN", default_value = "127.0.0.1:9463")]
    pub metrics_listen: SocketAddr,
    /// PEM CA of the selector's and admission's TLS certificates; use https:// endpoint URLs.
    #[arg(long, env = "RELAY_GRPC_TLS_CA")]
    pub grpc_tls_ca: Option<PathBuf>,
    /// PEM client certificate for selector and admission servers that require mutual TLS
    /// (with --grpc-tls-key).
    #[arg(long, env = "RELAY_GRPC_TLS_CERT", requires = "grpc_tls_key")]
    pub grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of --grpc-tls-cert.
    #[arg(long, env = "RELAY_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    pub grpc_tls_key: Option<PathBuf>,
    /// The service token sent to the selector and admission in the `x-poolgate-service-token`
    /// metadata key. On the command line it is visible to every local user: prefer
    /// --service-token-file.
    #[arg(long, env = "POOLGATE_SERVICE_TOKEN", hide_env_values = true)]
    pub service_token: Option<String>,
    /// A file holding the service token (a trailing newline is ignored).
    #[arg(long, env = "POOLGATE_SERVICE_TOKEN_FILE")]
    pub service_token_file: Option<PathBuf>,
    /// Lease channels toward admission: leases multiplexed on this many gRPC streams, spread over
    /// admission's replicas (each gets N / replicas rounded up, at least one). 0: one stream per
    /// lease (also what the relay falls back to when admission does not serve the channel).
    #[arg(long, env = "RELAY_LEASE_CHANNELS", default_value_t = crate::remote::DEFAULT_LEASE_CHANNELS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=64))]
    pub lease_channels: usize,
    /// Serve the Responses API over a WebSocket on `GET /v1/responses` (Codex's transport);
    /// `false`: the upgrade is answered 426, on which Codex uses HTTP.
    #[arg(long, env = "RELAY_RESPONSES_WEBSOCKET", default_value_t = true, action = clap::ArgAction::Set)]
    pub responses_websocket: bool,
    /// A Responses WebSocket with no message for this long is closed, seconds.
    #[arg(long, env = "RELAY_SOCKET_IDLE_SECS", default_value_t = 1800, value_parser = clap::value_parser!(u64).range(10..=86_400))]
    pub socket_idle_secs: u64,
    /// Responses WebSockets one client key may hold open, across the relays (counted by
    /// admission; this relay's own count where admission cannot answer).
    #[arg(long, env = "RELAY_SOCKETS_PER_KEY", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub sockets_per_key: u64,
    /// Select in the relay's process over the view the selector streams (docs/DESIGN.md §2,
    /// "Selection at the edge"); `false`: ask the selector for every plan, as releases before
    /// 0.2 did.
    #[arg(long, env = "RELAY_EDGE_SELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub edge_selection: bool,
    /// The groups this relay serves: its view holds only their accounts and client keys, and a
    /// key of another group is unknown here. Empty: every group.
    #[arg(long, env = "RELAY_GROUPS", value_delimiter = ',')]
    pub groups: Vec<String>,
    /// With every selector down, how long the relay keeps serving from its last view, seconds
    /// (at least 60).
    #[arg(long, env = "RELAY_VIEW_MAX_AGE_SECS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(60..=86_400))]
    pub view_max_age_secs: u64,
    /// Which secret flags came from the command line (set from the parse, not flags).
    #[arg(skip)]
    pub on_command_line: SecretsOnCommandLine,
    /// How long a request may wait for capacity, ms.
    #[arg(long, env = "RELAY_MAX_WAIT_MS", default_value_t = 30_000)]
    pub max_wait_ms: u64,
    /// A streaming client waiting this long gets SSE keep-alive comments, ms.
    #[arg(long, env = "RELAY_PING_AFTER_MS", default_value_t = 10_000)]
    pub ping_after_ms: u64,
    /// After a client disconnects, how long its slot stays held before release, ms: the
    /// upstream counts the cancelled call until it notices the closed connection.
    #[arg(long, env = "RELAY_CANCEL_LINGER_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub cancel_linger_ms: u64,
    /// Upstream failures one request may fail over on.
    #[arg(long, env = "RELAY_FAILOVER_BUDGET", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub failover_budget: u32,
    /// How long in-flight requests may run after SIGTERM, ms.
    #[arg(long, env = "RELAY_SHUTDOWN_GRACE_MS", default_value_t = 30_000)]
    pub shutdown_grace_ms: u64,
    /// Log format.
    #[arg(long, env = "POOLGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Operator verbs against a running standalone relay's admin endpoint.
    Admin(crate::admin_client::Args),
}

/// Which secret flags were given on the command line (visible in `/proc/<pid>/cmdline`), as
/// opposed to their environment variables.
#[derive(Debug, Default, Clone, Copy)]
pub struct SecretsOnCommandLine {
    pub admin_token: bool,
    pub service_token: bool,
    /// `admin --token`.
    pub admin_verb_token: bool,
}

impl Cli {
    /// Parses the process's arguments, noting which secrets came from the command line. A bad
    /// flag ends the process with clap's message and code 2.
    pub fn parse_noting_secrets() -> Self {
        Self::try_parse_noting_secrets(std::env::args_os()).unwrap_or_else(|error| error.exit())
    }

    /// As [`Cli::parse_noting_secrets`], from `args` (the program name first), returning the
    /// error.
    pub fn try_parse_noting_secrets<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let matches = Cli::command().try_get_matches_from(args)?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        let given = |matches: &ArgMatches, id: &str| {
            matches.value_source(id) == Some(ValueSource::CommandLine)
        };
        cli.on_command_line = SecretsOnCommandLine {
            admin_token: given(&matches, "admin_token"),
            service_token: given(&matches, "service_token"),
            admin_verb_token: matches
                .subcommand_matches("admin")
                .is_some_and(|admin| given(admin, "token")),
        };
        Ok(cli)
    }

    fn admin_token(&self) -> Result<Option<String>, String> {
        SecretFlag {
            flag: "--admin-token",
            value: self.admin_token.as_deref(),
            on_command_line: self.on_command_line.admin_token,
            file: self.admin_token_file.as_deref(),
        }
        .resolve()
    }

    fn service_token(&self) -> Result<Option<String>, String> {
        SecretFlag {
            flag: "--service-token",
            value: self.service_token.as_deref(),
            on_command_line: self.on_command_line.service_token,
            file: self.service_token_file.as_deref(),
        }
        .resolve()
    }
}

/// The run configuration the flags describe (reading the files they name).
pub fn config(cli: &Cli) -> Result<run::Config, String> {
    let admin_token = cli.admin_token()?.map(Secret::new);
    let mode = if cli.standalone {
        standalone_mode(cli)?
    } else {
        remote_mode(cli)?
    };
    Ok(run::Config {
        server: server::Config {
            mode,
            relay: relay_settings(cli),
            blocks: Default::default(),
            admission: poolgate_core::lease::Settings {
                budget_time_zone: cli.budget_time_zone.clone(),
                budget_week_start: cli.budget_week_start,
                ..Default::default()
            },
            shutdown_grace: Duration::from_millis(cli.shutdown_grace_ms),
        },
        admin_token,
    })
}

/// Where to listen: `--listen`, else the config file's `listen`, else 127.0.0.1:8080.
pub fn addresses(cli: &Cli, config: &run::Config) -> Result<Addresses, String> {
    let from_file = match &config.server.mode {
        Mode::Standalone { file, .. } => file.listen.as_deref(),
        Mode::Remote { .. } => None,
    };
    let client = match (cli.listen, from_file) {
        (Some(address), _) => address,
        (None, Some(text)) => text
            .parse()
            .map_err(|_| format!("config: listen {text:?} is not an address"))?,
        (None, None) => SocketAddr::from(([127, 0, 0, 1], 8080)),
    };
    Ok(Addresses {
        client,
        metrics: cli.metrics_listen,
        admin: cli.admin_listen,
    })
}

fn standalone_mode(cli: &Cli) -> Result<Mode, String> {
    let Some(path) = &cli.config else {
        return Err(
            "--standalone needs --config FILE: the accounts, API keys and prices \
                    (examples/standalone.yaml runs against `mock-upstream`, see README)"
                .into(),
        );
    };
    poolgate_lease::calendar::Calendar::new(&cli.budget_time_zone, cli.budget_week_start)
        .map_err(|e| format!("--budget-time-zone: {e}"))?;
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--config {}: {e}", path.display()))?;
    let state_file = cli
        .state_file
        .clone()
        .or_else(|| crate::standalone::default_state_file(path));
    Ok(Mode::Standalone {
        file: Arc::new(StandaloneFile::parse(&text)?),
        state_file,
    })
}

fn remote_mode(cli: &Cli) -> Result<Mode, String> {
    if cli.selector_url.is_empty() || cli.admission_url.is_empty() {
        return Err("give --selector-url and --admission-url, or run --standalone".into());
    }
    let read = |flag: &str, path: &Path| {
        std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
    };
    let tls_ca = match &cli.grpc_tls_ca {
        Some(path) => Some(read("--grpc-tls-ca", path)?),
        None => None,
    };
    let tls_identity = match (&cli.grpc_tls_cert, &cli.grpc_tls_key) {
        (Some(cert), Some(key)) => {
            Some((read("--grpc-tls-cert", cert)?, read("--grpc-tls-key", key)?))
        }
        _ => None,
    };
    let service_token = cli.service_token()?;
    if service_token.as_deref().is_none_or(str::is_empty) && tls_identity.is_none() {
        tracing::warn!(
            "no --service-token (POOLGATE_SERVICE_TOKEN) and no client certificate: the \
             selector and admission accept this relay only if they run with --insecure-dev"
        );
    }
    Ok(Mode::Remote {
        selector: cli.selector_url.clone(),
        admission: cli.admission_url.clone(),
        client: crate::remote::GrpcClient {
            tls_ca,
            tls_identity,
            service_token,
            lease_channels: cli.lease_channels,
        },
        edge: cli
            .edge_selection
            .then(|| poolgate_client::edge::EdgeSelectionSettings {
                groups: cli.groups.clone(),
                max_age: Duration::from_secs(cli.view_max_age_secs),
                ..Default::default()
            }),
    })
}

/// The relay's limits, each raised to a floor that keeps it working.
fn relay_settings(cli: &Cli) -> RelaySettings {
    RelaySettings {
        max_wait: Duration::from_millis(cli.max_wait_ms),
        ping_after: Duration::from_millis(cli.ping_after_ms.max(100)),
        failover_budget: cli.failover_budget,
        cancel_linger: Duration::from_millis(cli.cancel_linger_ms),
        max_body_bytes: cli.max_body_bytes.max(1024),
        edge: EdgeSettings {
            max_buffered_bytes: cli.max_buffered_bytes.max(cli.max_body_bytes),
            header_read_timeout: Duration::from_millis(cli.header_read_timeout_ms.max(100)),
            body_idle_timeout: Duration::from_millis(cli.body_idle_timeout_ms.max(100)),
            body_min_rate: cli.body_min_rate,
            body_rate_grace: Duration::from_millis(cli.body_rate_grace_ms),
            h2_max_concurrent_streams: cli.h2_max_streams.max(1),
            ..EdgeSettings::default()
        },
        sockets: crate::http::socket::SocketSettings {
            enabled: cli.responses_websocket,
            idle: Duration::from_secs(cli.socket_idle_secs),
            per_key: usize::try_from(cli.sockets_per_key).unwrap_or(usize::MAX),
            ..Default::default()
        },
        ..RelaySettings::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_noting_secrets(std::iter::once("relay-svc").chain(args.iter().copied()))
    }

    #[test]
    fn the_log_format_is_one_of_its_names_and_nothing_else() {
        let cli = parse(&["--log-format", "json", "--standalone"]).expect("parses");
        assert_eq!(cli.log_format, LogFormat::Json);
        assert_eq!(cli.log_format.as_str(), "json");
        let error = parse(&["--log-format", "yaml"]).expect_err("not a log format");
        assert_eq!(error.kind(), clap::error::ErrorKind::InvalidValue);
        assert_eq!(error.exit_code(), 2);
    }

    #[test]
    fn the_admin_verbs_token_on_the_command_line_is_noted() {
        let cli = parse(&["admin", "--token", "t", "accounts"]).expect("parses");
        assert!(cli.on_command_line.admin_verb_token);
        assert!(matches!(cli.command, Some(Command::Admin(_))));
    }
}
