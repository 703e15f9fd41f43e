//! The relay-svc binary: flags (with env fallbacks) → config → serve.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use poolgate_runtime::secret_flags::SecretFlag;
use relay_svc::metrics::Metrics;
use relay_svc::proxy::{EdgeSettings, RelaySettings};
use relay_svc::server::{Config, Mode};
use relay_svc::standalone::StandaloneFile;

/// poolgate relay: an Anthropic- and OpenAI-compatible endpoint over pooled upstream accounts.
#[derive(Debug, Parser)]
#[command(version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// HTTP listen address (default: the config file's `listen`, else 127.0.0.1:8080).
    #[arg(long, env = "RELAY_LISTEN")]
    listen: Option<SocketAddr>,
    /// Run everything in this process (memory backends, accounts from --config).
    #[arg(long, env = "RELAY_STANDALONE")]
    standalone: bool,
    /// YAML config for --standalone: accounts, API keys, prices (see examples/standalone.yaml).
    #[arg(long, alias = "accounts", env = "RELAY_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// --standalone: where refreshed OAuth tokens, retirements and the usage ledger are kept
    /// across restarts (default: `<config>.state.json` beside --config when its directory is
    /// writable).
    #[arg(long, env = "RELAY_STATE_FILE")]
    state_file: Option<std::path::PathBuf>,
    /// --standalone: the admin endpoint's address (accounts, blocks, restore, clear-block,
    /// usage); it runs only with --admin-token.
    #[arg(long, env = "RELAY_ADMIN_LISTEN", default_value = "127.0.0.1:9464")]
    admin_listen: SocketAddr,
    /// --standalone: the token the admin endpoint requires (`Authorization: Bearer …`). On the
    /// command line it is visible to every local user: prefer --admin-token-file.
    #[arg(long, env = "RELAY_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// A file holding the admin token (a trailing newline is ignored).
    #[arg(long, env = "RELAY_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<std::path::PathBuf>,
    /// Largest request body accepted, bytes.
    #[arg(long, env = "RELAY_MAX_BODY_BYTES", default_value_t = 32 << 20)]
    max_body_bytes: usize,
    /// Request body bytes held across all connections at once; past it, 503 in the client's
    /// format.
    #[arg(long, env = "RELAY_MAX_BUFFERED_BYTES", default_value_t = 512 << 20)]
    max_buffered_bytes: usize,
    /// Longest wait for a request's headers, ms (HTTP/1).
    #[arg(long, env = "RELAY_HEADER_READ_TIMEOUT_MS", default_value_t = 20_000)]
    header_read_timeout_ms: u64,
    /// Longest pause between two chunks of a request body, ms; past it, 408 and the connection
    /// closed.
    #[arg(long, env = "RELAY_BODY_IDLE_TIMEOUT_MS", default_value_t = 30_000)]
    body_idle_timeout_ms: u64,
    /// After the first --body-rate-grace-ms, a body must average at least this many bytes per
    /// second (slower: 408 and the connection closed).
    #[arg(long, env = "RELAY_BODY_MIN_RATE", default_value_t = 16 << 10)]
    body_min_rate: u64,
    #[arg(long, env = "RELAY_BODY_RATE_GRACE_MS", default_value_t = 10_000)]
    body_rate_grace_ms: u64,
    /// HTTP/2 streams per client connection.
    #[arg(long, env = "RELAY_H2_MAX_STREAMS", default_value_t = 128)]
    h2_max_streams: u32,
    /// Selector gRPC endpoints, comma-separated (one per replica).
    #[arg(long, env = "RELAY_SELECTOR_URL", value_delimiter = ',')]
    selector_url: Vec<String>,
    /// Admission gRPC endpoints, comma-separated (one per replica).
    #[arg(long, env = "RELAY_ADMISSION_URL", value_delimiter = ',')]
    admission_url: Vec<String>,
    /// Prometheus `/metrics` listen address (its own port, off the client port).
    #[arg(long, env = "RELAY_METRICS_LISTEN", default_value = "127.0.0.1:9463")]
    metrics_listen: SocketAddr,
    /// PEM CA of the selector's and admission's TLS certificates; use https:// endpoint URLs.
    #[arg(long, env = "RELAY_GRPC_TLS_CA")]
    grpc_tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate for selector and admission servers that require mutual TLS
    /// (with --grpc-tls-key).
    #[arg(long, env = "RELAY_GRPC_TLS_CERT", requires = "grpc_tls_key")]
    grpc_tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --grpc-tls-cert.
    #[arg(long, env = "RELAY_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    grpc_tls_key: Option<std::path::PathBuf>,
    /// The service token sent to the selector and admission in the `x-poolgate-service-token`
    /// metadata key. On the command line it is visible to every local user: prefer
    /// --service-token-file.
    #[arg(long, env = "POOLGATE_SERVICE_TOKEN", hide_env_values = true)]
    service_token: Option<String>,
    /// A file holding the service token (a trailing newline is ignored).
    #[arg(long, env = "POOLGATE_SERVICE_TOKEN_FILE")]
    service_token_file: Option<std::path::PathBuf>,
    /// Which secret flags came from the command line (set from the parse, not flags).
    #[arg(skip)]
    on_command_line: SecretsOnCommandLine,
    /// How long a request may wait for capacity, ms.
    #[arg(long, env = "RELAY_MAX_WAIT_MS", default_value_t = 30_000)]
    max_wait_ms: u64,
    /// A streaming client waiting this long gets SSE keep-alive comments, ms.
    #[arg(long, env = "RELAY_PING_AFTER_MS", default_value_t = 10_000)]
    ping_after_ms: u64,
    /// After a client disconnects, how long its slot stays held before release, ms: the
    /// upstream counts the cancelled call until it notices the closed connection.
    #[arg(long, env = "RELAY_CANCEL_LINGER_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    cancel_linger_ms: u64,
    /// Upstream failures one request may fail over on.
    #[arg(long, env = "RELAY_FAILOVER_BUDGET", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    failover_budget: u32,
    /// How long in-flight requests may run after SIGTERM, ms.
    #[arg(long, env = "RELAY_SHUTDOWN_GRACE_MS", default_value_t = 30_000)]
    shutdown_grace_ms: u64,
    /// Log format.
    #[arg(long, env = "POOLGATE_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Operator verbs against a running standalone relay's admin endpoint.
    Admin {
        /// The admin endpoint.
        #[arg(long, env = "RELAY_ADMIN_URL", default_value = "http://127.0.0.1:9464")]
        url: String,
        /// The admin token (visible to every local user on the command line: prefer
        /// --token-file).
        #[arg(long, env = "RELAY_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// A file holding the admin token (a trailing newline is ignored).
        #[arg(long, env = "RELAY_ADMIN_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
        #[command(subcommand)]
        verb: relay_svc::admin::Verb,
    },
}

