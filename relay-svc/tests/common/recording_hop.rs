//! A recording hop: an HTTP server put between a client (the official CLIs) and the relay that
//! keeps every request exactly as the client sent it — method, path and query, headers in
//! order, the body's bytes — and passes it on to the relay unchanged (less the hop-by-hop
//! headers a proxy must not forward), the answer streamed back as it comes. The transparency
//! test compares what it kept with what the fake upstream received through the relay.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::TryStreamExt;
use http::{HeaderMap, Method, StatusCode, Uri};

/// One request as the client sent it.
#[derive(Debug, Clone)]
pub struct HopRequest {
    pub method: Method,
    /// Path and query, e.g. `/v1/messages?beta=true`.
    pub target: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Headers that describe one connection, not the request (RFC 9110 §7.6.1), and the ones a
/// proxy sets anew: never passed on by the hop, and never expected upstream.
pub const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

#[derive(Clone)]
struct Hop {
    target: String,
    client: reqwest::Client,
    seen: Arc<Mutex<Vec<HopRequest>>>,
}

pub struct RecordingHop {
    pub base_url: String,
    seen: Arc<Mutex<Vec<HopRequest>>>,
}

impl RecordingHop {
    /// A hop on a free loopback port in front of `target` (e.g. `http://127.0.0.1:8080`).
    pub async fn start(target: &str) -> std::io::Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(std::io::Error::other)?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hop = Hop {
            target: target.trim_end_matches('/').to_owned(),
            client,
            seen: seen.clone(),
        };
        let router = axum::Router::new().fallback(forward).with_state(hop);
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let address = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(RecordingHop {
            base_url: format!("http://{address}"),
            seen,
        })
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<HopRequest> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

async fn forward(
    State(hop): State<Hop>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let target = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned());
    hop.seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(HopRequest {
            method: method.clone(),
            target: target.clone(),
            headers: headers.clone(),
            body: body.clone(),
        });
    let mut request = hop
        .client
        .request(method, format!("{}{target}", hop.target))
        .body(body);
    for (name, value) in &headers {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            request = request.header(name, value);
        }
    }
    let answer = match request.send().await {
        Ok(answer) => answer,
        Err(error) => {
            return (StatusCode::BAD_GATEWAY, format!("hop: {error}")).into_response();
        }
    };
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            response = response.header(name, value);
        }
    }
    let stream = answer.bytes_stream().map_err(std::io::Error::other);
    response
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}
