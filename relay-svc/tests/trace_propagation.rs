//! One client request is one trace: the relay's request span and the selector's and admission's
//! gRPC server spans share its trace id, carried as W3C trace context in gRPC metadata (the
//! services run in this process, but each server span starts on a fresh task, so only the
//! metadata can link them).

use std::sync::Arc;
use std::time::Duration;

use admission_svc::redis_conn::{RedisOptions, RedisTarget};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use poolgate_testkit::{PostgresServer, RedisServer};
use relay_svc::fake_upstream::FakeUpstream;
use relay_svc::metrics::Metrics;
use selector_svc::crypto::Keyring;
use selector_svc::domain::{CredentialKind, Platform, Secret};
use selector_svc::store::{AccountInput, ConfigStore};
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_request_is_one_trace_across_relay_selector_and_admission() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    admission_svc::telemetry::install_propagator();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    tracing::subscriber::set_global_default(subscriber).expect("subscriber");

    let (postgres, redis) = tokio::join!(PostgresServer::start(), RedisServer::start());
    let (postgres, redis) = (postgres.expect("postgres"), redis.expect("redis"));
    let keyring =
        Keyring::parse(&format!("k1:{}", Keyring::generate_key()), None).expect("keyring");
    let store = ConfigStore::connect(&postgres.url(), Arc::new(keyring.clone()))
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let upstream = FakeUpstream::start().await.expect("upstream");
    store
        .upsert_account(&AccountInput {
            name: "a".into(),
            group: "default".into(),
            platform: Platform::Anthropic,
            base_url: upstream.base_url.clone(),
            credential_kind: CredentialKind::ApiKey,
            credential: Some(Secret::new("k-a")),
            oauth: None,
            priority: 0,
            weight: 1,
            concurrency_limit: 4,
            rpm_limit: 0,
            session_window_limit_usd: 0.0,
            allowed_models: vec![],
            model_mapping: Default::default(),
            proxy_url: None,
        })
        .await
        .expect("account");
    let (_, key) = store
        .create_api_key("t", "u", "default", 0)
        .await
        .expect("key");
    let target = RedisTarget::Single(redis.url());
    let selector_config = selector_svc::server::Config {
        database_url: postgres.url(),
        redis_target: target.clone(),
        redis_options: RedisOptions::default(),
        keyring,
        admin_token: None,
        settings: Default::default(),
        refresh: Default::default(),
        reload_interval: Duration::from_secs(3600),
        refresh_interval: Duration::from_secs(3600),
        max_concurrent_streams: 1000,
        tls: None,
    };
    let selector =
        selector_svc::server::build(&selector_config, selector_svc::metrics::Metrics::new())
            .await
            .expect("selector");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let selector_addr = listener.local_addr().expect("addr");
    let serving = selector.selector.clone();
    tokio::spawn(async move {
        let _ = selector_svc::server::serve_selector(
            serving,
            &selector_config,
            listener,
            None,
            std::future::pending(),
        )
        .await;
    });
    let admission_config = admission_svc::Config {
        backend: admission_svc::BackendConfig::Redis {
            target,
            options: RedisOptions::default(),
            policy: Default::default(),
        },
        ..admission_svc::Config::default()
    };
    let admission = admission_svc::server::build_admission(
        &admission_config,
        admission_svc::metrics::Metrics::new(),
    )
    .await
    .expect("admission");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let admission_addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = admission_svc::server::serve(
            admission,
            &admission_config,
            listener,
            None,
            std::future::pending(),
        )
        .await;
    });
    let config = relay_svc::server::Config {
        mode: relay_svc::server::Mode::Remote {
            selector: vec![format!("http://{selector_addr}")],
            admission: vec![format!("http://{admission_addr}")],
            tls_ca: None,
        },
        relay: Default::default(),
        blocks: Default::default(),
        admission: Default::default(),
        shutdown_grace: Duration::from_secs(1),
    };
    let relay = relay_svc::server::build(&config, Metrics::new()).expect("relay");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(relay_svc::server::serve(
        relay,
        listener,
        std::future::pending(),
        Duration::from_secs(1),
    ));

    let response = reqwest::Client::new()
        .post(format!("http://{addr}/v1/messages"))
        .header("x-api-key", key.expose())
        .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status().as_u16(), 200);
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains(r#"grpc_client_requests_total{code="Ok",method="Selector/Select"} 1"#),
        "the relay counts its gRPC calls: {metrics}"
    );
    assert!(metrics.contains(r#"method="Admission/Lease""#), "{metrics}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = provider.force_flush();
    let spans = exporter.get_finished_spans().expect("spans");
    let request = spans
        .iter()
        .find(|s| s.name == "request")
        .expect("the relay's request span");
    let trace = request.span_context.trace_id();
    let server_methods: Vec<String> = spans
        .iter()
        .filter(|s| s.name == "grpc.server" && s.span_context.trace_id() == trace)
        .flat_map(|s| {
            s.attributes
                .iter()
                .filter(|kv| kv.key.as_str() == "rpc.method")
                .map(|kv| kv.value.to_string())
        })
        .collect();
    assert!(
        server_methods
            .iter()
            .any(|m| m.ends_with("Selector/Select")),
        "selector span in the trace: {server_methods:?}"
    );
    assert!(
        server_methods
            .iter()
            .any(|m| m.ends_with("Admission/Lease")),
        "admission span in the trace: {server_methods:?}"
    );
    assert!(
        server_methods
            .iter()
            .any(|m| m.ends_with("Selector/Authenticate")),
        "{server_methods:?}"
    );
}
