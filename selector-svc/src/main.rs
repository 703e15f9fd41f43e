//! The selector-svc binary: `serve` (default), `migrate`, `reencrypt`, `genkey`, and `admin`
//! subcommands that call the admin API, so an operator needs no other gRPC client.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use poolgate_core::account::{CredentialKind, Platform, default_oauth_token_url};
use poolgate_proto::selector::v1 as pb;
use poolgate_rpc::service_auth::{CallerCheck, WithToken};
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_runtime::secret_flags::SecretFlag;
use poolgate_select::crypto::Keyring;
use poolgate_select::engine::SelectorSettings;
use poolgate_select::probe::ProbeSettings;
use selector_svc::server::Config;
use selector_svc::store::PostgresSource;

/// poolgate selector: account config, credentials, health and selection.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the selector (the default).
    Serve,
    /// Apply the database migrations, then exit.
    Migrate,
    /// Re-encrypt every credential as a row-bound (v2) blob under the active key, then exit.
    Reencrypt,
    /// Print a new random credential key (base64), for POOLGATE_CREDENTIAL_KEYS.
    Genkey,
    /// Call the admin API of a running selector.
    Admin(Box<AdminArgs>),
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// gRPC listen address.
    #[arg(
        long,
        env = "SELECTOR_LISTEN",
        default_value = "127.0.0.1:50062",
        global = true
    )]
    listen: SocketAddr,
    /// Prometheus `/metrics` listen address.
    #[arg(
        long,
        env = "SELECTOR_METRICS_LISTEN",
        default_value = "127.0.0.1:9462",
        global = true
    )]
    metrics_listen: SocketAddr,
    /// Postgres URL.
    #[arg(long, env = "POOLGATE_DATABASE_URL", global = true)]
    database_url: Option<String>,
    /// Redis URL (`redis://`, `redis+cluster://` or a comma list).
    #[arg(long, env = "POOLGATE_REDIS_URL", global = true)]
    redis_url: Option<String>,
    /// Credential keys: `id:base64key[,id:base64key...]`. The first encrypts unless
    /// --credential-key-id says otherwise; all decrypt. On the command line they are visible to
    /// every local user: prefer --credential-keys-file.
    #[arg(
        long,
        env = "POOLGATE_CREDENTIAL_KEYS",
        hide_env_values = true,
        global = true
    )]
    credential_keys: Option<String>,
    /// A file holding the credential keys (one `id:base64key` per line), instead of the flag.
    #[arg(long, env = "POOLGATE_CREDENTIAL_KEYS_FILE", global = true)]
    credential_keys_file: Option<std::path::PathBuf>,
    /// Where each secret came from (set from the parse, not flags).
    #[arg(skip)]
    on_command_line: SecretsOnCommandLine,
    /// The key id that encrypts new credentials.
    #[arg(long, env = "POOLGATE_CREDENTIAL_KEY_ID", global = true)]
    credential_key_id: Option<String>,
    /// Bearer token of the admin API (absent: admin API disabled). On the command line it is
    /// visible to every local user: prefer --admin-token-file.
    #[arg(
        long,
        env = "SELECTOR_ADMIN_TOKEN",
        hide_env_values = true,
        global = true
    )]
    admin_token: Option<String>,
    /// A file holding the admin token (a trailing newline is ignored).
    #[arg(long, env = "SELECTOR_ADMIN_TOKEN_FILE", global = true)]
    admin_token_file: Option<std::path::PathBuf>,
    /// Periodic full reload, ms (NOTIFY reloads at once).
    #[arg(
        long,
        env = "SELECTOR_RELOAD_INTERVAL_MS",
        default_value_t = 30_000,
        global = true
    )]
    reload_interval_ms: u64,
    /// The admission replicas' lease time to live, ms: the probe's leases and their release
    /// fences follow the same rules as the relays' (set it as admission's is set).
    #[arg(long, env = "ADMISSION_LEASE_TTL_MS", default_value_t = 120_000, value_parser = clap::value_parser!(u64).range(1_000..))]
    lease_ttl_ms: u64,
    /// The admission replicas' orphan grace, ms.
    #[arg(long, env = "ADMISSION_ORPHAN_GRACE_MS", default_value_t = 5_000)]
    orphan_grace_ms: u64,
    /// PEM certificate (chain) to serve gRPC over TLS (with --tls-key).
    #[arg(long, env = "SELECTOR_TLS_CERT", requires = "tls_key", global = true)]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "SELECTOR_TLS_KEY", requires = "tls_cert", global = true)]
    tls_key: Option<std::path::PathBuf>,
    /// Model of the confirmation probe on Anthropic accounts (an account's `probe_model` wins).
    /// The probe confirms a billing-class or 5xx answer before it retires or blocks an
    /// account, and checks half-open breakers.
    #[arg(
        long,
        env = "SELECTOR_PROBE_MODEL_ANTHROPIC",
        default_value = "claude-haiku-4-5",
        global = true
    )]
    probe_model_anthropic: String,
    /// Model of the confirmation probe on OpenAI accounts.
    #[arg(
        long,
        env = "SELECTOR_PROBE_MODEL_OPENAI",
        default_value = "gpt-4o-mini",
        global = true
    )]
    probe_model_openai: String,
    /// Mutual TLS: callers must present a certificate signed by this CA (PEM; with --tls-cert).
    #[arg(
        long,
        env = "SELECTOR_TLS_CLIENT_CA",
        requires = "tls_cert",
        global = true
    )]
    tls_client_ca: Option<std::path::PathBuf>,
    /// The service token every caller sends in the `x-poolgate-service-token` metadata key
    /// (health checks excepted; the admin CLI sends it too). Required unless --tls-client-ca or
    /// --insecure-dev. On the command line it is visible to every local user: prefer
    /// --service-token-file.
    #[arg(
        long,
        env = "POOLGATE_SERVICE_TOKEN",
        hide_env_values = true,
        global = true
    )]
    service_token: Option<String>,
    /// A file holding the service token (a trailing newline is ignored).
    #[arg(long, env = "POOLGATE_SERVICE_TOKEN_FILE", global = true)]
    service_token_file: Option<std::path::PathBuf>,
    /// Accept calls from anyone who can reach the port (development only).
    #[arg(long, env = "POOLGATE_INSECURE_DEV", global = true)]
    insecure_dev: bool,
    /// Log format.
    #[arg(long, env = "POOLGATE_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"], global = true)]
    log_format: String,
}

