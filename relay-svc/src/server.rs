//! Wiring: backends from config (standalone or remote), the relay, the HTTP server with graceful
//! shutdown (readiness off first, then in-flight requests finish up to a grace period).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use poolgate_core::lease::Settings;
use poolgate_core::outcome::RuntimeBlockSettings;
use tokio::net::TcpListener;

use crate::http::{Front, router};
use crate::metrics::Metrics;
use crate::ports::Backends;
use crate::proxy::{Relay, RelaySettings};
use crate::standalone::{Standalone, StandaloneFile};
use poolgate_select::engine::SelectorSettings;

#[derive(Debug, Clone)]
pub enum Mode {
    /// Everything in this process, accounts from a parsed YAML file; what must survive a
    /// restart in `state_file` (none: nothing does).
    Standalone {
        file: Arc<StandaloneFile>,
        state_file: Option<std::path::PathBuf>,
    },
    /// Selector and admission over gRPC, each a list of endpoints to balance over.
    Remote {
        selector: Vec<String>,
        admission: Vec<String>,
        /// TLS and the service token toward the selector and admission.
        client: crate::remote::GrpcClient,
        /// Select in this process over the selector's view (docs/DESIGN.md §2, "Selection at
        /// the edge"); `None`: the selector plans every request.
        edge: Option<poolgate_client::edge::EdgeSelectionSettings>,
    },
}

#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    pub relay: RelaySettings,
    pub blocks: RuntimeBlockSettings,
    pub admission: Settings,
    /// How long in-flight requests may run after SIGTERM.
    pub shutdown_grace: Duration,
}

/// A relay, and in standalone mode the engines it runs in process (for the admin endpoint and
/// the state file's last write at shutdown).
pub struct Assembled {
    pub relay: Arc<Relay>,
    pub standalone: Option<Standalone>,
}

/// Builds the relay for `config`.
pub fn build(config: &Config, metrics: Metrics) -> Result<Arc<Relay>, String> {
    Ok(assemble(config, metrics)?.relay)
}

/// Builds the relay for `config`, keeping the standalone engines. Call inside a Tokio runtime.
pub fn assemble(config: &Config, metrics: Metrics) -> Result<Assembled, String> {
    let mut standalone = None;
    let (selection, leases): Backends = match &config.mode {
        Mode::Standalone { file, state_file } => {
            let engines = crate::standalone::build(
                file,
                state_file.as_deref(),
                SelectorSettings {
                    blocks: config.blocks.clone(),
                    ..SelectorSettings::default()
                },
                config.admission.clone(),
                &metrics,
            )?;
            let backends: Backends = (engines.selection.clone(), engines.leases.clone());
            standalone = Some(engines);
            backends
        }
        Mode::Remote {
            selector,
            admission,
            client,
            edge,
        } => crate::remote::remote_backends(
            selector,
            admission,
            client,
            metrics.client.clone(),
            edge.clone()
                .map(|edge| (edge, edge_engine_settings(&config.blocks))),
        )
        .map_err(|error| error.to_string())?,
    };
    let relay = Relay::new(selection, leases, config.relay.clone(), metrics)
        .map_err(|error| error.to_string())?;
    let relay = Arc::new(match &standalone {
        Some(engines) => relay.with_clock(engines.selection.clock().clone()),
        None => relay,
    });
    Ok(Assembled { relay, standalone })
}

/// The selection engine's settings at the edge: the deployment's block settings, and a load
/// cache short enough that the view's readings are planned with as they arrive (the view is in
/// memory: a read costs a lock, not a round trip).
pub fn edge_engine_settings(blocks: &RuntimeBlockSettings) -> SelectorSettings {
    SelectorSettings {
        blocks: blocks.clone(),
        load_cache: poolgate_select::load_cache::LoadCacheSettings {
            cache_ttl: Duration::from_millis(20),
            stale_periods: 1,
            ..Default::default()
        },
        ..SelectorSettings::default()
    }
}

/// Serves until `shutdown`, then turns readiness off and lets in-flight requests finish (up to
/// the grace period).
pub async fn serve(
    relay: Arc<Relay>,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> Result<(), String> {
    // `/metrics` on its own port, as the other services do: clients never reach it.
    let metrics_task = metrics_listener.map(|listener| {
        let metrics = relay.metrics.clone();
        poolgate_rpc::metrics_http::spawn(listener, move || metrics.render())
    });
    let result = serve_clients(relay, listener, shutdown, grace).await;
    if let Some(task) = metrics_task {
        // Awaited so the metrics listener is closed when `serve` returns.
        task.abort();
        let _ = task.await;
    }
    result
}

async fn serve_clients(
    relay: Arc<Relay>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> Result<(), String> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;

    let ready = Arc::new(AtomicBool::new(true));
    let edge = relay.settings.edge.clone();
    let front = Front::new(relay, ready.clone());
    let sockets = front.sockets.clone();
    let service = TowerToHyperService::new(router(front));
    // One connection builder for HTTP/1 and HTTP/2 (prior knowledge), with the edge's bounds: a
    // header read timeout, and per connection a cap on concurrent streams and on resets in a row.
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(edge.header_read_timeout)
        .max_headers(128);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(edge.h2_max_concurrent_streams)
        .max_pending_accept_reset_streams(edge.h2_max_pending_resets)
        .max_local_error_reset_streams(edge.h2_max_pending_resets);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors and the like: wait a moment, as axum::serve does.
                tracing::debug!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // TCP_NODELAY: SSE events are small writes; Nagle plus delayed ACKs would hold each one
        // back.
        let _ = stream.set_nodelay(true);
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service.clone())
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(error = %error, "client connection ended with an error");
            }
        });
    }
    ready.store(false, Ordering::Relaxed);
    tracing::info!("shutting down: readiness off, finishing in-flight requests");
    // Responses WebSockets left hyper's watch at their upgrade: each closes once its turn is
    // answered, and the grace waits for them too.
    sockets.close_all();
    let sockets_closed = async {
        while sockets.open_count() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(grace, async {
        tokio::join!(graceful.shutdown(), sockets_closed);
    })
    .await
    .is_err()
    {
        tracing::warn!("shutdown grace ran out with requests still open");
    }
    Ok(())
}
