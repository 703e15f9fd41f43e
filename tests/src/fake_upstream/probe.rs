//! Recognises the selector's confirmation probe among the requests received.

use serde_json::{Value, json};

/// Whether `request` (sent to `path`) is the selector's confirmation probe: exactly one of the
/// fixed bodies `select/src/probe.rs` `probe_request` sends, nothing else in it. Anthropic:
/// `max_tokens: 1` and one user "ping", no `system` (the probe carries no client's identity);
/// OpenAI chat: `max_completion_tokens: 1` and the same message; ChatGPT: the "Answer in one
/// word." instructions with the ping as input; embeddings: `input: "ping"`; rerank (`/v1/rerank`
/// only): `query: "ping"` over the one document `"ping"`. A client could send the same bytes; it
/// would then get the probe's answers, which is what the upstream would do too.
pub fn is_probe(path: &str, request: &Value) -> bool {
    let Some(fields) = request.as_object() else {
        return false;
    };
    let ping = json!([{"role": "user", "content": "ping"}]);
    let only = |allowed: &[&str]| fields.keys().all(|k| allowed.contains(&k.as_str()));
    let model = fields.get("model").is_some_and(Value::is_string);
    if path.ends_with("/v1/messages") {
        model
            && only(&["model", "max_tokens", "messages"])
            && fields.get("max_tokens") == Some(&json!(1))
            && fields.get("messages") == Some(&ping)
    } else if path.ends_with("/chat/completions") {
        model
            && only(&["model", "max_completion_tokens", "messages"])
            && fields.get("max_completion_tokens") == Some(&json!(1))
            && fields.get("messages") == Some(&ping)
    } else if path.ends_with("/responses") {
        model
            && only(&["model", "instructions", "input", "store", "stream"])
            && fields.get("instructions") == Some(&json!("Answer in one word."))
            && fields.get("input") == Some(&ping)
            && fields.get("store") == Some(&Value::Bool(false))
            && fields.get("stream") == Some(&Value::Bool(true))
    } else if path.ends_with("/v1/embeddings") {
        model && only(&["model", "input"]) && fields.get("input") == Some(&json!("ping"))
    } else if path.ends_with("/v1/rerank") {
        model
            && only(&["model", "query", "documents"])
            && fields.get("query") == Some(&json!("ping"))
            && fields.get("documents") == Some(&json!(["ping"]))
    } else {
        false
    }
}