/// Which secret flags were given on the command line (visible in `/proc/<pid>/cmdline`), as
/// opposed to their environment variables.
#[derive(Debug, Default, Clone, Copy)]
struct SecretsOnCommandLine {
    credential_keys: bool,
    admin_token: bool,
    service_token: bool,
}

impl ServeArgs {
    fn credential_keys(&self) -> Result<Option<String>, String> {
        SecretFlag {
            flag: "--credential-keys",
            value: self.credential_keys.as_deref(),
            on_command_line: self.on_command_line.credential_keys,
            file: self.credential_keys_file.as_deref(),
        }
        .resolve()
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

impl Cli {
    /// Parses the arguments, noting which secrets came from the command line.
    fn parse_noting_secrets() -> Self {
        let matches = Cli::command().get_matches();
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
        let given = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
        cli.serve.on_command_line = SecretsOnCommandLine {
            credential_keys: given("credential_keys"),
            admin_token: given("admin_token"),
            service_token: given("service_token"),
        };
        cli
    }
}

#[derive(Debug, Args)]
struct AdminArgs {
    /// Selector gRPC endpoint.
    #[arg(
        long,
        env = "SELECTOR_ENDPOINT",
        default_value = "http://127.0.0.1:50062"
    )]
    endpoint: String,
    #[command(subcommand)]
    action: AdminAction,
}

