//! The response builders: scripted failures, bodies cut short or padded out, and paced event
//! streams (whole, incomplete or broken) that hold the in-flight guard until they end.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;

use super::answer::Shape;
use super::{InFlight, Scripted};

/// A scripted failure: this status, JSON, these headers and body.
pub(super) fn fail_response(status: u16, headers: Vec<(String, String)>, body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// A 200 of `content_type` that sends the first half of `text`, then drops the connection
/// (a body stream that fails makes hyper abort the connection mid-body).
pub(super) fn cut_short(
    text: &str,
    content_type: &'static str,
    guard: Option<InFlight>,
) -> Response {
    let mut half = text.len() / 2;
    while !text.is_char_boundary(half) {
        half -= 1;
    }
    let chunks = vec![
        Ok(Bytes::copy_from_slice(&text.as_bytes()[..half])),
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "scripted early close",
        )),
    ];
    let mut response = Response::new(Body::from_stream(paced(chunks, Duration::ZERO, guard)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

/// A 200 JSON answer of exactly `bytes` bytes (a message padded out), sent in pieces.
pub(super) fn oversized(bytes: usize, id: &str, guard: Option<InFlight>) -> Response {
    static PADDING: [u8; 64 * 1024] = [b'x'; 64 * 1024];
    let prefix = format!(r#"{{"id":"msg_{id}","type":"message","padding":""#);
    let suffix = r#""}"#;
    let (prefix, suffix) = if bytes >= prefix.len() + suffix.len() {
        (prefix, suffix)
    } else {
        (String::new(), "")
    };
    let mut padding = bytes - prefix.len() - suffix.len();
    let mut chunks = vec![Ok(Bytes::from(prefix))];
    while padding > 0 {
        let piece = padding.min(PADDING.len());
        chunks.push(Ok(Bytes::from_static(&PADDING[..piece])));
        padding -= piece;
    }
    chunks.push(Ok(Bytes::from_static(suffix.as_bytes())));
    let mut response = Response::new(Body::from_stream(paced(chunks, Duration::ZERO, guard)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// `IncompleteStream`: the events without the terminal ones; `BrokenStream`: the first half,
/// then the connection drops. Any other answer: the events as they are.
pub(super) fn cut_events(
    shape: Shape,
    mut events: Vec<String>,
    how: &Scripted,
) -> Vec<Result<Bytes, std::io::Error>> {
    let broken = matches!(how, Scripted::BrokenStream);
    match how {
        Scripted::IncompleteStream => {
            let keep = match shape {
                // Without `message_delta` (the stop reason) and `message_stop`.
                Shape::Anthropic => events.len().saturating_sub(2),
                // The first chunk only: no finish reason, no usage, no `[DONE]`.
                Shape::Chat => 1,
                // Without `response.completed`.
                Shape::Responses => events.len().saturating_sub(1),
            };
            events.truncate(keep);
        }
        Scripted::BrokenStream => events.truncate((events.len() / 2).max(1)),
        _ => {}
    }
    let mut chunks: Vec<Result<Bytes, std::io::Error>> =
        events.into_iter().map(|e| Ok(Bytes::from(e))).collect();
    if broken {
        chunks.push(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "scripted broken stream",
        )));
    }
    chunks
}

/// An SSE answer of these chunks, paced, the in-flight guard held until it ends.
pub(super) fn event_stream(
    chunks: Vec<Result<Bytes, std::io::Error>>,
    chunk_delay: Duration,
    guard: Option<InFlight>,
) -> Response {
    let mut response = Response::new(Body::from_stream(paced(chunks, chunk_delay, guard)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    response
}

/// [`event_stream`] whose end comes `pause` after its last chunk.
pub(super) fn trailing_pause(
    chunks: Vec<Result<Bytes, std::io::Error>>,
    chunk_delay: Duration,
    pause: Duration,
    guard: Option<InFlight>,
) -> Response {
    use futures_util::StreamExt;
    let end = futures_util::stream::once(async move {
        tokio::time::sleep(pause).await;
        Ok(Bytes::new())
    });
    let mut response = Response::new(Body::from_stream(
        paced(chunks, chunk_delay, guard).chain(end),
    ));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    response
}

/// The chunks one by one, `chunk_delay` apart; the in-flight guard (if any) lives until the
/// stream is done (or dropped). An `Err` chunk makes the server drop the connection there.
fn paced(
    chunks: Vec<Result<Bytes, std::io::Error>>,
    chunk_delay: Duration,
    guard: Option<InFlight>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::unfold(
        (chunks.into_iter(), 0usize, guard),
        move |(mut chunks, sent, guard)| async move {
            let chunk = chunks.next()?;
            if sent > 0 && !chunk_delay.is_zero() {
                tokio::time::sleep(chunk_delay).await;
            }
            if chunk.is_err() {
                // Pending for a moment first, so the server flushes the head and what came
                // before: the break is then mid-body, not before the head.
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            Some((chunk, (chunks, sent + 1, guard)))
        },
    )
}
