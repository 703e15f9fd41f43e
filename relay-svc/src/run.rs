//! One relay process from its configuration and its bound listeners: the relay on the client
//! listener, `/metrics` on its own, and in standalone mode the admin endpoint and the state
//! file's last write at shutdown. `main.rs` and the tests call the same [`run`], the tests on
//! port 0.

use std::future::Future;
use std::net::SocketAddr;

use poolgate_core::account::Secret;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::server::{self, Mode};
use crate::standalone::Standalone;

/// What a relay process runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: server::Config,
    /// The standalone admin endpoint's token; without one (empty counts as none) the endpoint
    /// does not run. Distributed deployments use the selector's admin API instead.
    pub admin_token: Option<Secret>,
}

impl Config {
    /// Whether [`run`] serves the admin endpoint, so needs [`Listeners::admin`].
    pub fn serves_admin(&self) -> bool {
        matches!(self.server.mode, Mode::Standalone { .. })
            && self
                .admin_token
                .as_ref()
                .is_some_and(|token| !token.is_empty())
    }
}

/// Where `main` binds the listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    pub client: SocketAddr,
    pub metrics: SocketAddr,
    pub admin: SocketAddr,
}

/// The bound listeners [`run`] serves on.
pub struct Listeners {
    /// Client requests.
    pub client: TcpListener,
    /// `/metrics` and `/healthz`, off the client port; none: not served.
    pub metrics: Option<TcpListener>,
    /// The admin endpoint, when [`Config::serves_admin`]; ignored otherwise.
    pub admin: Option<TcpListener>,
}

impl Listeners {
    /// Binds `addresses`; the admin address only when `config` serves the admin endpoint.
    pub async fn bind(addresses: &Addresses, config: &Config) -> Result<Self, RunError> {
        let client = bind(addresses.client).await?;
        let metrics = bind(addresses.metrics).await?;
        let admin = if config.serves_admin() {
            Some(bind(addresses.admin).await?)
        } else {
            None
        };
        Ok(Listeners {
            client,
            metrics: Some(metrics),
            admin,
        })
    }
}

async fn bind(address: SocketAddr) -> Result<TcpListener, RunError> {
    TcpListener::bind(address)
        .await
        .map_err(|source| RunError::Listen { address, source })
}

/// Why a relay did not start or did not end cleanly. [`RunError::exit_code`] separates a
/// configuration that cannot run (fix the flags or the file) from a failure while running.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The flags, the config file or the state file it names cannot run.
    #[error("{0}")]
    Config(String),
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Serve(String),
    /// What changed since the last write is lost (refreshed tokens: possibly the account).
    #[error("the state file's last write failed: {0}")]
    StateFile(String),
}

impl RunError {
    /// 2 for a bad configuration, 1 for a runtime failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Config(_) => 2,
            RunError::Listen { .. } | RunError::Serve(_) | RunError::StateFile(_) => 1,
        }
    }
}

/// Builds the relay for `config` and serves it until `shutdown`; then in-flight requests finish
/// (up to the grace period), the admin endpoint closes and, in standalone mode, the state file
/// gets what changed since its last write.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let assembled = server::assemble(&config.server, Metrics::new()).map_err(RunError::Config)?;
    if let Mode::Standalone { state_file, .. } = &config.server.mode {
        match state_file {
            Some(path) => tracing::info!(state_file = %path.display(), "standalone state kept"),
            None => tracing::warn!(
                "no state file (--state-file): refreshed OAuth tokens, retirements and usage \
                 are lost at restart"
            ),
        }
    }
    let admin = serve_admin(&config, assembled.standalone.as_ref(), listeners.admin);
    tracing::info!(
        addr = ?listeners.client.local_addr().ok(),
        metrics = ?listeners.metrics.as_ref().and_then(|l| l.local_addr().ok()),
        standalone = assembled.standalone.is_some(),
        "relay serving"
    );
    let served = server::serve(
        assembled.relay,
        listeners.client,
        listeners.metrics,
        shutdown,
        config.server.shutdown_grace,
    )
    .await
    .map_err(RunError::Serve);
    if let Some(admin) = admin {
        // Awaited so its listener is closed when `run` returns.
        admin.abort();
        let _ = admin.await;
    }
    let flushed = match &assembled.standalone {
        Some(engines) => engines.source.flush().await.map_err(|error| {
            tracing::error!(%error, "the state file's last write failed");
            RunError::StateFile(error.to_string())
        }),
        None => Ok(()),
    };
    served.and(flushed)
}

/// Starts the admin endpoint when the engines run here and a token is set.
fn serve_admin(
    config: &Config,
    engines: Option<&Standalone>,
    listener: Option<TcpListener>,
) -> Option<JoinHandle<()>> {
    let token = config
        .admin_token
        .as_ref()
        .filter(|token| !token.is_empty())?;
    let Some(engines) = engines else {
        tracing::warn!(
            "--admin-token is for --standalone; distributed deployments use the selector's \
             admin API"
        );
        return None;
    };
    let Some(listener) = listener else {
        tracing::warn!("an admin token but no admin listener: the admin endpoint is off");
        return None;
    };
    tracing::info!(addr = ?listener.local_addr().ok(), "admin endpoint serving");
    let router = poolgate_operator::http::router(engines.operator.clone(), token.expose());
    Some(tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::warn!(%error, "admin endpoint failed");
        }
    }))
}