#[derive(Debug, Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once per admin command; boxing buys nothing"
)]
enum AdminAction {
    /// List accounts (credentials masked).
    Accounts {
        #[arg(long, default_value = "")]
        group: String,
    },
    /// Create or update an account.
    UpsertAccount {
        #[arg(long)]
        name: String,
        #[arg(long)]
        group: String,
        /// anthropic | openai
        #[arg(long)]
        platform: String,
        #[arg(long)]
        base_url: String,
        /// api_key | oauth (a Claude subscription) | chatgpt_oauth (a ChatGPT subscription; platform openai)
        #[arg(long, default_value = "api_key")]
        credential_kind: String,
        /// The credential; read from the ACCOUNT_CREDENTIAL env var when absent.
        #[arg(
            long,
            env = "ACCOUNT_CREDENTIAL",
            hide_env_values = true,
            default_value = ""
        )]
        credential: String,
        #[arg(long, default_value_t = 0)]
        priority: i32,
        #[arg(long, default_value_t = 1)]
        weight: i32,
        #[arg(long, default_value_t = 0)]
        concurrency: i32,
        #[arg(long, default_value_t = 0)]
        rpm: i32,
        #[arg(long, default_value_t = 0.0)]
        session_window_usd: f64,
        /// OAuth accounts: the refresh token (read from ACCOUNT_REFRESH_TOKEN when absent).
        #[arg(
            long,
            env = "ACCOUNT_REFRESH_TOKEN",
            hide_env_values = true,
            default_value = ""
        )]
        refresh_token: String,
        /// OAuth accounts: access token expiry, ms since the epoch.
        #[arg(long, default_value_t = 0)]
        expires_at_ms: u64,
        // OAuth accounts: the token endpoint URL (help: `token_url_help`).
        #[arg(long, default_value = "", help = token_url_help())]
        token_url: String,
        /// OAuth accounts: the client id of refresh requests (none: the platform's default).
        #[arg(long, default_value = "")]
        oauth_client_id: String,
        /// Models the account may serve (repeatable; none: every model).
        #[arg(long = "model")]
        models: Vec<String>,
        /// Per-account proxy URL.
        #[arg(long, default_value = "")]
        proxy_url: String,
        /// The model the confirmation probe asks for (none: the selector's platform default).
        #[arg(long, default_value = "")]
        probe_model: String,
        /// OpenAI chat streams: do not ask the upstream for usage when the client did not
        /// (for upstreams that reject `stream_options`).
        #[arg(long)]
        no_stream_usage: bool,
    },
    /// Set an account's status: active | disabled | error.
    SetStatus {
        account_id: i64,
        status: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Restore a retired or errored account.
    Restore { account_id: i64 },
    /// Create a client API key (shown once).
    CreateKey {
        #[arg(long)]
        user: String,
        #[arg(long)]
        group: String,
        #[arg(long, default_value_t = 0)]
        user_rpm: i32,
        #[arg(long, default_value = "")]
        name: String,
    },
    /// List client API keys.
    Keys,
    /// Revoke a client API key.
    RevokeKey { id: i64 },
    /// Blocked accounts with class, status, reason and time left.
    Blocks,
    /// Clear an account's blocks and breaker.
    ClearBlock { account_id: i64 },
    /// Drop a sticky binding. Bindings are scoped to the client key: the session is
    /// `k<api key id>:<session hash>` (as `admin` lists keys).
    DropBinding { group: String, session_hash: String },
    /// Live leases per account.
    Load,
    /// A key's usage over the last 24 h.
    Usage { api_key_id: i64 },
}

/// `--token-url`'s help: unset stores none, and reads give the platform's default, named here
/// from `default_oauth_token_url` so the help follows it.
fn token_url_help() -> String {
    format!(
        "OAuth accounts: the token endpoint URL. None: the platform's default, applied when the \
         account is read ({} for anthropic, {} for openai); an update without it keeps the \
         stored URL",
        default_oauth_token_url(Platform::Anthropic),
        default_oauth_token_url(Platform::OpenAi),
    )
}

