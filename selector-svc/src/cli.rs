//! The selector-svc binary's flags and the configuration they make. `serve` is the default: its
//! flags work without the word (`selector-svc --listen …`). Every subcommand takes only its own
//! flags, so `selector-svc admin --credential-keys …` is refused: the admin CLI never holds the
//! credential keys.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use poolgate_core::lease::Weekday;
use poolgate_core::price::UnpricedPolicy;
use poolgate_core::windows::Thresholds;
use poolgate_lease::calendar::Calendar;
use poolgate_rpc::service_auth::CallerCheck;
use poolgate_rpc::telemetry::LogFormat;
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_runtime::secret_flags::SecretFlag;
use poolgate_select::crypto::Keyring;
use poolgate_select::engine::{SelectorSettings, UsageReadSettings};
use poolgate_select::probe::ProbeSettings;
use selector_svc::server::Config;

use crate::admin_cli::AdminArgs;

/// poolgate selector: account config, credentials, health and selection.
#[derive(Debug, Parser)]
#[command(version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the selector (the default: its flags work without the word too).
    Serve(Box<ServeArgs>),
    /// Apply the database migrations, then exit.
    Migrate(DatabaseArgs),
    /// Re-encrypt every credential as a row-bound (v2) blob under the active key, then exit.
    /// Exit status 2 when some could not be decrypted (docs/SECURITY.md).
    Reencrypt(DatabaseArgs),
    /// Print a new random credential key (base64), for POOLGATE_CREDENTIAL_KEYS.
    Genkey,
    /// The operator CLI: calls the admin API of a running selector.
    Admin(Box<AdminArgs>),
}

