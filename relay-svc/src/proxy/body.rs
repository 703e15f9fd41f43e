//! A client's JSON request as the relay needs it: the top-level members as raw text, in order,
//! parsed only where the relay reads them (model, stream, system, metadata, ids), and written
//! back with the documented rewrites without building a DOM of the payload; the body an
//! account gets (`upstream_body`: the client's bytes, spliced only where DESIGN §6 says). A
//! 30 MB request costs about its size twice (the bytes read and the raw members), and once more
//! while the rewritten copy is on its way upstream.

use std::fmt;
use std::ops::Range;

use serde::de::{DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use serde_json::value::RawValue;

use bytes::Bytes;
use poolgate_core::account::CredentialKind;

use super::Inbound;
use crate::client_api::Api;
use crate::ports::PlannedAccount;

/// The top level of a JSON object: each member's raw text.
#[derive(Debug, Default)]
pub struct TopLevel {
    members: Vec<(String, Box<RawValue>)>,
}

impl<'de> Deserialize<'de> for TopLevel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = TopLevel;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TopLevel, A::Error> {
                let mut members: Vec<(String, Box<RawValue>)> = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, Box<RawValue>>()? {
                    // A repeated name keeps its first place and its last value, as a parse into
                    // a map would.
                    match members.iter_mut().find(|(name, _)| *name == key) {
                        Some(member) => member.1 = value,
                        None => members.push((key, value)),
                    }
                }
                Ok(TopLevel { members })
            }
        }
        deserializer.deserialize_map(Members)
    }
}

/// Why a request body is not one the relay takes.
#[derive(Debug)]
pub enum BodyJsonError {
    NotAnObject,
    /// Nested deeper than `MAX_DEPTH`.
    TooDeep,
    Invalid(serde_json::Error),
}

/// The deepest nesting of arrays and objects taken (serde_json's own limit for a full parse).
pub const MAX_DEPTH: usize = 128;

