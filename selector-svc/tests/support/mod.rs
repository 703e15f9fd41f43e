//! Selector test helpers: a private Postgres and Redis per test, migrations applied, selector
//! replicas built in-process and served on port 0, and the test kit's fake upstream for the
//! confirmation probe.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use poolgate_core::account::{CredentialKind, OAuthState, Platform, Secret};
use poolgate_core::outcome::RuntimeBlockSettings;
use poolgate_proto::selector::v1 as pb;
use poolgate_proto::selector::v1::selector_admin_client::SelectorAdminClient;
use poolgate_proto::selector::v1::selector_client::SelectorClient;
use poolgate_rpc::service_auth::{CallerCheck, WithToken};
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_select::crypto::Keyring;
use poolgate_select::engine::SelectorSettings;
use poolgate_select::metrics::Metrics;
use poolgate_testkit::fake_upstream::{FakeUpstream, Scripted};
use poolgate_testkit::{PostgresServer, RedisServer};
use selector_svc::server::{self, Built, Config};
use selector_svc::store::{AccountInput, PostgresSource};
use tokio::sync::oneshot;
use tonic::transport::Channel;

pub const ADMIN_TOKEN: &str = "test-admin-token";

/// The service token the test selectors require; their clients send it.
pub const SERVICE_TOKEN: &str = "test-service-token";

pub type Client = SelectorClient<WithToken<Channel>>;
pub type AdminClient = SelectorAdminClient<WithToken<Channel>>;

/// A channel that sends the service token.
pub fn with_token(channel: Channel) -> WithToken<Channel> {
    WithToken::new(channel, Some(SERVICE_TOKEN))
}

pub struct Backends {
    pub postgres: PostgresServer,
    pub redis: RedisServer,
    pub keyring: Keyring,
    pub store: PostgresSource,
}

impl Backends {
    pub async fn start() -> Self {
        let (postgres, redis) = tokio::join!(PostgresServer::start(), RedisServer::start());
        let postgres = postgres.expect("postgres starts");
        let redis = redis.expect("redis starts");
        let keyring =
            Keyring::parse(&format!("k1:{}", Keyring::generate_key()), None).expect("keyring");
        let store = PostgresSource::connect(&postgres.url(), Arc::new(keyring.clone()))
            .await
            .expect("postgres connects");
        store.migrate().await.expect("migrations apply");
        Backends {
            postgres,
            redis,
            keyring,
            store,
        }
    }

