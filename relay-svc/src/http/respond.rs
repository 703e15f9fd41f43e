//! An answer as the client's response: whole, streamed, or — for a streaming client kept waiting
//! — SSE keep-alive comments first, after which a refusal is an SSE error event instead of a
//! status; and the request task that is cancelled when the client goes away.

use std::time::Duration;

use axum::body::Body as AxumBody;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderValue, StatusCode};
use tokio::sync::mpsc;

use crate::client_api::{Api, ErrorKind, RelayError};
use crate::proxy::{Answer, Body};

/// A request task that is cancelled when the client's connection (and with it this handle) goes
/// away, so a gone client never holds a lease or an upstream call.
pub(super) struct AbortOnDrop(pub(super) Option<tokio::task::JoinHandle<Answer>>);

impl AbortOnDrop {
    pub(super) async fn join(&mut self) -> Option<Answer> {
        let handle = self.0.as_mut()?;
        let answer = handle.await.ok();
        self.0 = None;
        answer
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            handle.abort();
        }
    }
}

/// Turns an answer into a response.
pub(super) fn respond(answer: Answer) -> Response {
    match answer {
        Answer::Error(error) => error.into_response(),
        Answer::Upstream {
            status,
            headers,
            body,
        } => {
            let body = match body {
                Body::Full(bytes) => AxumBody::from(bytes),
                Body::Stream(receiver) => stream_body(receiver),
            };
            let mut response = Response::new(body);
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            response
        }
    }
}

fn stream_body(receiver: mpsc::Receiver<Bytes>) -> AxumBody {
    let stream =
        tokio_stream::wrappers::ReceiverStream::new(receiver).map(Ok::<Bytes, std::io::Error>);
    AxumBody::from_stream(stream)
}

/// The status line goes out now (200, SSE); keep-alive comments follow until the answer comes,
/// then its bytes — or, if it is a refusal or an upstream error, an SSE error event.
pub(super) fn pinged_stream(api: Api, mut run: AbortOnDrop, ping_every: Duration) -> Response {
    let (sender, receiver) = mpsc::channel::<Bytes>(32);
    tokio::spawn(async move {
        if sender
            .send(Bytes::from_static(b": keep-alive\n\n"))
            .await
            .is_err()
        {
            return;
        }
        let answer = loop {
            tokio::select! {
                answer = run.join() => break answer.unwrap_or_else(|| Answer::Error(RelayError::new(api, ErrorKind::Upstream, "internal error"))),
                _ = tokio::time::sleep(ping_every) => {
                    if sender.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                        // The client went away: dropping `run` cancels the wait (and any lease).
                        return;
                    }
                }
            }
        };
        match answer {
            Answer::Error(error) => {
                let _ = sender.send(error.sse_event()).await;
            }
            Answer::Upstream { status, body, .. } if !status.is_success() => {
                let message = match body {
                    Body::Full(bytes) => {
                        String::from_utf8_lossy(&bytes[..bytes.len().min(2000)]).into_owned()
                    }
                    Body::Stream(_) => format!("upstream answered {status}"),
                };
                let kind = if status == StatusCode::TOO_MANY_REQUESTS {
                    ErrorKind::RateLimited
                } else {
                    ErrorKind::Upstream
                };
                let _ = sender
                    .send(RelayError::new(api, kind, message).sse_event())
                    .await;
            }
            Answer::Upstream {
                body: Body::Full(bytes),
                ..
            } => {
                let _ = sender.send(bytes).await;
            }
            Answer::Upstream {
                body: Body::Stream(mut upstream),
                ..
            } => {
                while let Some(chunk) = upstream.recv().await {
                    if sender.send(chunk).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut response = Response::new(stream_body(receiver));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    response.headers_mut().insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    response
}
