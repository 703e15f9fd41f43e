//! The session hash of a request (docs/DESIGN.md §6), in order: Anthropic `metadata.user_id`'s
//! session part, then Claude Code's `x-claude-code-session-id` header; OpenAI `prompt_cache_key`,
//! then the `session-id` / `session_id` header (Codex sends the first), then
//! `client_metadata.session_id`; the `x-session-id` header; else a hash of the system prompt and
//! the first user turn. At most 128 bytes (longer ones are hashed). Bindings are made under
//! `poolgate_select::engine::binding_key`: the session of one client key, never another's.

use http::HeaderMap;
use poolgate_core::short_hash as hashed;
use serde_json::Value;

use crate::client_api::Api;

const MAX: usize = 128;

fn bounded(value: &str) -> Option<String> {
    let value = value.trim();
    if value.is_empty() {
        None
    } else if value.len() > MAX {
        Some(hashed(value))
    } else {
        Some(value.to_owned())
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(bounded)
}

/// Whether a request opens its conversation: no session named by the client (the hash is
/// derived from the first turn) and no turn past the first in the body (`body` is the session
/// basis, `TopLevel::session_basis`). Nothing can be bound to such a session yet, so a relay
/// selecting at the edge does not ask the selector about it (docs/DESIGN.md §2).
pub fn opens_conversation(api: Api, headers: &HeaderMap, body: &Value) -> bool {
    declared(api, headers, body).is_none() && body.get(crate::proxy::body::LATER_TURNS).is_none()
}

/// Derives the session hash; `None` only when the body has nothing to hash.
pub fn session_hash(api: Api, headers: &HeaderMap, body: &Value) -> Option<String> {
    declared(api, headers, body).or_else(|| derived(body))
}

/// The session the client named (a field or a header), if any.
fn declared(api: Api, headers: &HeaderMap, body: &Value) -> Option<String> {
    match api {
        Api::Anthropic => {
            if let Some(user_id) = body.pointer("/metadata/user_id").and_then(Value::as_str) {
                // Claude Code sends `user_<hash>_account_<uuid>_session_<uuid>`.
                let session = user_id
                    .rsplit_once("session_")
                    .map(|(_, s)| s)
                    .unwrap_or(user_id);
                if let Some(session) = bounded(session) {
                    return Some(session);
                }
            }
            if let Some(session) = header(headers, "x-claude-code-session-id") {
                return Some(session);
            }
        }
        Api::OpenAi => {
            if let Some(key) = body
                .get("prompt_cache_key")
                .and_then(Value::as_str)
                .and_then(bounded)
            {
                return Some(key);
            }
            if let Some(session) =
                header(headers, "session-id").or_else(|| header(headers, "session_id"))
            {
                return Some(session);
            }
            if let Some(session) = body
                .pointer("/client_metadata/session_id")
                .and_then(Value::as_str)
                .and_then(bounded)
            {
                return Some(session);
            }
        }
        // Rerank binds no session (`http.rs` asks for none).
        Api::Cohere => {}
    }
    header(headers, "x-session-id")
}

/// The hash of the system prompt and the first user turn.
fn derived(body: &Value) -> Option<String> {
    let system = body.get("system").or_else(|| body.get("instructions"));
    let messages = body.get("messages").or_else(|| body.get("input"));
    let first_user = match messages {
        Some(Value::Array(items)) => items
            .iter()
            .find(|m| m.get("role").and_then(Value::as_str) == Some("user")),
        Some(text @ Value::String(_)) => Some(text),
        _ => None,
    };
    let system_messages: Vec<&Value> = match messages {
        Some(Value::Array(items)) => items
            .iter()
            .filter(|m| {
                matches!(
                    m.get("role").and_then(Value::as_str),
                    Some("system" | "developer")
                )
            })
            .collect(),
        _ => Vec::new(),
    };
    if system.is_none() && first_user.is_none() && system_messages.is_empty() {
        return None;
    }
    // Hashed as it is serialized: a large first turn is not copied into a string first.
    // (A tuple of references serializes as the array `[system, system_messages, first_user]`.)
    Some(poolgate_core::short_hash_json(&(
        system,
        &system_messages,
        first_user,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn anthropic_metadata_session_part_first() {
        let body = json!({"metadata": {"user_id": "user_abc_account_def_session_1234-5678"}, "messages": []});
        assert_eq!(
            session_hash(Api::Anthropic, &HeaderMap::new(), &body).as_deref(),
            Some("1234-5678")
        );
        let plain = json!({"metadata": {"user_id": "someone"}});
        assert_eq!(
            session_hash(Api::Anthropic, &HeaderMap::new(), &plain).as_deref(),
            Some("someone")
        );
    }

    #[test]
    fn openai_cache_key_then_headers() {
        let mut headers = HeaderMap::new();
        headers.insert("session_id", "sess-h".parse().expect("value"));
        let body = json!({"prompt_cache_key": "pck"});
        assert_eq!(
            session_hash(Api::OpenAi, &headers, &body).as_deref(),
            Some("pck")
        );
        assert_eq!(
            session_hash(Api::OpenAi, &headers, &json!({})).as_deref(),
            Some("sess-h")
        );
        let mut codex = HeaderMap::new();
        codex.insert("session-id", "sess-dash".parse().expect("value"));
        assert_eq!(
            session_hash(Api::OpenAi, &codex, &json!({})).as_deref(),
            Some("sess-dash"),
            "Codex sends session-id"
        );
        assert_eq!(
            session_hash(
                Api::OpenAi,
                &HeaderMap::new(),
                &json!({"client_metadata": {"session_id": "meta"}})
            )
            .as_deref(),
            Some("meta")
        );
        let mut claude = HeaderMap::new();
        claude.insert("x-claude-code-session-id", "cc".parse().expect("value"));
        assert_eq!(
            session_hash(Api::Anthropic, &claude, &json!({})).as_deref(),
            Some("cc")
        );
        let mut x = HeaderMap::new();
        x.insert("x-session-id", "xs".parse().expect("value"));
        assert_eq!(
            session_hash(Api::Anthropic, &x, &json!({})).as_deref(),
            Some("xs")
        );
    }

    #[test]
    fn falls_back_to_a_stable_hash_of_system_and_first_user_turn() {
        let a = json!({"system": "be brief", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]});
        let b = json!({"system": "be brief", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "y"}, {"role": "user", "content": "more"}]});
        let c = json!({"system": "be long", "messages": [{"role": "user", "content": "hi"}]});
        let ha = session_hash(Api::Anthropic, &HeaderMap::new(), &a).expect("hash");
        assert_eq!(
            Some(ha.clone()),
            session_hash(Api::Anthropic, &HeaderMap::new(), &b),
            "later turns do not change it"
        );
        assert_ne!(
            Some(ha.clone()),
            session_hash(Api::Anthropic, &HeaderMap::new(), &c)
        );
        assert_eq!(ha.len(), 32);
        assert_eq!(
            session_hash(Api::Anthropic, &HeaderMap::new(), &json!({})),
            None
        );
        let long = json!({"metadata": {"user_id": "session_".to_owned() + &"z".repeat(500)}});
        assert_eq!(
            session_hash(Api::Anthropic, &HeaderMap::new(), &long).map(|s| s.len()),
            Some(32)
        );
    }

    #[test]
    fn only_a_first_turn_without_a_named_session_opens_a_conversation() {
        let basis = |body: Value| {
            crate::proxy::body::TopLevel::parse(body.to_string().as_bytes())
                .expect("an object")
                .session_basis()
        };
        let first = basis(json!({"system": "s", "messages": [{"role": "user", "content": "hi"}]}));
        assert!(opens_conversation(
            Api::Anthropic,
            &HeaderMap::new(),
            &first
        ));
        let later = basis(json!({"system": "s", "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"}
        ]}));
        assert!(!opens_conversation(
            Api::Anthropic,
            &HeaderMap::new(),
            &later
        ));
        assert_eq!(
            session_hash(Api::Anthropic, &HeaderMap::new(), &first),
            session_hash(Api::Anthropic, &HeaderMap::new(), &later),
            "the later turns change nothing of the hash"
        );
        let named = basis(
            json!({"metadata": {"user_id": "user_a_account_b_session_c"},
            "messages": [{"role": "user", "content": "hi"}]}),
        );
        assert!(
            !opens_conversation(Api::Anthropic, &HeaderMap::new(), &named),
            "a session the client named may be bound already"
        );
        let mut headers = HeaderMap::new();
        headers.insert("session-id", "abc".parse().expect("header"));
        assert!(!opens_conversation(
            Api::OpenAi,
            &headers,
            &basis(json!({"input": "hi"}))
        ));
        assert!(opens_conversation(
            Api::OpenAi,
            &HeaderMap::new(),
            &basis(json!({"input": "hi"}))
        ));
    }
}
