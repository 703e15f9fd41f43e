//! The status page's own listener (the selector's `--admin-http-listen`): HTTP/1 and HTTP/2,
//! plain or over TLS with the server's certificate and key, until shutdown, then open requests
//! finish within a grace. The standalone relay serves the page on its admin listener instead.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A client gets this long for its TLS handshake and for its request headers.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long open requests may run after shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The TLS identity of the page's listener from PEM files: the certificate chain and its key
/// (the server's gRPC certificate flags). Browsers present no client certificate: the page's
/// own login is what authenticates them.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|error| format!("cannot read {}: {error}", path.display()))
    };
    let certs = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("certificate {}: {error}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "certificate {}: no certificate in it",
            cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|error| format!("key {}: {error}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|error| format!("tls: {error}"))?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|error| format!("tls: {error}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves `router` on `listener` (over TLS when `tls` is set) until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let service = TowerToHyperService::new(router);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT);
    builder.http2().timer(TokioTimer::new());
    let tls = tls.map(TlsAcceptor::from);
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
                tracing::debug!(%error, "status page: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match &tls {
            None => {
                let connection = builder
                    .serve_connection(TokioIo::new(stream), service.clone())
                    .into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    let _ = connection.await;
                });
            }
            Some(acceptor) => {
                // The handshake runs on the connection's own task: a slow client holds up no
                // other.
                let (acceptor, builder, service) =
                    (acceptor.clone(), builder.clone(), service.clone());
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let stream = match tokio::time::timeout(
                        HANDSHAKE_TIMEOUT,
                        acceptor.accept(stream),
                    )
                    .await
                    {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(error)) => {
                            tracing::debug!(%error, "status page: tls handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                    let connection = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .into_owned();
                    let _ = watcher.watch(connection).await;
                });
            }
        }
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("status page: requests still open at the end of the shutdown grace");
    }
}
