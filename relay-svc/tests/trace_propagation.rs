//! One client request is one trace, as an operator's collector sees it: the three services run as
//! their own processes, each exporting over OTLP (`OTEL_EXPORTER_OTLP_ENDPOINT`) to a real OTLP
//! gRPC receiver in this test, and the request's trace holds the relay's request span, the
//! selector's spans and admission's span for the request's lease, a descendant of the request
//! span. On the lease channel (the default) the channel's gRPC metadata is the channel's own, so
//! each conversation carries its request's trace context in its messages; on single-lease streams
//! (`--lease-channels 0`) the stream's metadata carries it.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::processes::{Env, Process};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use poolgate_testkit::fake_upstream::FakeUpstream;
use poolgate_testkit::{PostgresServer, RedisServer, eventually, free_port};
use serde_json::json;

/// One span as the receiver got it.
#[derive(Debug, Clone)]
struct Seen {
    service: String,
    name: String,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    method: String,
}

/// An OTLP trace receiver: keeps every span exported to it.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Seen>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut seen = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|resource| &resource.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| string(kv.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for span in resource_spans
                .scope_spans
                .into_iter()
                .flat_map(|scope| scope.spans)
            {
                let method = span
                    .attributes
                    .iter()
                    .find(|kv| kv.key == "rpc.method")
                    .and_then(|kv| string(kv.value.as_ref()?.value.as_ref()?))
                    .unwrap_or_default();
                seen.push(Seen {
                    service: service.clone(),
                    name: span.name,
                    trace: span.trace_id,
                    id: span.span_id,
                    parent: span.parent_span_id,
                    method,
                });
            }
        }
        self.spans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(seen);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn string(value: &Value) -> Option<String> {
    match value {
        Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

impl Receiver {
    fn spans(&self) -> Vec<Seen> {
        self.spans.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Whether `span` descends from the span `ancestor` through the parents the receiver saw.
fn descends_from(span: &Seen, ancestor: &[u8], by_id: &HashMap<Vec<u8>, Seen>) -> bool {
    let mut parent = span.parent.clone();
    for _ in 0..64 {
        if parent.is_empty() {
            return false;
        }
        if parent == ancestor {
            return true;
        }
        match by_id.get(&parent) {
            Some(next) => parent = next.parent.clone(),
            None => return false,
        }
    }
    false
}

/// The distributed stack as processes exporting to `receiver`, the relay started with
/// `relay_args` besides its addresses; answers the relay's base URL and a client key.
struct Stack {
    base: String,
    key: String,
    _processes: Vec<Process>,
    _backends: (PostgresServer, RedisServer, FakeUpstream),
}

async fn stack(receiver_port: u16, relay_args: &[&str]) -> Stack {
    let (postgres, redis) = tokio::join!(PostgresServer::start(), RedisServer::start());
    let (postgres, redis) = (postgres.expect("postgres"), redis.expect("redis"));
    let upstream = FakeUpstream::start().await.expect("upstream");
    let (selector_port, admission_port, relay_port) = (
        free_port().expect("port"),
        free_port().expect("port"),
        free_port().expect("port"),
    );
    let port = || free_port().expect("port").to_string();
    let env = Env {
        vars: vec![
            ("POOLGATE_DATABASE_URL".into(), postgres.url()),
            ("POOLGATE_REDIS_URL".into(), redis.url()),
            (
                "POOLGATE_CREDENTIAL_KEYS".into(),
                format!("k1:{}", poolgate_select::crypto::Keyring::generate_key()),
            ),
            ("SELECTOR_ADMIN_TOKEN".into(), "admin-token".into()),
            (
                "SELECTOR_LISTEN".into(),
                format!("127.0.0.1:{selector_port}"),
            ),
            (
                "SELECTOR_METRICS_LISTEN".into(),
                format!("127.0.0.1:{}", port()),
            ),
            (
                "SELECTOR_ENDPOINT".into(),
                format!("http://127.0.0.1:{selector_port}"),
            ),
            (
                "ADMISSION_LISTEN".into(),
                format!("127.0.0.1:{admission_port}"),
            ),
            (
                "ADMISSION_METRICS_LISTEN".into(),
                format!("127.0.0.1:{}", port()),
            ),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
                format!("http://127.0.0.1:{receiver_port}"),
            ),
            // Export within 100 ms instead of the default 5 s.
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
        ],
    };
    let migrated = env.run("selector-svc", &["migrate"], &[]);
    assert!(migrated.contains("migrations applied"), "{migrated}");
    let mut processes = vec![
        env.spawn("selector-svc", "trace-selector", &[]),
        env.spawn("admission-svc", "trace-admission", &[]),
    ];
    let (listen, metrics, selector, admission) = (
        format!("127.0.0.1:{relay_port}"),
        format!("127.0.0.1:{}", port()),
        format!("http://127.0.0.1:{selector_port}"),
        format!("http://127.0.0.1:{admission_port}"),
    );
    let mut args = vec![
        "--listen",
        &listen,
        "--metrics-listen",
        &metrics,
        "--selector-url",
        &selector,
        "--admission-url",
        &admission,
    ];
    args.extend_from_slice(relay_args);
    processes.push(env.spawn("relay-svc", "trace-relay", &args));
    eventually(Duration::from_secs(20), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", selector_port))
            .await
            .ok()
            .map(|_| ())
    })
    .await
    .expect("selector listens");
    env.run(
        "selector-svc",
        &[
            "admin",
            "upsert-account",
            "--name",
            "traced",
            "--group",
            "default",
            "--platform",
            "anthropic",
            "--base-url",
            &upstream.base_url,
            "--concurrency",
            "4",
        ],
        &[("ACCOUNT_CREDENTIAL", "cred-traced")],
    );
    let key = env.create_key("alice", "default");
    Stack {
        base: format!("http://127.0.0.1:{relay_port}"),
        key,
        _processes: processes,
        _backends: (postgres, redis, upstream),
    }
}

/// Sends requests until one is answered 200 (the stack is up), then one more whose trace is
/// checked: the receiver must get, in that request's trace, the relay's `request` span, the
/// selector's `Select` (when the relay asks it), and an admission span for its lease that descends from the request span.
/// `asks_selector`: the relay plans through the selector's `Select` (`--edge-selection=false`), and
/// that span must be in the request's trace too; a relay selecting at the edge makes no selector
/// call for the request (docs/DESIGN.md §2).
async fn one_request_is_one_trace(relay_args: &[&str], asks_selector: bool) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let receiver = Receiver::default();
    let receiver_port = free_port().expect("port");
    let server = TraceServiceServer::new(receiver.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server)
            .serve(([127, 0, 0, 1], receiver_port).into()),
    );
    let stack = stack(receiver_port, relay_args).await;
    let http = reqwest::Client::new();
    let send = || {
        http.post(format!("{}/v1/messages", stack.base))
            .header("x-api-key", &stack.key)
            .header("x-request-id", "traced-request")
            .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    eventually(Duration::from_secs(20), || async {
        let response = send().await.ok()?;
        (response.status().as_u16() == 200).then_some(())
    })
    .await
    .expect("a request goes through the three processes");
    // Every span of one request, once exported: the last request span's trace.
    let found = eventually(Duration::from_secs(15), || async {
        let spans = receiver.spans();
        let request = spans
            .iter()
            .rev()
            .find(|s| s.service == "relay-svc" && s.name == "request")?
            .clone();
        let in_trace: Vec<Seen> = spans
            .into_iter()
            .filter(|s| s.trace == request.trace)
            .collect();
        let by_id: HashMap<Vec<u8>, Seen> =
            in_trace.iter().map(|s| (s.id.clone(), s.clone())).collect();
        let lease = in_trace.iter().any(|s| {
            s.service == "admission-svc"
                && s.method.contains("Admission/Lease")
                && descends_from(s, &request.id, &by_id)
        });
        let select = in_trace
            .iter()
            .any(|s| s.service == "selector-svc" && s.method.ends_with("Selector/Select"));
        (lease && (select || !asks_selector)).then_some(())
    })
    .await;
    if found.is_err() {
        let spans = receiver.spans();
        let summary: Vec<String> = spans
            .iter()
            .map(|s| {
                format!(
                    "{} {} {} trace={:02x?} parent={:02x?}",
                    s.service,
                    s.name,
                    s.method,
                    &s.trace[..4.min(s.trace.len())],
                    &s.parent[..4.min(s.parent.len())]
                )
            })
            .collect();
        panic!(
            "no request trace held the selector's Select and admission's lease span under the request: {summary:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_one_trace_on_the_lease_channel() {
    one_request_is_one_trace(&[], false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_one_trace_on_single_lease_streams_planned_by_the_selector() {
    one_request_is_one_trace(
        &["--lease-channels", "0", "--edge-selection", "false"],
        true,
    )
    .await;
}