    pub fn config(&self, settings: SelectorSettings) -> Config {
        Config {
            usage_retention: None,
            database_url: self.postgres.url(),
            redis_target: RedisTarget::Single(self.redis.url()),
            redis_options: RedisOptions::default(),
            keyring: self.keyring.clone(),
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

    /// Adds an API-key account to `group`; returns its id.
    pub async fn account(
        &self,
        name: &str,
        group: &str,
        tweak: impl FnOnce(&mut AccountInput),
    ) -> i64 {
        let mut input = api_account(name, group);
        tweak(&mut input);
        self.store
            .upsert_account(&input)
            .await
            .expect("account stored")
    }
}

/// The API key `api_account` gives account `name`.
/// A private Postgres, migrated, and the store over it with a fresh key ring (the server stops
/// when dropped).
pub async fn migrated_store() -> (PostgresServer, PostgresSource) {
    let postgres = PostgresServer::start().await.expect("postgres");
    let keyring = Arc::new(
        Keyring::parse(&format!("k1:{}", Keyring::generate_key()), None).expect("keyring"),
    );
    let store = PostgresSource::connect(&postgres.url(), keyring)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    (postgres, store)
}

pub fn credential(name: &str) -> String {
    format!("sk-ant-{name}-secret-credential")
}

pub fn api_account(name: &str, group: &str) -> AccountInput {
    AccountInput {
        serves: Vec::new(),
        name: name.into(),
        group: group.into(),
        platform: Platform::Anthropic,
        base_url: "http://127.0.0.1:9".into(),
        credential_kind: CredentialKind::ApiKey,
        credential: Some(Secret::new(credential(name))),
        oauth: None,
        priority: 0,
        weight: 1,
        concurrency_limit: 5,
        rpm_limit: 0,
        session_window_limit_usd: 0.0,
        allowed_models: vec![],
        model_mapping: HashMap::new(),
        proxy_url: None,
        probe_model: None,
        stream_usage: true,
    }
}

pub fn oauth(refresh_token: &str, expires_at_ms: i64, token_url: &str) -> OAuthState {
    OAuthState {
        refresh_token: Secret::new(refresh_token),
        expires_at_ms,
        token_url: token_url.into(),
        client_id: String::new(),
    }
}

/// Short blocks and breaker periods, so tests see them end.
pub fn fast_settings() -> SelectorSettings {
    SelectorSettings {
        blocks: RuntimeBlockSettings {
            broken_block: Duration::from_millis(100),
            unauthorized_block: Duration::from_millis(100),
            breaker_open: Duration::from_millis(400),
            breaker_max_open: Duration::from_millis(3_000),
            ..RuntimeBlockSettings::default()
        },
        ..SelectorSettings::default()
    }
}

/// One selector replica served on a free port.
pub struct Replica {
    pub built: Built,
    pub client: Client,
    pub admin: AdminClient,
    pub addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl Replica {
    pub async fn start(config: Config) -> Self {
        let built = server::build(&config, Metrics::new())
            .await
            .expect("selector builds");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = ServeParts {
            serving: built.serving(),
            config,
        };
        tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(error) = serving.serve(listener, shutdown).await {
                eprintln!("selector test server failed: {error}");
            }
        });
        let endpoint = format!("http://{addr}");
        let mut channel = None;
        for _ in 0..100 {
            if let Ok(connected) = Channel::from_shared(endpoint.clone())
                .expect("endpoint")
                .connect()
                .await
            {
                channel = Some(connected);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let channel = channel.expect("selector accepts connections");
        Replica {
            built,
            client: SelectorClient::new(with_token(channel.clone())),
            admin: SelectorAdminClient::new(with_token(channel)),
            addr,
            stop: Some(stop),
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// What `server::serve` needs, owned by the serving task.
struct ServeParts {
    serving: server::Serving,
    config: Config,
}

impl ServeParts {
    async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), server::ServeError> {
        server::serve_selector(self.serving, &self.config, listener, None, shutdown).await
    }
}

pub fn select_request(group: &str, model: &str) -> pb::SelectRequest {
    pb::SelectRequest {
        group: group.into(),
        platform: pb::Platform::Anthropic as i32,
        model: model.into(),
        ..Default::default()
    }
}

/// Adds an admin bearer token to a request.
pub fn admin<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {ADMIN_TOKEN}").parse().expect("header"),
    );
    request
}

/// The test kit's fake upstream, every answer `status` with `body` after `delay` (until the
/// test sets another standing answer). The selector's probe is the only caller in these tests.
pub async fn upstream(status: u16, body: &str, delay: Duration) -> FakeUpstream {
    let upstream = FakeUpstream::start().await.expect("fake upstream starts");
    upstream.set_delay(delay);
    upstream.set_standing_answer(Some(Scripted::Fail {
        status,
        headers: Vec::new(),
        body: body.to_owned(),
    }));
    upstream
}

/// What an outcome report applied, read from the `effect` enum; the deprecated `applied` string
/// the selector fills next to it must say the same.
#[allow(deprecated)]
pub fn effect(answer: &pb::ReportOutcomeResponse) -> &'static str {
    let effect = poolgate_proto::convert::effect(answer.effect, "")
        .expect("the selector sets the effect enum");
    assert_eq!(
        answer.applied,
        effect.as_str(),
        "the deprecated applied string says what the enum says"
    );
    effect.as_str()
}
