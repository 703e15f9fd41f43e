//! Building blocks for the distributed-mode tests: private Postgres and Redis with the schema
//! applied, a selector, admission replicas and a relay in this process, each on a free port.

#![allow(dead_code)]

pub mod processes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use admission_svc::admission::Admission;
use poolgate_core::account::{CredentialKind, Platform, Secret};
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_testkit::{PostgresServer, RedisServer};
use relay_svc::metrics::Metrics;
use relay_svc::proxy::RelaySettings;
use selector_svc::crypto::Keyring;
use selector_svc::store::{AccountInput, ConfigStore};

/// The service token the test's selector and admission require; the relay sends it.
pub const SERVICE_TOKEN: &str = "test-service-token";

/// Postgres (migrated) and Redis, private to the test.
pub struct Backends {
    pub postgres: PostgresServer,
    pub redis: RedisServer,
    pub keyring: Keyring,
    pub store: ConfigStore,
}

pub async fn backends() -> Backends {
    let (postgres, redis) = tokio::join!(PostgresServer::start(), RedisServer::start());
    let (postgres, redis) = (postgres.expect("postgres"), redis.expect("redis"));
    let keyring =
        Keyring::parse(&format!("k1:{}", Keyring::generate_key()), None).expect("keyring");
    let store = ConfigStore::connect(&postgres.url(), Arc::new(keyring.clone()))
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    Backends {
        postgres,
        redis,
        keyring,
        store,
    }
}

/// An Anthropic API-key account in group `default` with credential `cred-<name>`.
pub fn account(name: &str, base_url: &str, concurrency: i32, priority: i32) -> AccountInput {
    AccountInput {
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

/// A selector served on a free port; keep the `Built` alive for as long as it should run.
pub async fn selector(backends: &Backends) -> (selector_svc::server::Built, SocketAddr) {
    let config = selector_svc::server::Config {
        database_url: backends.postgres.url(),
        redis_target: RedisTarget::Single(backends.redis.url()),
        redis_options: RedisOptions::default(),
        keyring: backends.keyring.clone(),
        admin_token: Some("admin".into()),
        settings: Default::default(),
        refresh: Default::default(),
        reload_interval: Duration::from_secs(3600),
        refresh_interval: Duration::from_secs(3600),
        max_concurrent_streams: 1000,
        tls: None,
        callers: poolgate_runtime::service_auth::CallerCheck::Token(SERVICE_TOKEN.into()),
    };
    let built = selector_svc::server::build(&config, selector_svc::metrics::Metrics::new())
        .await
        .expect("selector");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let serving = built.serving();
    tokio::spawn(async move {
        let _ = selector_svc::server::serve_selector(
            serving,
            &config,
            listener,
            None,
            std::future::pending(),
        )
        .await;
    });
    (built, addr)
}

/// An admission replica on Redis (policy `open`), served on a free port.
pub async fn admission(
    redis_url: &str,
    settings: poolgate_core::lease::Settings,
) -> (Arc<Admission>, SocketAddr) {
    let config = admission_svc::Config {
        backend: admission_svc::BackendConfig::Redis {
            target: RedisTarget::Single(redis_url.to_owned()),
            options: RedisOptions::default(),
            policy: Default::default(),
        },
        settings,
        callers: poolgate_runtime::service_auth::CallerCheck::Token(SERVICE_TOKEN.into()),
        ..admission_svc::Config::default()
    };
    let engine =
        admission_svc::server::build_admission(&config, admission_svc::metrics::Metrics::new())
            .await
            .expect("admission");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let serving = engine.clone();
    tokio::spawn(async move {
        let _ =
            admission_svc::server::serve(serving, &config, listener, None, std::future::pending())
                .await;
    });
    (engine, addr)
}

/// A relay built from `config`, served on a free port.
pub async fn serve(
    config: relay_svc::server::Config,
) -> (Arc<relay_svc::proxy::Relay>, SocketAddr) {
    let relay = relay_svc::server::build(&config, Metrics::new()).expect("relay builds");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(relay_svc::server::serve(
        relay.clone(),
        listener,
        None,
        std::future::pending(),
        Duration::from_secs(1),
    ));
    (relay, addr)
}

/// A standalone relay over the accounts of `yaml`, served on a free port.
pub async fn standalone(
    yaml: &str,
    settings: RelaySettings,
    blocks: poolgate_core::outcome::RuntimeBlockSettings,
) -> (Arc<relay_svc::proxy::Relay>, SocketAddr) {
    let file = relay_svc::standalone::StandaloneFile::parse(yaml).expect("config file");
    serve(relay_svc::server::Config {
        mode: relay_svc::server::Mode::Standalone {
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
) -> SocketAddr {
    relay_with_handle(selector, admission, settings).await.1
}

/// A relay in remote mode, and its handle (whose metrics a test reads: the relay serves
/// `/metrics` on a listener of its own, not on the client port).
pub async fn relay_with_handle(
    selector: Vec<String>,
    admission: Vec<String>,
    settings: RelaySettings,
) -> (Arc<relay_svc::proxy::Relay>, SocketAddr) {
    serve(relay_svc::server::Config {
        mode: relay_svc::server::Mode::Remote {
            selector,
            admission,
            client: relay_svc::remote::GrpcClient {
                service_token: Some(SERVICE_TOKEN.into()),
                ..Default::default()
            },
        },
        relay: settings,
        blocks: Default::default(),
        admission: Default::default(),
        shutdown_grace: Duration::from_secs(1),
    })
    .await
}
