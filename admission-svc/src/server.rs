//! Wiring: build the backend and the engine from config, serve gRPC (admission, health,
//! reflection) and `/metrics`, and stop on the shutdown signal.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use poolgate_proto::admission::v1::admission_server::AdmissionServer;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

use crate::grpc::AdmissionGrpc;
use poolgate_core::Clock;
use poolgate_core::lease::Settings;
use poolgate_lease::channel::ChannelSettings;
use poolgate_lease::metrics::Metrics;
use poolgate_lease::{LeaseEngine, LeaseStore};
use poolgate_rpc::service_auth::CallerCheck;
use poolgate_rpc::tls::TlsFiles;
use poolgate_runtime::error::StateError;

#[derive(Debug, Clone)]
pub struct Config {
    pub settings: Settings,
    pub backend: LeaseStore,
    /// HTTP/2 streams per connection; each `Lease` stream is one lease, so this bounds the
    /// leases one connection may hold that way (hyper's default of 200 is far too low). A lease
    /// channel is one stream for many leases, bounded by `channel`.
    pub max_concurrent_streams: u32,
    /// The lease channel's limits (the conversations one channel may hold open).
    pub channel: ChannelSettings,
    /// After the shutdown signal, how long open lease streams may go on.
    pub shutdown_grace: Duration,
    /// PEM certificate chain and key: serve gRPC over TLS. `None`: plaintext (inside a trusted
    /// network only; see docs/SECURITY.md).
    pub tls: Option<TlsFiles>,
    /// How callers prove who they are (service token, mutual TLS, or open for development).
    pub callers: CallerCheck,
    /// The clock the engine runs on: the system's, or a test's manual clock.
    pub clock: Clock,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            settings: Settings::default(),
            backend: LeaseStore::Memory,
            max_concurrent_streams: 100_000,
            channel: ChannelSettings::default(),
            shutdown_grace: Duration::from_secs(30),
            tls: None,
            callers: CallerCheck::Open,
            clock: Clock::system(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot reach redis: {0}")]
    Redis(#[from] StateError),
    #[error("grpc server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("reflection service failed: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("tls: {0}")]
    Tls(String),
}

/// Builds the engine for `config` with its background tasks (`poolgate_lease::start`).
pub async fn build_engine(
    config: &Config,
    metrics: Metrics,
) -> Result<Arc<LeaseEngine>, ServeError> {
    Ok(poolgate_lease::start(
        &config.backend,
        config.settings.clone(),
        metrics,
        config.clock.clone(),
    )
    .await?)
}

/// Serves admission on `listener` (and `/metrics` on `metrics_listener`) until `shutdown`.
pub async fn run(
    config: Config,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let admission = build_engine(&config, Metrics::new()).await?;
    serve(admission, &config, listener, metrics_listener, shutdown).await
}

/// Serves an already built engine (tests keep a handle on it to set cooldowns, read metrics).
pub async fn serve(
    admission: Arc<LeaseEngine>,
    config: &Config,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let metrics = admission.metrics().clone();
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<AdmissionServer<AdmissionGrpc>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(poolgate_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;

    let metrics_task = metrics_listener.map(|listener| {
        let metrics = metrics.clone();
        poolgate_rpc::metrics_http::spawn(listener, move || metrics.render())
    });

    let local = listener.local_addr().ok();
    tracing::info!(addr = ?local, "admission serving");
    // On the shutdown signal: report NOT_SERVING, stop accepting, and keep serving the lease
    // streams already open until they end or the grace runs out. Leases still open then are not
    // released (their requests may still be running elsewhere): they are left to the orphan
    // grace, within which the relay resumes them on another replica.
    let (signalled, signal_received) = tokio::sync::oneshot::channel::<()>();
    let reporter = health_reporter.clone();
    let shutdown = async move {
        shutdown.await;
        reporter
            .set_not_serving::<AdmissionServer<AdmissionGrpc>>()
            .await;
        tracing::info!("shutting down: no new connections; open lease streams may finish");
        let _ = signalled.send(());
    };
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &config.tls {
        let tls = tls
            .server_config()
            .map_err(|e| ServeError::Tls(format!("cannot read the certificate or key: {e}")))?;
        builder = builder.tls_config(tls)?;
    }
    let server = builder
        .layer(poolgate_rpc::grpc_metrics::GrpcMetrics::new(
            &metrics.registry,
            served_methods(),
        ))
        .layer(poolgate_rpc::telemetry::TraceLayer)
        .layer(config.callers.layer())
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(5)))
        .max_concurrent_streams(Some(config.max_concurrent_streams))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(AdmissionServer::new(AdmissionGrpc::new(
            admission.clone(),
            config.channel,
        )))
        .serve_with_incoming_shutdown(incoming(listener), shutdown);
    let mut server = tokio::spawn(server);
    let result = tokio::select! {
        result = &mut server => result,
        _ = signal_received => match tokio::time::timeout(config.shutdown_grace, &mut server).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!("shutdown grace ran out; open leases are left to the orphan grace");
                server.abort();
                Ok(Ok(()))
            }
        },
    };
    let result = result.unwrap_or(Ok(()));
    if let Some(policy) = admission.policy() {
        policy.leave().await;
    }
    if let Some(task) = metrics_task {
        task.abort();
    }
    result?;
    Ok(())
}

/// The RPCs this server serves (admission, health, reflection): the only method labels of its
/// metrics.
fn served_methods() -> poolgate_rpc::grpc_metrics::ServedMethods {
    poolgate_rpc::grpc_metrics::ServedMethods::from_descriptors(
        &[
            poolgate_proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        ],
        &[
            poolgate_proto::admission::v1::admission_server::SERVICE_NAME,
            tonic_health::pb::health_server::SERVICE_NAME,
            tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME,
        ],
    )
}

/// Accepted connections with `TCP_NODELAY` (a lease is many small messages; Nagle plus delayed
/// ACKs would add 40 ms to each) and TCP keepalive.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(Duration::from_secs(30)))
}
