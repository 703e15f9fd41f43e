//! poolgate-stack: the whole stack in one process, for the integration tests and the relay
//! bench (a test fixture, never linked by a service): private Postgres (migrated) and Redis, a selector, admission replicas and a relay,
//! each on a free port. Servers run until the process ends; what a caller keeps (a `Built`, an
//! engine, a relay handle) is what it may look into.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use poolgate_core::account::{CredentialKind, Platform, Secret};
use poolgate_core::lease::Settings;
use poolgate_core::outcome::RuntimeBlockSettings;
use poolgate_lease::LeaseEngine;
use poolgate_rpc::service_auth::CallerCheck;
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_select::crypto::Keyring;
use poolgate_testkit::{HarnessResult, PostgresServer, RedisServer};
use selector_svc::store::{AccountInput, PostgresSource};

use relay_svc::metrics::Metrics;
use relay_svc::proxy::{Relay, RelaySettings};
use relay_svc::remote::GrpcClient;
use relay_svc::server::{Config, Mode};
use relay_svc::standalone::StandaloneFile;

/// The service token the stack's selector and admission require; its relays send it.
pub const SERVICE_TOKEN: &str = "test-service-token";

/// The selector's admin token (the status page's login too).
pub const ADMIN_TOKEN: &str = "admin";

/// Postgres (migrated) and Redis, private to the caller (stopped when dropped).
pub struct Backends {
    pub postgres: PostgresServer,
    pub redis: RedisServer,
    pub keyring: Keyring,
    pub store: PostgresSource,
}

pub async fn backends() -> HarnessResult<Backends> {
    let (postgres, redis) = tokio::join!(PostgresServer::start(), RedisServer::start());
    let (postgres, redis) = (postgres?, redis?);
    let keyring = Keyring::parse(&format!("k1:{}", Keyring::generate_key()), None)
        .map_err(|e| format!("keyring: {e}"))?;
    let store = PostgresSource::connect(&postgres.url(), Arc::new(keyring.clone()))
        .await
        .map_err(|e| format!("postgres: {e}"))?;
    store.migrate().await.map_err(|e| format!("migrate: {e}"))?;
    Ok(Backends {
        postgres,
        redis,
        keyring,
        store,
    })
}

/// An Anthropic API-key account in group `default` with credential `cred-<name>`.
pub fn account(name: &str, base_url: &str, concurrency: i32, priority: i32) -> AccountInput {
    AccountInput {
        serves: Vec::new(),
        name: name.into(),
        group: "default".into(),
        platform: Platform::Anthropic,
        base_url: base_url.into(),
        credential_kind: CredentialKind::ApiKey,
        credential: Some(Secret::new(format!("cred-{name}"))),
        oauth: None,
        priority,
        weight: 1,
        concurrency_limit: concurrency,
        rpm_limit: 0,
        session_window_limit_usd: 0.0,
        allowed_models: vec![],
        model_mapping: Default::default(),
        proxy_url: None,
        probe_model: None,
        stream_usage: true,
    }
}

async fn listen() -> HarnessResult<(tokio::net::TcpListener, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind: {e}"))?;
    let address = listener.local_addr().map_err(|e| format!("address: {e}"))?;
    Ok((listener, address))
}

/// A selector served on a free port; keep the `Built` for as long as it should run.
pub async fn selector(
    backends: &Backends,
) -> HarnessResult<(selector_svc::server::Built, SocketAddr)> {
    selector_with(backends, Default::default()).await
}

/// A selector with these engine settings, served on a free port.
pub async fn selector_with(
    backends: &Backends,
    settings: poolgate_select::engine::SelectorSettings,
) -> HarnessResult<(selector_svc::server::Built, SocketAddr)> {
    let (built, address, _) = serve_selector(backends, settings, false).await?;
    Ok((built, address))
}

/// A selector with its status page (`--admin-http-listen`, plain HTTP, login [`ADMIN_TOKEN`]),
/// each on a free port: the selector, its gRPC address and the page's.
pub async fn selector_with_page(
    backends: &Backends,
    settings: poolgate_select::engine::SelectorSettings,
) -> HarnessResult<(selector_svc::server::Built, SocketAddr, SocketAddr)> {
    let (built, address, page) = serve_selector(backends, settings, true).await?;
    let page = page.ok_or("the status page did not start")?;
    Ok((built, address, page))
}

/// The configuration the stack's selectors run with (admin token [`ADMIN_TOKEN`], service token
/// [`SERVICE_TOKEN`], no status page, no TLS), for a test that serves one itself.
pub fn selector_config(
    backends: &Backends,
    settings: poolgate_select::engine::SelectorSettings,
) -> selector_svc::server::Config {
    selector_svc::server::Config {
        usage_retention: None,
        database_url: backends.postgres.url(),
        redis_target: RedisTarget::Single(backends.redis.url()),
        redis_options: RedisOptions::default(),
        keyring: backends.keyring.clone(),
        admin_token: Some(ADMIN_TOKEN.into()),
        admin_http_listen: None,
        settings,
        lease_settings: Default::default(),
        refresh: Default::default(),
        reload_interval: Duration::from_secs(3600),
        refresh_interval: Duration::from_secs(3600),
        max_concurrent_streams: 1000,
        tls: None,
        callers: CallerCheck::Token(SERVICE_TOKEN.into()),
    }
}

