//! Wiring: Postgres (schema check, snapshot, NOTIFY reloads), Redis (health), the token
//! refresher, the budget rebuild, the gRPC services (selector, admin behind its token, health,
//! reflection), and the status page on its own listener when `--admin-http-listen` is set (the
//! same admin service, called in process; TLS with the gRPC certificate when that is set).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use poolgate_proto::selector::v1::selector_admin_server::SelectorAdminServer;
use poolgate_proto::selector::v1::selector_server::SelectorServer;
use poolgate_runtime::redis::{RedisHandle, RedisOptions, RedisTarget};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

use poolgate_core::Clock;
use poolgate_lease::calendar::Calendar;
use poolgate_lease::{LeaseEngine, LeaseStore};
use poolgate_select::source::budgets::BudgetCounters;

use crate::budgets::REBUILD_EVERY;
use crate::grpc::{AdminAuth, AdminGrpc, SelectorGrpc};
use crate::store::{PostgresSource, StoreError};
use poolgate_operator::engine::EngineAdmin;
use poolgate_select::crypto::Keyring;
use poolgate_select::engine::BudgetRebuild;
use poolgate_select::engine::{Selector, SelectorParts, SelectorSettings};
use poolgate_select::health::RedisHealth;
use poolgate_select::metrics::Metrics;
use poolgate_select::refresh::{RefreshSettings, TokenRefresher};
use poolgate_select::snapshot::SnapshotCell;

#[derive(Debug, Clone)]
pub struct Config {
    pub database_url: String,
    pub redis_target: RedisTarget,
    pub redis_options: RedisOptions,
    pub keyring: Keyring,
    /// Bearer token of the admin API; `None` disables it.
    pub admin_token: Option<String>,
    /// Where the status page listens (`--admin-http-listen`); `None`: no page. Needs
    /// `admin_token`, which its login asks for.
    pub admin_http_listen: Option<SocketAddr>,
    /// The engine's settings; its `budget_calendar` is replaced by `lease_settings`' calendar.
    pub settings: SelectorSettings,
    /// The lease settings of the admission replicas (ttl, orphan grace, session window): the
    /// probe's leases and their release fences follow the same rules as the relays' leases; its
    /// budget time zone and week start are the calendar keys' usage is summed in and lost
    /// budget counters are rebuilt in.
    pub lease_settings: poolgate_core::lease::Settings,
    pub refresh: RefreshSettings,
    /// The periodic full reload (the safety net behind NOTIFY).
    pub reload_interval: Duration,
    /// How often OAuth expiries are checked.
    pub refresh_interval: Duration,
    /// Usage records older than this are folded into their keys' totals
    /// (`--usage-retention-days`; `retention.rs`); `None`: every record is kept.
    pub usage_retention: Option<Duration>,
    pub max_concurrent_streams: u32,
    /// Serve gRPC over TLS with this identity; `None`: plaintext.
    pub tls: Option<poolgate_rpc::tls::TlsFiles>,
    /// How callers prove who they are (service token, mutual TLS, or open for development).
    /// The admin RPCs check the admin token on top.
    pub callers: poolgate_rpc::service_auth::CallerCheck,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("postgres: {0}")]
    Store(#[from] StoreError),
    #[error("redis: {0}")]
    Redis(String),
    #[error("grpc server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("reflection service failed: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("{0}")]
    Other(String),
}

/// A running selector's parts, for `serve` and for tests that drive the engine directly.
pub struct Built {
    pub selector: Arc<Selector>,
    pub refresher: TokenRefresher,
    /// The engine's stores as their own types (round trips, direct reads in tests and benches).
    pub store: PostgresSource,
    pub health: RedisHealth,
    /// The lease engine the confirmation probe takes its leases from.
    pub probe_leases: Arc<LeaseEngine>,
    /// Admission's budget counters (over `probe_leases`), which the budget rebuild seeds from
    /// the usage ledger; `selector.rebuild_budgets(&*built.budgets)` runs it at once.
    pub budgets: Arc<dyn BudgetCounters>,
    /// The snapshot reload loop (stopped with `Built`, as the engine's own tasks are).
    reload: tokio::task::JoinHandle<()>,
    /// The usage retention task, where a retention is set.
    retention: Option<tokio::task::JoinHandle<()>>,
}

impl Built {
    pub fn serving(&self) -> Serving {
        Serving {
            selector: self.selector.clone(),
            store: self.store.clone(),
        }
    }
}

/// What serving needs: the engine, and the store the admin API writes to.
#[derive(Clone)]
pub struct Serving {
    pub selector: Arc<Selector>,
    pub store: PostgresSource,
}

impl Drop for Built {
    fn drop(&mut self) {
        self.reload.abort();
        if let Some(retention) = &self.retention {
            retention.abort();
        }
        self.selector.stop_tasks();
    }
}