fn keyring(args: &ServeArgs) -> Result<Keyring, String> {
    let Some(spec) = args.credential_keys()? else {
        return Err("credential keys are required: --credential-keys-file, or \
                    POOLGATE_CREDENTIAL_KEYS (make one with `selector-svc genkey`)"
            .into());
    };
    Keyring::parse(&spec, args.credential_key_id.as_deref()).map_err(|e| e.to_string())
}

fn required(value: &Option<String>, flag: &str, env: &str) -> Result<String, String> {
    value
        .clone()
        .ok_or_else(|| format!("{flag} (or {env}) is required"))
}

fn config(args: &ServeArgs) -> Result<Config, String> {
    let redis_url = required(&args.redis_url, "--redis-url", "POOLGATE_REDIS_URL")?;
    Ok(Config {
        database_url: required(
            &args.database_url,
            "--database-url",
            "POOLGATE_DATABASE_URL",
        )?,
        redis_target: RedisTarget::parse(&redis_url).map_err(|e| format!("--redis-url: {e}"))?,
        redis_options: RedisOptions::default(),
        keyring: keyring(args)?,
        admin_token: args.admin_token()?,
        settings: SelectorSettings {
            probe: ProbeSettings {
                anthropic_model: args.probe_model_anthropic.clone(),
                openai_model: args.probe_model_openai.clone(),
                ..ProbeSettings::default()
            },
            ..SelectorSettings::default()
        },
        lease_settings: poolgate_core::lease::Settings {
            lease_ttl: Duration::from_millis(args.lease_ttl_ms),
            orphan_grace: Duration::from_millis(args.orphan_grace_ms),
            ..Default::default()
        },
        refresh: Default::default(),
        reload_interval: Duration::from_millis(args.reload_interval_ms.max(100)),
        refresh_interval: Duration::from_secs(30),
        max_concurrent_streams: 10_000,
        tls: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(poolgate_rpc::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.tls_client_ca.clone(),
            }),
            _ => None,
        },
        callers: CallerCheck::from_flags(
            args.service_token()?.as_deref(),
            args.tls_client_ca.is_some(),
            args.insecure_dev,
        )?,
    })
}

async fn serve(args: &ServeArgs) -> Result<(), String> {
    let config = config(args)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let metrics = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .map_err(|e| format!("cannot listen on {} (metrics): {e}", args.metrics_listen))?;
    tracing::info!(addr = %args.listen, "selector serving");
    selector_svc::server::run(
        config,
        listener,
        Some(metrics),
        poolgate_runtime::shutdown::signal(),
    )
    .await
    .map_err(|e| e.to_string())
}

async fn store(args: &ServeArgs) -> Result<PostgresSource, String> {
    let url = required(
        &args.database_url,
        "--database-url",
        "POOLGATE_DATABASE_URL",
    )?;
    PostgresSource::connect(&url, std::sync::Arc::new(keyring(args)?))
        .await
        .map_err(|e| e.to_string())
}

