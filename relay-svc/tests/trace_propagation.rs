//! One client request is one trace: the relay's request span and the selector's and admission's
//! gRPC server spans share its trace id, carried as W3C trace context in gRPC metadata (the
//! services run in this process, but each server span starts on a fresh task, so only the
//! metadata can link them).

mod common;

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use poolgate_testkit::fake_upstream::FakeUpstream;
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_request_is_one_trace_across_relay_selector_and_admission() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    poolgate_rpc::telemetry::install_propagator();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    tracing::subscriber::set_global_default(subscriber).expect("subscriber");

    let backends = common::backends().await.expect("backends start");
    let upstream = FakeUpstream::start().await.expect("upstream");
    backends
        .store
        .upsert_account(&common::account("a", &upstream.base_url, 4, 0))
        .await
        .expect("account");
    let (_, key) = backends
        .store
        .create_api_key("t", "u", "default", 0)
        .await
        .expect("key");
    let (_selector, selector_addr) = common::selector(&backends).await.expect("selector starts");
    let (_admission, admission_addr) = common::admission(&backends.redis.url(), Default::default())
        .await
        .expect("admission starts");
    let (relay, addr) = common::serve(relay_svc::server::Config {
        mode: relay_svc::server::Mode::Remote {
            selector: vec![format!("http://{selector_addr}")],
            admission: vec![format!("http://{admission_addr}")],
            client: relay_svc::remote::GrpcClient {
                service_token: Some(common::SERVICE_TOKEN.into()),
                // One stream per lease: a lease channel carries many requests' leases, so its
                // conversations carry no request's trace context.
                lease_channels: 0,
                ..Default::default()
            },
        },
        relay: Default::default(),
        blocks: Default::default(),
        admission: Default::default(),
        shutdown_grace: std::time::Duration::from_secs(1),
    })
    .await
    .expect("relay starts");

    let response = reqwest::Client::new()
        .post(format!("http://{addr}/v1/messages"))
        .header("x-api-key", key.expose())
        .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status().as_u16(), 200);
    // The relay's registry, as its metrics listener serves it.
    let metrics = relay.metrics.render();
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