/// What `migrate` and `reencrypt` need, and `serve` too: the database and the credential keys.
#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// Postgres URL.
    #[arg(long, env = "POOLGATE_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Credential keys: `id:base64key[,id:base64key...]`. The first encrypts unless
    /// --credential-key-id says otherwise; all decrypt. On the command line they are visible to
    /// every local user: prefer --credential-keys-file.
    #[arg(long, env = "POOLGATE_CREDENTIAL_KEYS", hide_env_values = true)]
    pub credential_keys: Option<String>,
    /// A file holding the credential keys (one `id:base64key` per line), instead of the flag.
    #[arg(long, env = "POOLGATE_CREDENTIAL_KEYS_FILE")]
    pub credential_keys_file: Option<PathBuf>,
    /// Whether --credential-keys came from the command line (set from the parse, not a flag).
    #[arg(skip)]
    pub keys_on_command_line: bool,
    /// The key id that encrypts new credentials.
    #[arg(long, env = "POOLGATE_CREDENTIAL_KEY_ID")]
    pub credential_key_id: Option<String>,
    /// Log format.
    #[arg(long, env = "POOLGATE_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// gRPC listen address.
    #[arg(long, env = "SELECTOR_LISTEN", default_value = "127.0.0.1:50062")]
    pub listen: SocketAddr,
    /// Prometheus `/metrics` listen address.
    #[arg(
        long,
        env = "SELECTOR_METRICS_LISTEN",
        default_value = "127.0.0.1:9462"
    )]
    pub metrics_listen: SocketAddr,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Redis URL (`redis://`, `redis+cluster://` or a comma list).
    #[arg(long, env = "POOLGATE_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// Bearer token of the admin API (absent: admin API disabled). On the command line it is
    /// visible to every local user: prefer --admin-token-file.
    #[arg(long, env = "SELECTOR_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A file holding the admin token (a trailing newline is ignored).
    #[arg(long, env = "SELECTOR_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Serve the status page (a read-only web view of the pool; log in with the admin token) on
    /// this address. Off unless set; refused without an admin token. Over TLS with --tls-cert
    /// and --tls-key when those are set (no client certificate asked), plain HTTP otherwise:
    /// then bind loopback (`127.0.0.1:9464`) and reach it through `kubectl port-forward`.
    #[arg(long, env = "SELECTOR_ADMIN_HTTP_LISTEN")]
    pub admin_http_listen: Option<SocketAddr>,
    /// Days usage records are kept one by one; older ones are folded into each key's all-time
    /// totals (which its `total` budget keeps reading) and deleted, hourly, in batches. 0: keep
    /// every record. At least 35 otherwise: a month's budget reads its month's records.
    #[arg(long, env = "SELECTOR_USAGE_RETENTION_DAYS", default_value_t = 90)]
    pub usage_retention_days: u64,
    /// Periodic full reload, ms (NOTIFY reloads at once).
    #[arg(long, env = "SELECTOR_RELOAD_INTERVAL_MS", default_value_t = 30_000)]
    pub reload_interval_ms: u64,
    /// The admission replicas' lease time to live, ms: the probe's leases and their release
    /// fences follow the same rules as the relays' (set it as admission's is set).
    #[arg(long, env = "ADMISSION_LEASE_TTL_MS", default_value_t = 120_000, value_parser = clap::value_parser!(u64).range(1_000..))]
    pub lease_ttl_ms: u64,
    /// The admission replicas' orphan grace, ms.
    #[arg(long, env = "ADMISSION_ORPHAN_GRACE_MS", default_value_t = 5_000)]
    pub orphan_grace_ms: u64,
    /// The time zone of client keys' calendar budgets, an IANA name: the selector rebuilds lost
    /// budget counters from the usage ledger over the periods admission counts, and sums keys'
    /// usage per day, week and month in it (the self-service view, the operator's `keys`), so
    /// set it as admission's is set (the same variable).
    #[arg(long, env = "ADMISSION_BUDGET_TIME_ZONE", default_value = "UTC")]
    pub budget_time_zone: String,
    /// The first day of a budget week (`monday` … `sunday`), as admission's.
    #[arg(long, env = "ADMISSION_BUDGET_WEEK_START", default_value = "monday", value_parser = week_start)]
    pub budget_week_start: Weekday,
    /// PEM certificate (chain) to serve gRPC over TLS (with --tls-key).
    #[arg(long, env = "SELECTOR_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "SELECTOR_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: callers must present a certificate signed by this CA (PEM; with --tls-cert).
    #[arg(long, env = "SELECTOR_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Model of the confirmation probe on Anthropic accounts (an account's `probe_model` wins).
    /// The probe confirms a billing-class or 5xx answer before it retires or blocks an
    /// account, and checks half-open breakers.
    #[arg(
        long,
        env = "SELECTOR_PROBE_MODEL_ANTHROPIC",
        default_value = "claude-haiku-4-5"
    )]
    pub probe_model_anthropic: String,
    /// Model of the confirmation probe on OpenAI accounts.
    #[arg(
        long,
        env = "SELECTOR_PROBE_MODEL_OPENAI",
        default_value = "gpt-4o-mini"
    )]
    pub probe_model_openai: String,
    /// How often each OAuth account's usage endpoint (the one its CLI reads: Claude
    /// `/api/oauth/usage`, ChatGPT `/wham/usage`) is read for its windows, once per this across
    /// every replica, and at start (docs/SUBSCRIPTIONS.md, "Probes and usage readings"). 0: never
    /// (windows then come only from the answers' headers).
    #[arg(long, env = "SELECTOR_USAGE_READ_EVERY_MS", default_value_t = 300_000)]
    pub usage_read_every_ms: u64,
    /// Usage windows (docs/DESIGN.md §5): above this share of any plan window an account orders
    /// last for new sessions. A group's `window_shed_at` column wins.
    #[arg(long, env = "SELECTOR_WINDOW_SHED_AT", default_value_t = 0.9)]
    pub window_shed_at: f64,
    /// Above this share its sticky sessions move too. A group's `window_move_at` column wins.
    #[arg(long, env = "SELECTOR_WINDOW_MOVE_AT", default_value_t = 0.97)]
    pub window_move_at: f64,
    /// What a model with neither a `model_prices` row nor a price in the shipped catalogue costs
    /// (docs/DESIGN.md §6, "Prices"): `fallback`, its family's highest catalogue price (of its
    /// platform without a family); `refuse`, no price, and a key with a budget is refused the
    /// model (403 naming it).
    #[arg(long, env = "SELECTOR_UNPRICED", value_enum, default_value_t = Unpriced::Fallback)]
    pub unpriced: Unpriced,
    /// The service token every caller sends in the `x-poolgate-service-token` metadata key
    /// (health checks excepted). Required unless --tls-client-ca or --insecure-dev. On the
    /// command line it is visible to every local user: prefer --service-token-file.
    #[arg(long, env = "POOLGATE_SERVICE_TOKEN", hide_env_values = true)]
    pub service_token: Option<String>,
    /// A file holding the service token (a trailing newline is ignored).
    #[arg(long, env = "POOLGATE_SERVICE_TOKEN_FILE")]
    pub service_token_file: Option<PathBuf>,
    /// Accept calls from anyone who can reach the port (development only).
    #[arg(long, env = "POOLGATE_INSECURE_DEV")]
    pub insecure_dev: bool,
    /// Which secrets came from the command line (set from the parse, not flags).
    #[arg(skip)]
    pub on_command_line: SecretsOnCommandLine,
}

