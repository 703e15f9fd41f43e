//! admission-svc's flags (each with an env fallback) and their checks, turned into `Config`.

use std::net::SocketAddr;
use std::time::Duration;

use admission_svc::Config;
use clap::{Parser, ValueEnum};
use poolgate_core::lease::{Settings, Weekday};
use poolgate_lease::LeaseStore;
use poolgate_lease::calendar::Calendar;
use poolgate_lease::channel::ChannelSettings;
use poolgate_lease::policy::{FailurePolicy, PolicySettings};
use poolgate_rpc::{service_auth::CallerCheck, telemetry::LogFormat, tls::TlsFiles};
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_runtime::secret_flags::SecretFlag;

/// poolgate admission: concurrency, RPM, cooldown and session-window leases on upstream accounts.
#[derive(Debug, Parser)]
#[command(version)]
pub(crate) struct Cli {
    /// gRPC listen address.
    #[arg(long, env = "ADMISSION_LISTEN", default_value = "127.0.0.1:50061")]
    pub(crate) listen: SocketAddr,
    /// Prometheus `/metrics` listen address.
    #[arg(
        long,
        env = "ADMISSION_METRICS_LISTEN",
        default_value = "127.0.0.1:9461"
    )]
    pub(crate) metrics_listen: SocketAddr,
    /// Redis URL: `redis://host:port` (one node), `redis+cluster://h1:p1,h2:p2` or a
    /// comma-separated list of URLs (a cluster). Absent: the in-process memory backend.
    #[arg(long, env = "POOLGATE_REDIS_URL")]
    redis_url: Option<String>,
    /// Lease time to live without a heartbeat, ms.
    #[arg(long, env = "ADMISSION_LEASE_TTL_MS", default_value_t = 120_000, value_parser = clap::value_parser!(u64).range(1_000..))]
    lease_ttl_ms: u64,
    /// How long a lease whose stream ended without Release stays resumable, ms.
    #[arg(long, env = "ADMISSION_ORPHAN_GRACE_MS", default_value_t = 5_000)]
    orphan_grace_ms: u64,
    /// Session window length, ms (from the window's first spend).
    #[arg(long, env = "ADMISSION_SESSION_WINDOW_MS", default_value_t = 5 * 3600 * 1000, value_parser = clap::value_parser!(u64).range(1..))]
    session_window_ms: u64,
    /// Extra share of the session window a session bound to the account may use, in [0, 10].
    #[arg(long, env = "ADMISSION_STICKY_RESERVE", default_value_t = 0.1, value_parser = share)]
    sticky_reserve: f64,
    /// Waiters per account at most.
    #[arg(long, env = "ADMISSION_MAX_WAITING", default_value_t = 100)]
    max_waiting: u32,
    /// Lease conversations open at once on one lease channel; a new one over it is refused
    /// (`RESOURCE_EXHAUSTED` on its tag).
    #[arg(long, env = "ADMISSION_MAX_CHANNEL_LEASES", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_channel_leases: u64,
    /// Bound on each Redis operation, ms.
    #[arg(long, env = "ADMISSION_REDIS_TIMEOUT_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(10..))]
    redis_timeout_ms: u64,
    /// Connections in the Redis pool (single node).
    #[arg(long, env = "ADMISSION_REDIS_POOL_SIZE", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    redis_pool_size: u32,
    /// What to do while Redis does not answer: `open` (in-process limits; N replicas admit up to
    /// N × limit), `divided` (this replica's share of each limit), `closed` (refuse).
    #[arg(long, env = "ADMISSION_FAILURE_POLICY", value_enum, default_value_t = Policy::Open)]
    failure_policy: Policy,
    /// Replica count the `divided` policy assumes before it has read the replica registry.
    #[arg(long, env = "ADMISSION_EXPECTED_REPLICAS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    expected_replicas: u32,
    /// Replica registry heartbeat interval (also the Redis probe while degraded), ms.
    #[arg(long, env = "ADMISSION_REGISTRY_INTERVAL_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(50..))]
    registry_interval_ms: u64,
    /// After SIGTERM, how long open lease streams may go on before the process exits (leases
    /// still open are left to the orphan grace, never released), ms.
    #[arg(long, env = "ADMISSION_SHUTDOWN_GRACE_MS", default_value_t = 30_000)]
    shutdown_grace_ms: u64,
    /// PEM certificate (chain) to serve gRPC over TLS (with --tls-key).
    #[arg(long, env = "ADMISSION_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "ADMISSION_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Mutual TLS: callers must present a certificate signed by this CA (PEM; with --tls-cert).
    #[arg(long, env = "ADMISSION_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<std::path::PathBuf>,
    /// The service token every caller sends in the `x-poolgate-service-token` metadata key
    /// (health checks excepted). Required unless --tls-client-ca or --insecure-dev. On the
    /// command line it is visible to every local user: prefer --service-token-file.
    #[arg(long, env = "POOLGATE_SERVICE_TOKEN", hide_env_values = true)]
    service_token: Option<String>,
    /// A file holding the service token (a trailing newline is ignored).
    #[arg(long, env = "POOLGATE_SERVICE_TOKEN_FILE")]
    service_token_file: Option<std::path::PathBuf>,
    /// Whether --service-token came from the command line (set from the parse, not a flag).
    #[arg(skip)]
    pub(crate) service_token_on_command_line: bool,
    /// Accept calls from anyone who can reach the port (development only).
    #[arg(long, env = "POOLGATE_INSECURE_DEV")]
    insecure_dev: bool,
    /// Log format.
    #[arg(long, env = "POOLGATE_LOG_FORMAT", value_enum, default_value_t)]
    pub(crate) log_format: LogFormat,
    /// Time zone of client keys' calendar budgets (day, week, month): an IANA name.
    #[arg(long, env = "ADMISSION_BUDGET_TIME_ZONE", default_value = "UTC")]
    budget_time_zone: String,
    /// First day of a budget week (`monday` … `sunday`).
    #[arg(long, env = "ADMISSION_BUDGET_WEEK_START", default_value = "monday", value_parser = week_start)]
    budget_week_start: Weekday,
}

