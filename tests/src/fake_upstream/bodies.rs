//! The normal answers of each API: the JSON body and the event stream a healthy upstream sends.

use serde_json::{Value, json};

use super::answer::Shape;

/// The usage every normal answer reports (usage windows counted in tokens charge their sum).
pub(super) const INPUT_TOKENS: u64 = 10;
pub(super) const OUTPUT_TOKENS: u64 = 7;

/// The normal (non-streamed) answer of `shape`.
pub(super) fn normal_body(shape: Shape, id: &str, model: &str) -> Value {
    match shape {
        Shape::Anthropic => json!({
            "id": format!("msg_{id}"), "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": "Hello from the fake upstream."}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        }),
        Shape::Chat => json!({
            "id": format!("chatcmpl-{id}"), "object": "chat.completion", "created": 1_700_000_000, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the fake upstream."}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS, "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}
        }),
        Shape::Responses => json!({
            "id": format!("resp_{id}"), "object": "response", "created_at": 1_700_000_000, "model": model, "status": "completed",
            "output": [{"type": "message", "id": format!("msg_{id}"), "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": "Hello from the fake upstream.", "annotations": []}]}],
            "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS, "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}
        }),
    }
}

/// The normal event stream of `shape` (chat: with usage when the request asked for it).
pub(super) fn normal_events(shape: Shape, id: &str, model: &str, request: &Value) -> Vec<String> {
    match shape {
        Shape::Anthropic => vec![
            format!(
                "event: message_start\ndata: {}\n\n",
                json!({"type": "message_start", "message": {"id": format!("msg_{id}"), "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": 1}}})
            ),
            format!(
                "event: content_block_start\ndata: {}\n\n",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            ),
            format!(
                "event: content_block_delta\ndata: {}\n\n",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}})
            ),
            format!(
                "event: content_block_delta\ndata: {}\n\n",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " there."}})
            ),
            format!(
                "event: content_block_stop\ndata: {}\n\n",
                json!({"type": "content_block_stop", "index": 0})
            ),
            format!(
                "event: message_delta\ndata: {}\n\n",
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": OUTPUT_TOKENS}})
            ),
            format!(
                "event: message_stop\ndata: {}\n\n",
                json!({"type": "message_stop"})
            ),
        ],
        Shape::Chat => {
            // As the real API: usage only when asked for (`stream_options.include_usage`), then
            // `"usage": null` on every chunk and a last chunk with no choices and the usage.
            let with_usage = request
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                == Some(true);
            let chunk = |choices: Value, usage: Value| {
                let mut chunk = json!({"id": format!("chatcmpl-{id}"), "object": "chat.completion.chunk", "created": 1_700_000_000, "model": model, "choices": choices});
                if with_usage {
                    chunk["usage"] = usage;
                }
                format!("data: {chunk}\n\n")
            };
            let mut events = vec![
                chunk(
                    json!([{"index": 0, "delta": {"role": "assistant", "content": "Hello"}, "finish_reason": null}]),
                    Value::Null,
                ),
                chunk(
                    json!([{"index": 0, "delta": {"content": " there."}, "finish_reason": "stop"}]),
                    Value::Null,
                ),
            ];
            if with_usage {
                events.push(chunk(
                    json!([]),
                    json!({"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS, "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}),
                ));
            }
            events.push("data: [DONE]\n\n".to_owned());
            events
        }
        Shape::Responses => {
            // The full sequence the Codex CLI expects, as the real API sends it.
            let msg = format!("msg_{id}");
            let text = "Hello there.";
            let item = |status: &str, content: Value| json!({"id": msg, "type": "message", "status": status, "role": "assistant", "content": content});
            let part = json!({"type": "output_text", "text": text, "annotations": []});
            let response = |status: &str, output: Value, usage: Value| json!({"id": format!("resp_{id}"), "object": "response", "created_at": 1_700_000_000, "model": model, "status": status, "output": output, "usage": usage});
            let usage = json!({"input_tokens": INPUT_TOKENS, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": OUTPUT_TOKENS, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS});
            [
                json!({"type": "response.created", "response": response("in_progress", json!([]), Value::Null)}),
                json!({"type": "response.in_progress", "response": response("in_progress", json!([]), Value::Null)}),
                json!({"type": "response.output_item.added", "output_index": 0, "item": item("in_progress", json!([]))}),
                json!({"type": "response.content_part.added", "item_id": msg, "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
                json!({"type": "response.output_text.delta", "item_id": msg, "output_index": 0, "content_index": 0, "delta": text}),
                json!({"type": "response.output_text.done", "item_id": msg, "output_index": 0, "content_index": 0, "text": text}),
                json!({"type": "response.content_part.done", "item_id": msg, "output_index": 0, "content_index": 0, "part": part}),
                json!({"type": "response.output_item.done", "output_index": 0, "item": item("completed", json!([part]))}),
                json!({"type": "response.completed", "response": response("completed", json!([item("completed", json!([part]))]), usage)}),
            ]
            .into_iter()
            .enumerate()
            .map(|(sequence, mut event)| {
                event["sequence_number"] = json!(sequence);
                let name = event["type"].as_str().unwrap_or("message").to_owned();
                format!("event: {name}\ndata: {event}\n\n")
            })
            .collect()
        }
    }
}