/// `--unpriced`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Unpriced {
    Fallback,
    Refuse,
}

/// Which secret flags were given on the command line (visible in `/proc/<pid>/cmdline`), as
/// opposed to their environment variables.
#[derive(Debug, Default, Clone, Copy)]
pub struct SecretsOnCommandLine {
    pub admin_token: bool,
    pub service_token: bool,
}

pub fn given(matches: &ArgMatches, id: &str) -> bool {
    matches.value_source(id) == Some(ValueSource::CommandLine)
}

impl Cli {
    /// Parses the process's arguments (a bad flag exits 2, as clap does).
    pub fn parse_noting_secrets() -> Self {
        Self::try_parse_noting_secrets(std::env::args_os()).unwrap_or_else(|error| error.exit())
    }

    /// Parses `args`, noting which secrets came from the command line.
    pub fn try_parse_noting_secrets<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = Cli::command().try_get_matches_from(args)?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        match (&mut cli.command, matches.subcommand()) {
            (None, _) => cli.serve.note_command_line(&matches),
            (Some(Command::Serve(serve)), Some((_, sub))) => serve.note_command_line(sub),
            (Some(Command::Migrate(db) | Command::Reencrypt(db)), Some((_, sub))) => {
                db.keys_on_command_line = given(sub, "credential_keys");
            }
            (Some(Command::Admin(admin)), Some((_, sub))) => admin.note_command_line(sub),
            _ => {}
        }
        Ok(cli)
    }
}

impl ServeArgs {
    fn note_command_line(&mut self, matches: &ArgMatches) {
        self.database.keys_on_command_line = given(matches, "credential_keys");
        self.on_command_line = SecretsOnCommandLine {
            admin_token: given(matches, "admin_token"),
            service_token: given(matches, "service_token"),
        };
    }