async fn serve_selector(
    backends: &Backends,
    settings: poolgate_select::engine::SelectorSettings,
    with_page: bool,
) -> HarnessResult<(selector_svc::server::Built, SocketAddr, Option<SocketAddr>)> {
    let config = selector_config(backends, settings);
    let built = selector_svc::server::build(&config, poolgate_select::metrics::Metrics::new())
        .await
        .map_err(|e| format!("selector: {e}"))?;
    let (listener, address) = listen().await?;
    let (page_listener, page) = if with_page {
        let (listener, page) = listen().await?;
        (Some(listener), Some(page))
    } else {
        (None, None)
    };
    let serving = built.serving();
    tokio::spawn(async move {
        let _ = selector_svc::server::serve_selector_with_page(
            serving,
            &config,
            listener,
            None,
            page_listener,
            std::future::pending(),
        )
        .await;
    });
    Ok((built, address, page))
}

/// An admission replica on Redis (policy `open`), served on a free port.
pub async fn admission(
    redis_url: &str,
    settings: Settings,
) -> HarnessResult<(Arc<LeaseEngine>, SocketAddr)> {
    let config = admission_svc::Config {
        backend: poolgate_lease::LeaseStore::Redis {
            target: RedisTarget::Single(redis_url.to_owned()),
            options: RedisOptions::default(),
            policy: Default::default(),
        },
        settings,
        callers: CallerCheck::Token(SERVICE_TOKEN.into()),
        ..admission_svc::Config::default()
    };
    let engine =
        admission_svc::server::build_engine(&config, poolgate_lease::metrics::Metrics::new())
            .await
            .map_err(|e| format!("admission: {e}"))?;
    let (listener, address) = listen().await?;
    let serving = engine.clone();
    tokio::spawn(async move {
        let _ =
            admission_svc::server::serve(serving, &config, listener, None, std::future::pending())
                .await;
    });
    Ok((engine, address))
}

/// A relay built from `config`, served on a free port.
pub async fn serve(config: Config) -> HarnessResult<(Arc<Relay>, SocketAddr)> {
    let relay = relay_svc::server::build(&config, Metrics::new())?;
    let (listener, address) = listen().await?;
    tokio::spawn(relay_svc::server::serve(
        relay.clone(),
        listener,
        None,
        std::future::pending(),
        Duration::from_secs(1),
    ));
    Ok((relay, address))
}

/// A standalone relay over the accounts of `yaml`, served on a free port.
pub async fn standalone(
    yaml: &str,
    settings: RelaySettings,
    blocks: RuntimeBlockSettings,
) -> HarnessResult<(Arc<Relay>, SocketAddr)> {
    let file = StandaloneFile::parse(yaml)?;
    serve(Config {
        mode: Mode::Standalone {
            file: Arc::new(file),
            state_file: None,
        },
        relay: settings,
        blocks,
        admission: Default::default(),
        shutdown_grace: Duration::from_secs(1),
    })
    .await
}

/// A relay in remote mode over the given endpoints, served on a free port.
pub async fn relay(
    selector: Vec<String>,
    admission: Vec<String>,
    settings: RelaySettings,
) -> HarnessResult<SocketAddr> {
    Ok(relay_with_handle(selector, admission, settings).await?.1)
}

/// A relay in remote mode, and its handle (whose metrics a caller reads: the relay serves
/// `/metrics` on a listener of its own, not on the client port).
pub async fn relay_with_handle(
    selector: Vec<String>,
    admission: Vec<String>,
    settings: RelaySettings,
) -> HarnessResult<(Arc<Relay>, SocketAddr)> {
    relay_with_lease_channels(
        selector,
        admission,
        settings,
        relay_svc::remote::DEFAULT_LEASE_CHANNELS,
    )
    .await
}

/// [`relay_with_handle`] with `lease_channels` lease channels toward admission (the relay's
/// `--lease-channels`; 0: one stream per lease).
pub async fn relay_with_lease_channels(
    selector: Vec<String>,
    admission: Vec<String>,
    settings: RelaySettings,
    lease_channels: usize,
) -> HarnessResult<(Arc<Relay>, SocketAddr)> {
    remote(
        selector,
        admission,
        settings,
        lease_channels,
        Some(Default::default()),
    )
    .await
}

/// [`relay_with_handle`] selecting at the edge with `edge` (`None`: the selector plans).
pub async fn relay_with_edge(
    selector: Vec<String>,
    admission: Vec<String>,
    settings: RelaySettings,
    edge: Option<poolgate_client::edge::EdgeSelectionSettings>,
) -> HarnessResult<(Arc<Relay>, SocketAddr)> {
    remote(
        selector,
        admission,
        settings,
        relay_svc::remote::DEFAULT_LEASE_CHANNELS,
        edge,
    )
    .await
}

async fn remote(
    selector: Vec<String>,
    admission: Vec<String>,
    settings: RelaySettings,
    lease_channels: usize,
    edge: Option<poolgate_client::edge::EdgeSelectionSettings>,
) -> HarnessResult<(Arc<Relay>, SocketAddr)> {
    serve(Config {
        mode: Mode::Remote {
            selector,
            admission,
            client: GrpcClient {
                service_token: Some(SERVICE_TOKEN.into()),
                lease_channels,
                ..Default::default()
            },
            edge,
        },
        relay: settings,
        blocks: Default::default(),
        admission: Default::default(),
        shutdown_grace: Duration::from_secs(1),
    })
    .await
}
