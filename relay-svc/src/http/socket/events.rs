//! A turn's answer as the socket sends it: the SSE events of the relay's streaming answer as
//! text frames (what they say noted for the conversation), and a refusal as the platform's error
//! event.

use axum::response::Response;
use serde_json::{Value, json};

use super::{Ended, Front, Sink, send};

/// What a turn's events said.
#[derive(Default)]
pub(super) struct Turn {
    /// The id of the response, once `response.completed` came.
    pub(super) completed: Option<String>,
    /// A terminal event other than completion came (failed, incomplete, error).
    pub(super) terminal: bool,
    /// The output items, in order.
    pub(super) output: Vec<Value>,
}

impl Turn {
    /// Whether the answer's terminal event went out.
    pub(super) fn ended(&self) -> bool {
        self.completed.is_some() || self.terminal
    }

    /// Notes an event and answers the frame to send: the event as it came, but a
    /// `response.done` is sent as `response.completed`, the only success Codex reads.
    pub(super) fn take(&mut self, data: String) -> String {
        let Ok(mut event) = serde_json::from_str::<Value>(&data) else {
            return data;
        };
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match kind {
            "response.output_item.done" => {
                if let Some(item) = event.get("item") {
                    self.output.push(item.clone());
                }
                data
            }
            "response.completed" | "response.done" => {
                self.completed = event
                    .pointer("/response/id")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                if kind == "response.done" {
                    event["type"] = json!("response.completed");
                    event.to_string()
                } else {
                    data
                }
            }
            "response.failed" | "response.incomplete" | "error" => {
                self.terminal = true;
                data
            }
            _ => data,
        }
    }
}

/// The `data:` of one SSE event (its lines joined); `None` for a comment or an empty event.
pub(super) fn sse_data(event: &str) -> Option<String> {
    let lines: Vec<&str> = event
        .lines()
        .filter_map(|line| {
            line.strip_prefix("data:")
                .map(|data| data.strip_prefix(' ').unwrap_or(data))
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// The relay's own refusal of a turn, as the platform's error event with its status.
pub(super) async fn relay_error(
    front: &Front,
    sink: &mut Sink,
    response: Response,
) -> Result<(), Ended> {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let limit = front.relay.settings.max_body_bytes;
    let body = axum::body::to_bytes(response.into_body(), limit)
        .await
        .unwrap_or_default();
    let error = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("error").cloned())
        .unwrap_or_else(|| json!({"type": "server_error", "message": "the request failed"}));
    let mut event = json!({"type": "error", "status": status, "error": error});
    if let Some(retry_after) = retry_after {
        event["headers"] = json!({"retry-after": retry_after});
    }
    send(sink, event.to_string()).await
}