/// Whether `body`'s arrays and objects nest at most `max` deep: one pass over the bytes, strings
/// (and their escapes) skipped, nothing allocated. (Raw members are not parsed, so the depth a
/// full parse would refuse is checked here.)
fn nesting_within(body: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &byte in body {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

impl TopLevel {
    /// Parses a request body that must be a JSON object.
    pub fn parse(body: &[u8]) -> Result<Self, BodyJsonError> {
        if !nesting_within(body, MAX_DEPTH) {
            return Err(BodyJsonError::TooDeep);
        }
        serde_json::from_slice(body).map_err(|error| {
            if error.classify() == serde_json::error::Category::Data {
                BodyJsonError::NotAnObject
            } else {
                BodyJsonError::Invalid(error)
            }
        })
    }

    pub fn raw(&self, name: &str) -> Option<&RawValue> {
        self.members
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_ref())
    }

    /// A member parsed as `T`; `None` when absent or of another type.
    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Option<T> {
        serde_json::from_str(self.raw(name)?.get()).ok()
    }

    /// A member parsed whole: only for the small ones (system, metadata, options).
    pub fn value(&self, name: &str) -> Option<Value> {
        self.get(name)
    }

    pub fn str(&self, name: &str) -> Option<String> {
        self.get::<String>(name)
    }

    pub fn bool(&self, name: &str) -> Option<bool> {
        self.get::<bool>(name)
    }

    /// What the session hash reads (`session.rs`), as a small object: the metadata, ids and
    /// system prompt, and of `messages` / `input` only the system and developer messages and
    /// the first user turn, each parsed alone (the rest is skipped, never built).
    pub fn session_basis(&self) -> Value {
        let mut basis = serde_json::Map::new();
        for name in [
            "metadata",
            "prompt_cache_key",
            "client_metadata",
            "system",
            "instructions",
        ] {
            if let Some(value) = self.value(name) {
                basis.insert(name.to_owned(), value);
            }
        }
        let later = std::cell::Cell::new(false);
        for name in ["messages", "input"] {
            if let Some(raw) = self.raw(name) {
                let mut deserializer = serde_json::Deserializer::from_str(raw.get());
                if let Ok(kept) = SessionTurns(&later).deserialize(&mut deserializer) {
                    basis.insert(name.to_owned(), kept);
                }
            }
        }
        if later.get() {
            // Not hashed: says the conversation goes past its first turn (`session.rs`).
            basis.insert(LATER_TURNS.to_owned(), Value::Bool(true));
        }
        Value::Object(basis)
    }
}

/// `body` (a JSON object `TopLevel::parse` took) with the members of `changes` set: each
/// occurrence of a named member gets the new raw value in place of its old one, a member the
/// body lacks is added before the closing brace, and every other byte — members, order,
/// whitespace, escapes — stays as the client sent it (docs/DESIGN.md §6: the relay changes what
/// it must and nothing else). `None` when the bytes are not a JSON object after all.
pub fn splice(body: &[u8], changes: &[(&str, String)]) -> Option<Vec<u8>> {
    let (members, close) = member_ranges(body)?;
    let added: usize = changes.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
    let mut out = Vec::with_capacity(body.len() + added);
    let mut cursor = 0;
    for (key, value) in &members {
        if let Some((_, replaced)) = changes.iter().find(|(name, _)| name == key) {
            out.extend_from_slice(&body[cursor..value.start]);
            out.extend_from_slice(replaced.as_bytes());
            cursor = value.end;
        }
    }
    out.extend_from_slice(&body[cursor..close]);
    let mut any = !members.is_empty();
    for (name, value) in changes {
        if members.iter().any(|(key, _)| key == name) {
            continue;
        }
        if any {
            out.push(b',');
        }
        any = true;
        out.extend_from_slice(serde_json::to_string(name).ok()?.as_bytes());
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(&body[close..]);
    Some(out)
}

/// Each top-level member: its decoded name, and the byte range of its raw value.
type Members = Vec<(String, Range<usize>)>;

/// The top-level members of a JSON object, and the index of its closing brace; `None` when
/// `body` is not one.
fn member_ranges(body: &[u8]) -> Option<(Members, usize)> {
    let mut members = Vec::new();
    let mut i = skip_space(body, 0);
    if body.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_space(body, i + 1);
    if body.get(i) == Some(&b'}') {
        return Some((members, i));
    }
    loop {
        let key_end = string_end(body, i)?;
        let key: String = serde_json::from_slice(&body[i..key_end]).ok()?;
        i = skip_space(body, key_end);
        if body.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_space(body, i + 1);
        let end = value_end(body, start)?;
        members.push((key, start..end));
        i = skip_space(body, end);
        match body.get(i) {
            Some(b',') => i = skip_space(body, i + 1),
            Some(b'}') => return Some((members, i)),
            _ => return None,
        }
    }
}

fn skip_space(body: &[u8], mut i: usize) -> usize {
    while body
        .get(i)
        .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        i += 1;
    }
    i
}

/// The index just past the string that opens at `i`.
fn string_end(body: &[u8], i: usize) -> Option<usize> {
    if body.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    loop {
        match body.get(j)? {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
}

/// The index just past the value that opens at `i`.
fn value_end(body: &[u8], i: usize) -> Option<usize> {
    match body.get(i)? {
        b'"' => string_end(body, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match body.get(j)? {
                    b'"' => {
                        j = string_end(body, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while body
                .get(j)
                .is_some_and(|b| !matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
            {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

/// The member of a session basis that says the conversation has turns past its first user
/// turn (an answer, a tool result, another user turn); absent: it opens with this request.
pub const LATER_TURNS: &str = "poolgate_later_turns";

/// Of an array of messages, the ones the session hash reads: system and developer messages and
/// the first user turn, in order; any other message sets the flag. Anything else (a string
/// `input`) is kept as it is.
struct SessionTurns<'a>(&'a std::cell::Cell<bool>);

impl<'de> DeserializeSeed<'de> for SessionTurns<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for SessionTurns<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("messages")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut kept = Vec::new();
        let mut user_seen = false;
        while let Some(message) = seq.next_element::<Value>()? {
            let role = message.get("role").and_then(Value::as_str);
            let keep = match role {
                Some("system" | "developer") => true,
                Some("user") if !user_seen => {
                    user_seen = true;
                    true
                }
                _ => false,
            };
            if keep {
                kept.push(message);
            } else {
                self.0.set(true);
            }
        }
        Ok(Value::Array(kept))
    }
    fn visit_str<E>(self, text: &str) -> Result<Value, E> {
        Ok(Value::String(text.to_owned()))
    }
    fn visit_string<E>(self, text: String) -> Result<Value, E> {
        Ok(Value::String(text))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// The body `account` gets: the client's bytes, with only what DESIGN §6 lists changed — the
/// account's model mapping (`model`'s value), a ChatGPT subscription's `store: false` and
/// `stream: true` where the client's value differs (the backend keeps nothing and always
/// streams; a non-streaming client's answer is folded from the stream), and an OpenAI chat
/// stream's `stream_options.include_usage` on an account that asks for usage. Every other byte
/// is the client's (`body::splice`).
pub(super) fn upstream_body(inbound: &Inbound, account: &PlannedAccount) -> Bytes {
    let top = &inbound.top;
    let mut changes: Vec<(&str, String)> = Vec::new();
    if account.mapped_model != inbound.model {
        changes.push((
            "model",
            Value::String(account.mapped_model.clone()).to_string(),
        ));
    }
    if account.credential_kind == CredentialKind::ChatGptOAuth {
        if top.bool("store") != Some(false) {
            changes.push(("store", "false".into()));
        }
        if top.bool("stream") != Some(true) {
            changes.push(("stream", "true".into()));
        }
    }
    if asks_stream_usage(inbound, account) {
        let options = match top.value("stream_options") {
            Some(Value::Object(mut options)) => {
                options.insert("include_usage".into(), Value::Bool(true));
                Value::Object(options)
            }
            _ => serde_json::json!({"include_usage": true}),
        };
        changes.push(("stream_options", options.to_string()));
    }
    if changes.is_empty() {
        return inbound.body.clone();
    }
    match splice(&inbound.body, &changes) {
        Some(body) => Bytes::from(body),
        // `TopLevel::parse` took these bytes as an object, so this does not happen; were it
        // to, the object is rebuilt with the changes rather than sent without them.
        None => {
            let mut object: serde_json::Map<String, Value> =
                serde_json::from_slice(&inbound.body).unwrap_or_default();
            for (name, raw) in changes {
                if let Ok(value) = serde_json::from_str(&raw) {
                    object.insert(name.to_owned(), value);
                }
            }
            Bytes::from(Value::Object(object).to_string())
        }
    }
}

/// An OpenAI chat stream whose client did not ask for usage, on an account that allows asking:
/// the relay asks the upstream for it (so streamed spend is recorded) and strips it from what
/// the client gets.
pub(super) fn asks_stream_usage(inbound: &Inbound, account: &PlannedAccount) -> bool {
    inbound.api == Api::OpenAi
        && inbound.path == "/v1/chat/completions"
        && inbound.stream
        && account.stream_usage
        && inbound
            .top
            .value("stream_options")
            .and_then(|options| options.get("include_usage").and_then(Value::as_bool))
            != Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn members_are_read_raw() {
        let body = br#"{"model":"a","messages":[{"role":"user","content":"hi \u00e9"}],"stream":true,"x":{"deep":[1,2]}}"#;
        let top = TopLevel::parse(body).expect("an object");
        assert_eq!(top.str("model").as_deref(), Some("a"));
        assert_eq!(top.bool("stream"), Some(true));
        assert_eq!(top.raw("x").map(RawValue::get), Some(r#"{"deep":[1,2]}"#));
    }

    #[test]
    fn a_splice_changes_the_named_values_and_no_other_byte() {
        let body = b"{ \"model\" : \"a\",\n  \"messages\":[{\"role\":\"user\",\"content\":\"hi \\u00e9 } ] \\\" {\"}],\"mod\\u0065l\":\"a\" ,\"n\":-1.5e3,\"stream\":true }\n";
        assert!(TopLevel::parse(body).is_ok());
        let out = splice(
            body,
            &[("model", "\"b\"".into()), ("store", "false".into())],
        )
        .expect("an object");
        let expected = b"{ \"model\" : \"b\",\n  \"messages\":[{\"role\":\"user\",\"content\":\"hi \\u00e9 } ] \\\" {\"}],\"mod\\u0065l\":\"b\" ,\"n\":-1.5e3,\"stream\":true ,\"store\":false}\n";
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(expected),
            "every occurrence of the member (an escaped name too) changes, nothing else"
        );
        let parsed: Value = serde_json::from_slice(&out).expect("valid JSON");
        assert_eq!(parsed["store"], false);
        assert_eq!(parsed["model"], "b");
        assert_eq!(
            splice(body, &[]).as_deref(),
            Some(&body[..]),
            "no change, same bytes"
        );
        assert_eq!(
            splice(b" {} ", &[("stream", "true".into())]).as_deref(),
            Some(&br#" {"stream":true} "#[..])
        );
        assert_eq!(splice(b"[1]", &[]), None);
        assert_eq!(splice(b"{\"a\":", &[]), None);
    }

    #[test]
    fn nesting_is_bounded_outside_strings_only() {
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(200), "]".repeat(200));
        assert!(matches!(
            TopLevel::parse(deep.as_bytes()),
            Err(BodyJsonError::TooDeep)
        ));
        let in_string = format!("{{\"a\":\"{}\\\"{}\"}}", "[".repeat(200), "{".repeat(200));
        assert!(TopLevel::parse(in_string.as_bytes()).is_ok(), "{in_string}");
        let fine = format!("{{\"a\":{}{}}}", "[".repeat(100), "]".repeat(100));
        assert!(TopLevel::parse(fine.as_bytes()).is_ok());
    }

    #[test]
    fn only_objects_parse_and_a_repeated_name_keeps_its_last_value() {
        assert!(TopLevel::parse(b"[1]").is_err());
        assert!(TopLevel::parse(b"\"text\"").is_err());
        assert!(TopLevel::parse(b"{\"a\":").is_err());
        let top = TopLevel::parse(br#"{"model":"a","model":"b"}"#).expect("object");
        assert_eq!(top.str("model").as_deref(), Some("b"));
    }

    #[test]
    fn the_session_basis_keeps_what_the_session_hash_reads() {
        let body = json!({
            "system": "s",
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "a"},
                {"role": "developer", "content": "dev"},
                {"role": "user", "content": "second"}
            ],
            "metadata": {"user_id": "u"},
            "big": "x".repeat(1000)
        });
        let top = TopLevel::parse(body.to_string().as_bytes()).expect("object");
        let basis = top.session_basis();
        assert_eq!(
            basis,
            json!({
                "system": "s",
                "metadata": {"user_id": "u"},
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "first"},
                    {"role": "developer", "content": "dev"}
                ],
                // The conversation goes past its first turn (not hashed).
                "poolgate_later_turns": true
            })
        );
        let input = TopLevel::parse(br#"{"input":"just text"}"#).expect("object");
        assert_eq!(input.session_basis(), json!({"input": "just text"}));
    }
}
