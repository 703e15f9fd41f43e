//! The small HTTP server every service runs on its own port, off its gRPC and client ports:
//! `/metrics` (the Prometheus text format) and `/healthz`.

use std::future::Future;

use tokio::net::TcpListener;

/// The two routes over `render`, which returns the metrics in the text exposition format.
pub fn router<F>(render: F) -> axum::Router
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    use axum::routing::get;
    axum::Router::new()
        .route("/metrics", get(move || std::future::ready(render())))
        .route("/healthz", get(|| std::future::ready("ok")))
}

/// Serves [`router`] on `listener` until the future is dropped.
pub fn serve<F>(listener: TcpListener, render: F) -> impl Future<Output = std::io::Result<()>>
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    axum::serve(listener, router(render)).into_future()
}

/// [`serve`] on its own task, a failure logged: the service goes on without its metrics rather
/// than stop serving. Abort the handle when the service stops.
pub fn spawn<F>(listener: TcpListener, render: F) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    tokio::spawn(async move {
        if let Err(error) = serve(listener, render).await {
            tracing::warn!(%error, "metrics server failed");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn metrics_and_healthz_answer_and_nothing_else_does() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = spawn(listener, || "up 1\n".to_owned());
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.expect("write");
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.expect("read");
            answer
        };
        let metrics = get("/metrics").await;
        assert!(
            metrics.starts_with("HTTP/1.1 200") && metrics.ends_with("up 1\n"),
            "{metrics}"
        );
        let health = get("/healthz").await;
        assert!(
            health.starts_with("HTTP/1.1 200") && health.ends_with("ok"),
            "{health}"
        );
        assert!(get("/v1/messages").await.starts_with("HTTP/1.1 404"));
        task.abort();
    }
}