/// Connects, checks the schema, loads the first snapshot and starts the reload and refresh tasks.
pub async fn build(config: &Config, metrics: Metrics) -> Result<Built, ServeError> {
    let store =
        PostgresSource::connect(&config.database_url, Arc::new(config.keyring.clone())).await?;
    store.check_schema().await?;
    let snapshot = Arc::new(SnapshotCell::new(store.load_snapshot().await?));
    metrics.reloads.with_label_values(&["startup"]).inc();
    let redis = RedisHandle::connect(
        &config.redis_target,
        &config.redis_options,
        metrics.redis_round_trips.clone(),
    )
    .await
    .map_err(|e| ServeError::Redis(e.to_string()))?;
    let health = RedisHealth::new(redis.clone());
    // The one clock of the process (core/src/clock.rs); shared decisions use Redis `TIME`.
    let clock = Clock::system();
    // The probe's leases come from admission's scripts on the same Redis, so they count against
    // the account like the relays' leases. Built by the lease engine's one constructor: its
    // failed releases are retried, its metrics are served with the selector's.
    let probe_leases = poolgate_lease::start(
        &LeaseStore::SharedRedis(redis),
        config.lease_settings.clone(),
        poolgate_lease::metrics::Metrics::registered_in(metrics.registry.clone()),
        clock.clone(),
    )
    .await
    .map_err(|e| ServeError::Redis(e.to_string()))?;
    // Keys' usage per period is summed in the calendar admission counts budgets in (the lease
    // settings' time zone and week start, as the budget rebuild's).
    let calendar = Calendar::new(
        &config.lease_settings.budget_time_zone,
        config.lease_settings.budget_week_start,
    )
    .map_err(|e| ServeError::Other(format!("budget calendar: {e}")))?;
    let selector = Arc::new(Selector::new(SelectorParts {
        snapshot: snapshot.clone(),
        source: Arc::new(store.clone()),
        health: Arc::new(health.clone()),
        leases: probe_leases.clone(),
        settings: SelectorSettings {
            budget_calendar: Arc::new(calendar),
            ..config.settings.clone()
        },
        metrics: metrics.clone(),
        clock: clock.clone(),
    }));
    let refresher = TokenRefresher::new(
        Arc::new(store.clone()),
        Arc::new(health.clone()),
        config.refresh.clone(),
        metrics.clone(),
        clock,
    )
    .map_err(ServeError::Other)?;
    selector.set_refresher(refresher.clone());
    let budgets: Arc<dyn BudgetCounters> = probe_leases.clone();
    let retention = config.usage_retention.map(|retention| {
        tokio::spawn(crate::retention::fold_loop(
            store.clone(),
            Clock::system(),
            retention,
        ))
    });
    let reload = tokio::spawn(reload_loop(
        store.clone(),
        snapshot.clone(),
        config.reload_interval,
        metrics,
    ));
    // The engine's own tasks (refreshes, gauges, usage reads at start and once per cadence
    // cluster-wide, the budget rebuild every `REBUILD_EVERY`), stopped with `Built`.
    selector.start_tasks(
        refresher.clone(),
        config.refresh_interval,
        BudgetRebuild::Every(budgets.clone(), REBUILD_EVERY),
    );
    Ok(Built {
        selector,
        refresher,
        store,
        health,
        probe_leases,
        budgets,
        reload,
        retention,
    })
}

/// Reloads the snapshot on every NOTIFY of a config change (so a committed change is live
/// within a second) and every `interval` as a safety net.
async fn reload_loop(
    store: PostgresSource,
    snapshot: Arc<SnapshotCell>,
    interval: Duration,
    metrics: Metrics,
) {
    let reload = |trigger: &'static str| {
        let (store, snapshot, metrics) = (store.clone(), snapshot.clone(), metrics.clone());
        async move {
            let ticket = snapshot.ticket();
            match store.load_snapshot().await {
                Ok(fresh) => {
                    snapshot.set(ticket, fresh);
                    metrics.reloads.with_label_values(&[trigger]).inc();
                }
                Err(error) => {
                    tracing::warn!(%error, trigger, "snapshot reload failed; serving the previous one")
                }
            }
        }
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let mut listener = match sqlx::postgres::PgListener::connect_with(store.pool()).await {
            Ok(mut listener) => match listener.listen("poolgate_config").await {
                Ok(()) => Some(listener),
                Err(error) => {
                    tracing::warn!(%error, "LISTEN failed; relying on periodic reloads");
                    None
                }
            },
            Err(error) => {
                tracing::warn!(%error, "no LISTEN connection; relying on periodic reloads");
                None
            }
        };
        // A change made while we were not listening is caught by this reload.
        reload("notify").await;
        loop {
            let Some(active) = listener.as_mut() else {
                tokio::select! {
                    _ = tick.tick() => reload("periodic").await,
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
                break;
            };
            tokio::select! {
                notification = active.recv() => match notification {
                    Ok(_) => {
                        // Coalesce a burst of changes into one reload.
                        while active.next_buffered().is_some() {}
                        reload("notify").await;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "LISTEN connection lost; reconnecting");
                        break;
                    }
                },
                _ = tick.tick() => reload("periodic").await,
            }
        }
    }
}