    /// The configuration `selector_svc::server::run` serves; an error names the flag.
    pub fn config(&self) -> Result<Config, String> {
        let redis_url = required(&self.redis_url, "--redis-url", "POOLGATE_REDIS_URL")?;
        let redis_target =
            RedisTarget::parse(&redis_url).map_err(|e| format!("--redis-url: {e}"))?;
        let service_token = SecretFlag {
            flag: "--service-token",
            value: self.service_token.as_deref(),
            on_command_line: self.on_command_line.service_token,
            file: self.service_token_file.as_deref(),
        }
        .resolve()?;
        Calendar::new(&self.budget_time_zone, self.budget_week_start)
            .map_err(|e| format!("--budget-time-zone: {e}"))?;
        let admin_token = SecretFlag {
            flag: "--admin-token",
            value: self.admin_token.as_deref(),
            on_command_line: self.on_command_line.admin_token,
            file: self.admin_token_file.as_deref(),
        }
        .resolve()?;
        if self.admin_http_listen.is_some() && admin_token.as_deref().is_none_or(str::is_empty) {
            return Err(
                "--admin-http-listen needs an admin token (--admin-token-file or \
                        SELECTOR_ADMIN_TOKEN): the status page's login is that token"
                    .into(),
            );
        }
        // The deployment's Anthropic probe model is every Claude OAuth account's unless it
        // names its own: it must be one such an account may probe on (Haiku).
        if let Some(problem) = poolgate_select::probe::probe_model_refusal(
            poolgate_core::account::Platform::Anthropic,
            poolgate_core::account::CredentialKind::OAuth,
            &self.probe_model_anthropic,
        ) {
            return Err(format!("--probe-model-anthropic: {problem}"));
        }
        Ok(Config {
            database_url: self.database.database_url()?,
            redis_target,
            redis_options: RedisOptions::default(),
            keyring: self.database.keyring()?,
            admin_token,
            admin_http_listen: self.admin_http_listen,
            settings: SelectorSettings {
                probe: ProbeSettings {
                    anthropic_model: self.probe_model_anthropic.clone(),
                    openai_model: self.probe_model_openai.clone(),
                    ..ProbeSettings::default()
                },
                windows: Thresholds::new(self.window_shed_at, self.window_move_at)
                    .map_err(|problem| format!("--window-shed-at / --window-move-at: {problem}"))?,
                usage_reads: UsageReadSettings {
                    every: Duration::from_millis(self.usage_read_every_ms),
                    ..UsageReadSettings::default()
                },
                unpriced: match self.unpriced {
                    Unpriced::Fallback => UnpricedPolicy::Fallback,
                    Unpriced::Refuse => UnpricedPolicy::Refuse,
                },
                ..SelectorSettings::default()
            },
            lease_settings: poolgate_core::lease::Settings {
                lease_ttl: Duration::from_millis(self.lease_ttl_ms),
                orphan_grace: Duration::from_millis(self.orphan_grace_ms),
                budget_time_zone: self.budget_time_zone.clone(),
                budget_week_start: self.budget_week_start,
                ..Default::default()
            },

            refresh: Default::default(),
            reload_interval: Duration::from_millis(self.reload_interval_ms.max(100)),
            refresh_interval: Duration::from_secs(30),
            usage_retention: match self.usage_retention_days {
                0 => None,
                days if days < selector_svc::retention::MIN_RETENTION_DAYS => {
                    return Err(format!(
                        "--usage-retention-days: {days} is too short: 0 (keep every record) or at least {} (a month's budget reads its month's records)",
                        selector_svc::retention::MIN_RETENTION_DAYS
                    ));
                }
                days => Some(Duration::from_secs(days.saturating_mul(86_400))),
            },
            max_concurrent_streams: 10_000,
            tls: match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => Some(poolgate_rpc::tls::TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: self.tls_client_ca.clone(),
                }),
                _ => None,
            },
            callers: CallerCheck::from_flags(
                service_token.as_deref(),
                self.tls_client_ca.is_some(),
                self.insecure_dev,
            )?,
        })
    }
}

impl DatabaseArgs {
    pub fn database_url(&self) -> Result<String, String> {
        required(
            &self.database_url,
            "--database-url",
            "POOLGATE_DATABASE_URL",
        )
    }

    pub fn keyring(&self) -> Result<Keyring, String> {
        let keys = SecretFlag {
            flag: "--credential-keys",
            value: self.credential_keys.as_deref(),
            on_command_line: self.keys_on_command_line,
            file: self.credential_keys_file.as_deref(),
        }
        .resolve()?;
        let Some(spec) = keys else {
            return Err("credential keys are required: --credential-keys-file, or \
                        POOLGATE_CREDENTIAL_KEYS (make one with `selector-svc genkey`)"
                .into());
        };
        Keyring::parse(&spec, self.credential_key_id.as_deref()).map_err(|e| e.to_string())
    }
}

/// `--budget-week-start`: a weekday's English name, any case (as admission reads it).
fn week_start(text: &str) -> Result<Weekday, String> {
    Ok(match text.to_ascii_lowercase().as_str() {
        "monday" => Weekday::Monday,
        "tuesday" => Weekday::Tuesday,
        "wednesday" => Weekday::Wednesday,
        "thursday" => Weekday::Thursday,
        "friday" => Weekday::Friday,
        "saturday" => Weekday::Saturday,
        "sunday" => Weekday::Sunday,
        _ => return Err("must be a weekday: monday … sunday".into()),
    })
}

