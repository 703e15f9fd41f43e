//! Logs and traces for every poolgate service: `tracing` with a text or JSON formatter, and
//! OpenTelemetry spans exported over OTLP when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` is set
//! (off otherwise). W3C trace context travels in gRPC metadata: [`TraceLayer`] continues it on
//! every gRPC server, [`Inject`] adds it on the relay's clients, so one client request is one
//! trace across relay, selector and admission. Where one gRPC stream carries many requests' work
//! (a lease channel), each message carries its request's context itself: [`context_map`] writes
//! it, [`span_with_parent`] continues it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Keeps the tracer provider alive; flushes spans when dropped.
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the W3C trace-context propagator (always, so context is carried even when this
/// process exports nothing).
pub fn install_propagator() {
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
}

/// The `--log-format` flag of every binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    /// The name [`init`] takes.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// Sets up logging (`json` or text, filtered by `RUST_LOG`, default `info`) and, when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set, span export over OTLP.
pub fn init(service: &'static str, log_format: &str) -> Telemetry {
    install_propagator();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let provider = std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").and_then(|_| {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build();
        match exporter {
            Ok(exporter) => Some(
                opentelemetry_sdk::trace::SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(
                        opentelemetry_sdk::Resource::builder()
                            .with_service_name(service)
                            .build(),
                    )
                    .build(),
            ),
            Err(error) => {
                eprintln!("{service}: OTLP exporter not started: {error}");
                None
            }
        }
    });
    let otel = provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer(service)));
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    let result = if log_format == "json" {
        registry
            .with(tracing_subscriber::fmt::layer().json())
            .try_init()
    } else {
        registry.with(tracing_subscriber::fmt::layer()).try_init()
    };
    if let Err(error) = result {
        eprintln!("{service}: logging already set up: {error}");
    }
    Telemetry { provider }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// Server side: one span per gRPC request, continuing the caller's trace from its metadata.
#[derive(Clone, Copy, Default)]
pub struct TraceLayer;

impl<S> tower::Layer<S> for TraceLayer {
    type Service = TraceService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TraceService { inner }
    }
}

#[derive(Clone)]
pub struct TraceService<S> {
    inner: S,
}

impl<S, B, R> tower::Service<http::Request<B>> for TraceService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>> + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.extract(&HeaderExtractor(request.headers()))
        });
        let span = tracing::info_span!("grpc.server", rpc.method = %request.uri().path());
        let _ = span.set_parent(parent);
        let future = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        Box::pin(future.instrument(span))
    }
}

/// Client side: adds the current span's trace context to every outgoing gRPC request.
#[derive(Clone)]
pub struct Inject<S> {
    inner: S,
}

impl<S> Inject<S> {
    pub fn new(inner: S) -> Self {
        Inject { inner }
    }
}

impl<S, B> tower::Service<http::Request<B>> for Inject<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let context = tracing::Span::current().context();
        opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.inject_context(&context, &mut HeaderInjector(request.headers_mut()))
        });
        self.inner.call(request)
    }
}

/// The current span's W3C trace context as a message field carries it (`traceparent`, and
/// `tracestate` when there is one); empty when the current span belongs to no exported trace, so
/// a process that exports nothing sends nothing.
pub fn context_map() -> HashMap<String, String> {
    let context = tracing::Span::current().context();
    let mut map = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut map)
    });
    map
}

/// Makes `span` a child of the trace context a message carried ([`context_map`]'s). A context
/// that is empty or does not parse leaves `span` where it was.
pub fn span_with_parent(span: &tracing::Span, carried: &HashMap<String, String>) {
    if carried.is_empty() {
        return;
    }
    let parent =
        opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(carried));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}
