//! Wiring: backends from config (standalone or remote), the relay, the HTTP server with graceful
//! shutdown (readiness off first, then in-flight requests finish up to a grace period).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use poolgate_core::lease::Settings;
use poolgate_core::outcome::RuntimeBlockSettings;
use tokio::net::TcpListener;

use crate::backends::Backends;
use crate::http::{Front, router};
use crate::metrics::Metrics;
use crate::proxy::{Relay, RelaySettings};
use crate::standalone::{Standalone, StandaloneFile};
use selector_svc::engine::SelectorSettings;

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
        } => crate::remote::remote_backends(selector, admission, client, metrics.clone())
            .map_err(|error| error.to_string())?,
    };
    let relay = Arc::new(
        Relay::new(selection, leases, config.relay.clone(), metrics)
            .map_err(|error| error.to_string())?,
    );
    Ok(Assembled { relay, standalone })
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
        tokio::spawn(async move {
            let router = axum::Router::new()
                .route(
                    "/metrics",
                    axum::routing::get(move || {
                        let metrics = metrics.clone();
                        async move { metrics.render() }
                    }),
                )
                .route("/healthz", axum::routing::get(|| async { "ok" }));
            if let Err(error) = axum::serve(listener, router).await {
                tracing::warn!(%error, "metrics server failed");
            }
        })
    });
    let result = serve_clients(relay, listener, shutdown, grace).await;
    if let Some(task) = metrics_task {
        task.abort();
    }
    result
}

async fn serve_clients(
    relay: Arc<Relay>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> Result<(), String> {
    let ready = Arc::new(AtomicBool::new(true));
    let front = Front {
        relay,
        ready: ready.clone(),
    };
    let (drained, drained_signal) = tokio::sync::oneshot::channel::<()>();
    let graceful = async move {
        shutdown.await;
        ready.store(false, Ordering::Relaxed);
        tracing::info!("shutting down: readiness off, finishing in-flight requests");
        let _ = drained.send(());
    };
    // TCP_NODELAY: SSE events are small writes; Nagle plus delayed ACKs would hold each one back.
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = axum::serve(listener, router(front)).with_graceful_shutdown(graceful);
    let mut server = tokio::spawn(async move { server.await });
    tokio::select! {
        result = &mut server => {
            return match result {
                Ok(Ok(())) => Ok(()),
                Ok(Err(error)) => Err(format!("http server failed: {error}")),
                Err(error) => Err(format!("http server task failed: {error}")),
            };
        }
        _ = drained_signal => {}
    }
    match tokio::time::timeout(grace, server).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(error))) => Err(format!("http server failed: {error}")),
        Ok(Err(error)) => Err(format!("http server task failed: {error}")),
        Err(_) => {
            tracing::warn!("shutdown grace ran out with requests still open");
            Ok(())
        }
    }
}