fn required(value: &Option<String>, flag: &str, env: &str) -> Result<String, String> {
    value
        .clone()
        .ok_or_else(|| format!("{flag} (or {env}) is required"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags of a selector that can run (its backends need not answer).
    const RUNNABLE: [&str; 7] = [
        "--redis-url",
        "redis://127.0.0.1:1",
        "--database-url",
        "postgres://x",
        "--credential-keys",
        "k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "--insecure-dev",
    ];

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_noting_secrets(std::iter::once("selector-svc").chain(args.iter().copied()))
    }

    #[test]
    fn each_subcommand_takes_only_its_own_flags() {
        for refused in [
            &["admin", "--credential-keys", "k1:x", "blocks"][..],
            &["admin", "blocks", "--credential-keys", "k1:x"],
            &["admin", "--database-url", "postgres://x", "accounts"],
            &["migrate", "--listen", "127.0.0.1:1"],
            &["reencrypt", "--admin-token", "t"],
            &["--listen", "127.0.0.1:1", "migrate"],
            &["genkey", "--redis-url", "redis://x"],
        ] {
            let error = parse(refused).expect_err("refused");
            assert_eq!(error.exit_code(), 2, "{refused:?}: {error}");
        }
        let cli = parse(&["admin", "--endpoint", "http://127.0.0.1:1", "blocks"]).expect("admin");
        assert!(matches!(cli.command, Some(Command::Admin(_))));
        let cli = parse(&["migrate", "--database-url", "postgres://x"]).expect("migrate");
        assert!(matches!(cli.command, Some(Command::Migrate(_))));
    }

    #[test]
    fn serve_is_the_default_and_takes_its_flags_with_or_without_the_word() {
        let cli = parse(&["--listen", "127.0.0.1:7", "--log-format", "json"]).expect("serve");
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.listen.port(), 7);
        assert_eq!(cli.serve.database.log_format, LogFormat::Json);
        let Some(Command::Serve(serve)) = parse(&["serve", "--listen", "127.0.0.1:8"])
            .expect("serve")
            .command
        else {
            panic!("serve");
        };
        assert_eq!(serve.listen.port(), 8);
        assert!(parse(&["--log-format", "yaml"]).is_err(), "an enum flag");
    }

    #[test]
    fn a_secret_on_the_command_line_is_noted_wherever_it_was_given() {
        let cli = parse(&["--admin-token", "t", "--credential-keys", "k1:x"]).expect("serve");
        assert!(cli.serve.on_command_line.admin_token);
        assert!(cli.serve.database.keys_on_command_line);
        assert!(!cli.serve.on_command_line.service_token);
        let Some(Command::Reencrypt(db)) = parse(&["reencrypt", "--credential-keys", "k1:x"])
            .expect("reencrypt")
            .command
        else {
            panic!("reencrypt");
        };
        assert!(db.keys_on_command_line);
    }

    #[test]
    fn unpriced_models_get_the_fallback_unless_the_operator_refuses_them() {
        let base = RUNNABLE;
        let policy = |extra: &[&str]| {
            parse(&[&base[..], extra].concat())
                .expect("parses")
                .serve
                .config()
                .expect("runs")
                .settings
                .unpriced
        };
        assert_eq!(policy(&[]), UnpricedPolicy::Fallback);
        assert_eq!(policy(&["--unpriced", "refuse"]), UnpricedPolicy::Refuse);
        assert!(parse(&[&base[..], &["--unpriced", "free"]].concat()).is_err());
    }

    #[test]
    fn a_configuration_that_cannot_run_names_the_flag() {
        let cli = parse(&["--redis-url", "ftp://127.0.0.1:1"]).expect("parses");
        let error = cli.serve.config().expect_err("not a redis url");
        assert!(error.starts_with("--redis-url"), "{error}");
    }

    #[test]
    fn the_status_page_is_off_by_default_and_refused_without_an_admin_token() {
        let base = RUNNABLE;
        let off = parse(&base).expect("parses");
        assert_eq!(off.serve.admin_http_listen, None, "off by default");
        let no_token = parse(&[&base[..], &["--admin-http-listen", "127.0.0.1:9464"]].concat())
            .expect("parses");
        let error = no_token.serve.config().expect_err("no admin token");
        assert!(
            error.starts_with("--admin-http-listen needs an admin token"),
            "{error}"
        );
        let with_token = parse(
            &[
                &base[..],
                &[
                    "--admin-http-listen",
                    "127.0.0.1:9464",
                    "--admin-token",
                    "t",
                ],
            ]
            .concat(),
        )
        .expect("parses");
        let config = with_token.serve.config().expect("runs");
        assert_eq!(
            config.admin_http_listen,
            Some("127.0.0.1:9464".parse().expect("address"))
        );
    }
}