/// Which secret flags were given on the command line (visible in `/proc/<pid>/cmdline`), as
/// opposed to their environment variables.
#[derive(Debug, Default, Clone, Copy)]
struct SecretsOnCommandLine {
    admin_token: bool,
    service_token: bool,
    /// `admin --token`.
    admin_verb_token: bool,
}

impl Cli {
    /// Parses the arguments, noting which secrets came from the command line.
    fn parse_noting_secrets() -> Self {
        let matches = Cli::command().get_matches();
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
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
        cli
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

async fn config(cli: &Cli) -> Result<Config, String> {
    let mode = if cli.standalone {
        let (file, state_file) = match &cli.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("--config {}: {e}", path.display()))?;
                let state_file = cli
                    .state_file
                    .clone()
                    .or_else(|| relay_svc::standalone::default_state_file(path));
                (StandaloneFile::parse(&text)?, state_file)
            }
            None => {
                return Err(
                    "--standalone needs --config FILE: the accounts, API keys and prices \
                            (examples/standalone.yaml runs against `mock-upstream`, see README)"
                        .into(),
                );
            }
        };
        match &state_file {
            Some(path) => tracing::info!(state_file = %path.display(), "standalone state kept"),
            None => tracing::warn!(
                "no state file (--state-file): refreshed OAuth tokens, retirements and usage \
                 are lost at restart"
            ),
        }
        Mode::Standalone {
            file: Arc::new(file),
            state_file,
        }
    } else {
        if cli.selector_url.is_empty() || cli.admission_url.is_empty() {
            return Err("give --selector-url and --admission-url, or run --standalone".into());
        }
        let read = |flag: &str, path: &std::path::Path| {
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
        Mode::Remote {
            selector: cli.selector_url.clone(),
            admission: cli.admission_url.clone(),
            client: relay_svc::remote::GrpcClient {
                tls_ca,
                tls_identity,
                service_token,
            },
        }
    };
    Ok(Config {
        mode,
        relay: RelaySettings {
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
            ..RelaySettings::default()
        },
        blocks: Default::default(),
        admission: Default::default(),
        shutdown_grace: Duration::from_millis(cli.shutdown_grace_ms),
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse_noting_secrets();
    if let Some(Command::Admin {
        url,
        token,
        token_file,
        verb,
    }) = &cli.command
    {
        // No telemetry here: the verb's answer is the output, warnings go to stderr.
        let flag = SecretFlag {
            flag: "--token",
            value: token.as_deref(),
            on_command_line: cli.on_command_line.admin_verb_token,
            file: token_file.as_deref(),
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
        return match relay_svc::admin::call(url, &token, verb).await {
            Ok(answer) => {
                println!("{answer}");
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprintln!("relay-svc admin: {message}");
                ExitCode::from(1)
            }
        };
    }
    let _telemetry = poolgate_rpc::telemetry::init("relay-svc", &cli.log_format);
    let result = async {
        let admin_token = cli.admin_token()?;
        let config = config(&cli).await?;
        let assembled = relay_svc::server::assemble(&config, Metrics::new())?;
        let relay = assembled.relay;
        let from_file = match &config.mode {
            Mode::Standalone { file, .. } => file.listen.clone(),
            Mode::Remote { .. } => None,
        };
        let listen: SocketAddr = match (cli.listen, from_file) {
            (Some(addr), _) => addr,
            (None, Some(text)) => text
                .parse()
                .map_err(|_| format!("config: listen {text:?} is not an address"))?,
            (None, None) => SocketAddr::from(([127, 0, 0, 1], 8080)),
        };
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        let metrics_listener = tokio::net::TcpListener::bind(cli.metrics_listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", cli.metrics_listen))?;
        let admin = match (&assembled.standalone, &admin_token) {
            (Some(engines), Some(token)) if !token.is_empty() => {
                let listener = tokio::net::TcpListener::bind(cli.admin_listen)
                    .await
                    .map_err(|e| format!("cannot listen on {}: {e}", cli.admin_listen))?;
                tracing::info!(addr = %cli.admin_listen, "admin endpoint serving");
                let router = relay_svc::admin::router(engines.operator.clone(), token);
                Some(tokio::spawn(async move {
                    if let Err(error) = axum::serve(listener, router).await {
                        tracing::warn!(%error, "admin endpoint failed");
                    }
                }))
            }
            (None, Some(_)) => {
                tracing::warn!(
                    "--admin-token is for --standalone; distributed deployments use the \
                     selector's admin API"
                );
                None
            }
            _ => None,
        };
        tracing::info!(addr = %listen, metrics = %cli.metrics_listen, standalone = cli.standalone, "relay serving");
        let served = relay_svc::server::serve(
            relay,
            listener,
            Some(metrics_listener),
            poolgate_runtime::shutdown::signal(),
            config.shutdown_grace,
        )
        .await;
        if let Some(admin) = admin {
            admin.abort();
        }
        if let Some(engines) = &assembled.standalone
            && let Err(error) = engines.source.flush().await
        {
            tracing::error!(%error, "the state file's last write failed");
        }
        served
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("relay-svc: {message}");
            ExitCode::from(2)
        }
    }
}