/// `--failure-policy`, the flag's side of `poolgate_lease::policy::FailurePolicy`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Policy {
    Open,
    Divided,
    Closed,
}

impl From<Policy> for FailurePolicy {
    fn from(policy: Policy) -> Self {
        match policy {
            Policy::Open => FailurePolicy::Open,
            Policy::Divided => FailurePolicy::Divided,
            Policy::Closed => FailurePolicy::Closed,
        }
    }
}

fn share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(share) if (0.0..=10.0).contains(&share) => Ok(share),
        _ => Err("must be a number in [0, 10]".into()),
    }
}

impl Cli {
    pub(crate) fn config(&self) -> Result<Config, String> {
        let backend = match &self.redis_url {
            None => LeaseStore::Memory,
            Some(url) => LeaseStore::Redis {
                target: RedisTarget::parse(url).map_err(|e| format!("--redis-url: {e}"))?,
                options: RedisOptions {
                    timeout: Duration::from_millis(self.redis_timeout_ms),
                    pool_size: self.redis_pool_size,
                },
                policy: PolicySettings {
                    policy: self.failure_policy.into(),
                    expected_replicas: self.expected_replicas,
                    registry_interval: Duration::from_millis(self.registry_interval_ms),
                    registry_ttl: Duration::from_millis(self.registry_interval_ms * 5),
                },
            },
        };
        let service_token = SecretFlag {
            flag: "--service-token",
            value: self.service_token.as_deref(),
            on_command_line: self.service_token_on_command_line,
            file: self.service_token_file.as_deref(),
        }
        .resolve()?;
        Calendar::new(&self.budget_time_zone, self.budget_week_start)
            .map_err(|e| format!("--budget-time-zone: {e}"))?;
        Ok(Config {
            settings: Settings {
                lease_ttl: Duration::from_millis(self.lease_ttl_ms),
                orphan_grace: Duration::from_millis(self.orphan_grace_ms),
                session_window: Duration::from_millis(self.session_window_ms),
                sticky_reserve: self.sticky_reserve,
                max_waiting: self.max_waiting,
                budget_time_zone: self.budget_time_zone.clone(),
                budget_week_start: self.budget_week_start,
                ..Settings::default()
            },
            backend,
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
            channel: ChannelSettings {
                max_conversations: usize::try_from(self.max_channel_leases).unwrap_or(usize::MAX),
            },
            tls: (self.tls_cert.clone().zip(self.tls_key.clone())).map(|(cert, key)| TlsFiles {
                cert,
                key,
                client_ca: self.tls_client_ca.clone(),
            }),
            callers: CallerCheck::from_flags(
                service_token.as_deref(),
                self.tls_client_ca.is_some(),
                self.insecure_dev,
            )?,
            ..Config::default()
        })
    }
}

/// `--budget-week-start`: a weekday's English name, any case.
fn week_start(text: &str) -> Result<Weekday, String> {
    Weekday::parse(text)
}
