//! The scripted answers: what a test can make the fake answer ([`Scripted`]), and which queued
//! answer a request takes (client-only queue, shared queue, standing answer).

use std::collections::VecDeque;
use std::time::Duration;

use super::FakeState;

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Scripted {
    /// Answer with this status, headers and body.
    Fail {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Answer normally after this delay.
    Delay(Duration),
    /// A 200 head (the content type the normal answer has), part of the body, then the
    /// connection drops.
    EarlyClose,
    /// A 200 JSON answer whose body is this many bytes.
    Oversized(usize),
    /// The normal event stream (SSE, whatever the request asked) without its terminal events
    /// (Anthropic's `message_delta`/`message_stop`, chat's finish and `[DONE]`, Responses'
    /// `response.completed`), ended cleanly.
    IncompleteStream,
    /// The first half of the normal event stream (SSE), then the connection drops.
    BrokenStream,
    /// This answer after a pause (a refusal that arrives late, a head that comes too late).
    After(Duration, Box<Scripted>),
    /// The normal event stream, whose end (the HTTP stream's own) comes this long after its
    /// terminal event.
    TrailingPause(Duration),
}

/// The next scripted answer for a request with `credential`: a client's takes the client-only
/// queue first; the probe only the shared one; then the standing answer, if any.
pub(super) fn take_scripted(state: &FakeState, credential: &str, probe: bool) -> Option<Scripted> {
    if !probe {
        let client = state
            .client_scripts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(credential)
            .and_then(VecDeque::pop_front);
        if client.is_some() {
            return client;
        }
    }
    let queued = state
        .scripts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_mut(credential)
        .and_then(VecDeque::pop_front);
    queued.or_else(|| {
        state
            .standing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    })
}

/// Waits out `After` wrappers; the answer inside them.
pub(super) async fn after_pauses(mut scripted: Option<Scripted>) -> Option<Scripted> {
    while let Some(Scripted::After(pause, inner)) = scripted {
        tokio::time::sleep(pause).await;
        scripted = Some(*inner);
    }
    scripted
}