async fn admin(args: &ServeArgs, admin: &AdminArgs) -> Result<(), String> {
    use pb::selector_admin_client::SelectorAdminClient;
    let token = args
        .admin_token()?
        .ok_or("--admin-token-file (or SELECTOR_ADMIN_TOKEN) is required")?;
    let service_token = args.service_token()?;
    let channel = tonic::transport::Endpoint::from_shared(admin.endpoint.clone())
        .map_err(|e| format!("--endpoint: {e}"))?
        .connect()
        .await
        .map_err(|e| format!("cannot reach {}: {e}", admin.endpoint))?;
    let bearer: tonic::metadata::MetadataValue<_> = format!("Bearer {token}")
        .parse()
        .map_err(|_| "the admin token is not a valid header value".to_string())?;
    let channel = WithToken::new(channel, service_token.as_deref());
    let mut client =
        SelectorAdminClient::with_interceptor(channel, move |mut request: tonic::Request<()>| {
            request
                .metadata_mut()
                .insert("authorization", bearer.clone());
            Ok(request)
        });
    let failed = |status: tonic::Status| format!("{:?}: {}", status.code(), status.message());
    let print_account = |a: &pb::AccountView| {
        println!(
            "{}\t{}\tgroup={}\tstatus={}{}\tpriority={}\tweight={}\tconcurrency={}\trpm={}\tcredential={}",
            a.id,
            a.name,
            a.group,
            a.status,
            if a.status_reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", a.status_reason)
            },
            a.priority,
            a.weight,
            a.concurrency_limit,
            a.rpm_limit,
            a.credential_masked
        )
    };
    match &admin.action {
        AdminAction::Accounts { group } => {
            let answer = client
                .list_accounts(pb::ListAccountsRequest {
                    group: group.clone(),
                })
                .await
                .map_err(failed)?;
            answer.get_ref().accounts.iter().for_each(print_account);
        }
        AdminAction::UpsertAccount {
            name,
            group,
            platform,
            base_url,
            credential_kind,
            credential,
            priority,
            weight,
            concurrency,
            rpm,
            session_window_usd,
            refresh_token,
            expires_at_ms,
            token_url,
            oauth_client_id,
            models,
            proxy_url,
            probe_model,
            no_stream_usage,
        } => {
            let platform = Platform::parse(platform).ok_or_else(|| {
                format!("--platform must be anthropic or openai, got {platform:?}")
            })?;
            let kind = CredentialKind::parse(credential_kind).ok_or_else(|| {
                format!(
                    "--credential-kind must be api_key, oauth or chatgpt_oauth, got {credential_kind:?}"
                )
            })?;
            let answer = client
                .upsert_account(pb::UpsertAccountRequest {
                    name: name.clone(),
                    group: group.clone(),
                    platform: pb::Platform::from(platform) as i32,
                    base_url: base_url.clone(),
                    kind: pb::CredentialKind::from(kind) as i32,
                    credential: credential.clone(),
                    priority: *priority,
                    weight: *weight,
                    concurrency_limit: *concurrency,
                    rpm_limit: *rpm,
                    session_window_limit_usd: *session_window_usd,
                    refresh_token: refresh_token.clone(),
                    expires_at_ms: *expires_at_ms,
                    token_url: token_url.clone(),
                    oauth_client_id: oauth_client_id.clone(),
                    allowed_models: models.clone(),
                    proxy_url: proxy_url.clone(),
                    probe_model: probe_model.clone(),
                    disable_stream_usage: *no_stream_usage,
                    ..Default::default()
                })
                .await
                .map_err(failed)?;
            print_account(answer.get_ref());
        }
        AdminAction::SetStatus {
            account_id,
            status,
            reason,
        } => {
            let answer = client
                .set_account_status(pb::SetAccountStatusRequest {
                    account_id: *account_id,
                    status: status.clone(),
                    reason: reason.clone(),
                })
                .await
                .map_err(failed)?;
            print_account(answer.get_ref());
        }
        AdminAction::Restore { account_id } => {
            let answer = client
                .restore_account(pb::RestoreAccountRequest {
                    account_id: *account_id,
                })
                .await
                .map_err(failed)?;
            print_account(answer.get_ref());
        }
        AdminAction::CreateKey {
            user,
            group,
            user_rpm,
            name,
        } => {
            let answer = client
                .create_api_key(pb::CreateApiKeyRequest {
                    user: user.clone(),
                    group: group.clone(),
                    user_rpm_limit: *user_rpm,
                    name: name.clone(),
                })
                .await
                .map_err(failed)?;
            println!(
                "id={}\napi_key={}\n(shown once: store it now)",
                answer.get_ref().id,
                answer.get_ref().api_key
            );
        }
        AdminAction::Keys => {
            let answer = client
                .list_api_keys(pb::ListApiKeysRequest {})
                .await
                .map_err(failed)?;
            for k in &answer.get_ref().keys {
                println!(
                    "{}\t{}…\tuser={}\tgroup={}\tuser_rpm={}\t{}",
                    k.id, k.prefix, k.user, k.group, k.user_rpm_limit, k.status
                );
            }
        }
        AdminAction::RevokeKey { id } => {
            client
                .revoke_api_key(pb::RevokeApiKeyRequest { id: *id })
                .await
                .map_err(failed)?;
            println!("revoked {id}");
        }
        AdminAction::Blocks => {
            let answer = client
                .list_blocks(pb::ListBlocksRequest {})
                .await
                .map_err(failed)?;
            for b in &answer.get_ref().blocks {
                println!(
                    "{}\t{}\t{}\tclass={}\tstatus={}\tleft={}s\t{}",
                    b.account_id,
                    b.account_name,
                    b.kind,
                    b.class,
                    b.status,
                    b.remaining_ms / 1000,
                    b.reason
                );
            }
        }
        AdminAction::ClearBlock { account_id } => {
            client
                .clear_block(pb::ClearBlockRequest {
                    account_id: *account_id,
                })
                .await
                .map_err(failed)?;
            println!("cleared {account_id}");
        }
        AdminAction::DropBinding {
            group,
            session_hash,
        } => {
            let answer = client
                .drop_binding(pb::DropBindingRequest {
                    group: group.clone(),
                    session_hash: session_hash.clone(),
                })
                .await
                .map_err(failed)?;
            println!("dropped={}", answer.get_ref().dropped);
        }
        AdminAction::Load => {
            let answer = client
                .read_load(pb::ReadLoadRequest {
                    account_ids: vec![],
                })
                .await
                .map_err(failed)?;
            for a in &answer.get_ref().accounts {
                println!(
                    "{}\tinflight={}\tlimit={}",
                    a.account_id, a.inflight, a.concurrency_limit
                );
            }
        }
        AdminAction::Usage { api_key_id } => {
            let answer = client
                .read_usage(pb::ReadUsageRequest {
                    api_key_id: *api_key_id,
                    from_ms: 0,
                    to_ms: 0,
                })
                .await
                .map_err(failed)?;
            let u = answer.get_ref();
            println!(
                "requests={}\tinput_tokens={}\toutput_tokens={}\tcost_usd={:.6}",
                u.requests, u.input_tokens, u.output_tokens, u.cost_usd
            );
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse_noting_secrets();
    let _telemetry = poolgate_rpc::telemetry::init("selector-svc", &cli.serve.log_format);
    let result = match &cli.command {
        None | Some(Command::Serve) => serve(&cli.serve).await,
        Some(Command::Migrate) => match store(&cli.serve).await {
            Ok(store) => store.migrate().await.map_err(|e| e.to_string()).map(|()| {
                println!(
                    "migrations applied (schema version {})",
                    selector_svc::store::known_schema_version()
                );
            }),
            Err(error) => Err(error),
        },
        Some(Command::Reencrypt) => match store(&cli.serve).await {
            Ok(store) => store
                .reencrypt_all()
                .await
                .map_err(|e| e.to_string())
                .and_then(|report| {
                    println!(
                        "upgraded={}\talready_current={}\tchanged_meanwhile={}\tunreadable={}",
                        report.upgraded,
                        report.already_current,
                        report.changed_meanwhile,
                        report.unreadable
                    );
                    // A row changed meanwhile was rewritten by its writer (a refresh, an admin
                    // update) in that writer's form; a second run checks it.
                    if report.unreadable > 0 {
                        Err(format!(
                            "{} account(s) could not be decrypted and were left as they are \
                             (see the log for their ids; is the key ring complete?)",
                            report.unreadable
                        ))
                    } else {
                        Ok(())
                    }
                }),
            Err(error) => Err(error),
        },
        Some(Command::Genkey) => {
            println!("{}", Keyring::generate_key());
            Ok(())
        }
        Some(Command::Admin(admin_args)) => admin(&cli.serve, admin_args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("selector-svc: {message}");
            ExitCode::from(2)
        }
    }
}