/// Serves the selector on `listener` (and `/metrics` on `metrics_listener`) until `shutdown`.
pub async fn run(
    config: Config,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let metrics = Metrics::new();
    let built = build(&config, metrics.clone()).await?;
    // `built` (and with it the reload and refresh tasks) lives until serving ends.
    serve_selector(
        built.serving(),
        &config,
        listener,
        metrics_listener,
        shutdown,
    )
    .await
}

/// Serves an engine (tests keep a handle on it), with the status page on
/// `config.admin_http_listen` when set.
pub async fn serve_selector(
    serving: Serving,
    config: &Config,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let page_listener = match config.admin_http_listen {
        Some(address) => Some(TcpListener::bind(address).await.map_err(|error| {
            ServeError::Other(format!(
                "cannot listen on {address} (--admin-http-listen): {error}"
            ))
        })?),
        None => None,
    };
    serve_selector_with_page(
        serving,
        config,
        listener,
        metrics_listener,
        page_listener,
        shutdown,
    )
    .await
}

/// [`serve_selector`] with the status page on a listener the caller bound (`None`: no page),
/// whatever `config.admin_http_listen` says. The page stops with the gRPC server.
pub async fn serve_selector_with_page(
    serving: Serving,
    config: &Config,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    page_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let Serving { selector, store } = serving;
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<SelectorServer<SelectorGrpc>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(poolgate_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let metrics_task = metrics_listener.map(|listener| {
        let metrics = selector.metrics().clone();
        poolgate_rpc::metrics_http::spawn(listener, move || metrics.render())
    });
    // One admin API over the engine: the gRPC admin service and the status page both serve it.
    let engine_admin = Arc::new(EngineAdmin::new(selector.clone(), Arc::new(store.clone())));
    let admin_grpc = Arc::new(AdminGrpc::new(engine_admin.clone(), store));
    // The page ends when gRPC serving ends, by shutdown or by failure (the sender is dropped).
    let (stop_page, page_stopped) = tokio::sync::watch::channel(());
    let page = match page_listener {
        Some(listener) => Some(spawn_page(listener, config, engine_admin, page_stopped)?),
        None => None,
    };
    let shutdown = async move {
        shutdown.await;
        drop(stop_page);
    };
    let admin =
        AdminAuth::new(config.admin_token.clone()).wrap(SelectorAdminServer::from_arc(admin_grpc));
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &config.tls {
        let tls = tls.server_config().map_err(|e| {
            ServeError::Other(format!("tls: cannot read the certificate or key: {e}"))
        })?;
        builder = builder.tls_config(tls)?;
    }
    let result = builder
        .layer(poolgate_rpc::grpc_metrics::GrpcMetrics::new(
            &selector.metrics().registry,
            served_methods(),
        ))
        .layer(poolgate_rpc::telemetry::TraceLayer)
        .layer(config.callers.layer())
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(5)))
        .max_concurrent_streams(Some(config.max_concurrent_streams))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(SelectorServer::new(SelectorGrpc::new(selector.clone())))
        .add_service(admin)
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await;
    if let Some(task) = metrics_task {
        task.abort();
    }
    if let Some(page) = page {
        // Its sender went with the shutdown future: the page finishes its open requests.
        let _ = page.await;
    }
    result?;
    Ok(())
}

/// Starts the status page on `listener` over the engine's admin API, the one the admin gRPC
/// service serves, until `stopped`'s sender is dropped. Refused without an admin token: the
/// page's login is that token.
fn spawn_page(
    listener: TcpListener,
    config: &Config,
    admin: Arc<EngineAdmin>,
    mut stopped: tokio::sync::watch::Receiver<()>,
) -> Result<tokio::task::JoinHandle<()>, ServeError> {
    use poolgate_operator::page;

    let Some(token) = config.admin_token.as_deref().filter(|t| !t.is_empty()) else {
        return Err(ServeError::Other(
            "the status page (--admin-http-listen) needs an admin token (--admin-token-file)"
                .into(),
        ));
    };
    let (tls, scheme) = match &config.tls {
        Some(files) => (
            Some(page::tls_config(&files.cert, &files.key).map_err(ServeError::Other)?),
            page::Scheme::Https,
        ),
        None => (None, page::Scheme::Http),
    };
    let router = page::router(admin, token, scheme);
    tracing::info!(addr = ?listener.local_addr().ok(), tls = tls.is_some(), "status page serving");
    Ok(tokio::spawn(page::serve(
        listener,
        router,
        tls,
        async move {
            // Ok never comes (nothing is sent); Err is the sender dropped: time to stop.
            while stopped.changed().await.is_ok() {}
        },
    )))
}

/// The RPCs this server serves (selector, admin, health, reflection): the only method labels of
/// its metrics.
fn served_methods() -> poolgate_rpc::grpc_metrics::ServedMethods {
    poolgate_rpc::grpc_metrics::ServedMethods::from_descriptors(
        &[
            poolgate_proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        ],
        &[
            poolgate_proto::selector::v1::selector_server::SERVICE_NAME,
            poolgate_proto::selector::v1::selector_admin_server::SERVICE_NAME,
            tonic_health::pb::health_server::SERVICE_NAME,
            tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME,
        ],
    )
}
