//! Property tests: the relay's parsers never panic, whatever the input (bounded case counts, so
//! CI stays quick). cargo-fuzz needs a nightly toolchain, which is not available here.

use http::{HeaderMap, HeaderName, HeaderValue};
use poolgate_core::classify::{classify, reset_at_ms};
use proptest::prelude::*;
use relay_svc::client_api::Api;
use relay_svc::session::session_hash;
use relay_svc::usage::{SseScanner, Usage};

fn headers(pairs: &[(String, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            map.append(name, value);
        }
    }
    map
}

const RATE_HEADERS: [&str; 9] = [
    "retry-after",
    "retry-after-ms",
    "anthropic-ratelimit-unified-reset",
    "anthropic-ratelimit-unified-5h-status",
    "anthropic-ratelimit-unified-5h-reset",
    "x-codex-primary-used-percent",
    "x-codex-primary-reset-after-seconds",
    "x-codex-secondary-used-percent",
    "content-type",
];

fn header_pairs() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec(
        (
            prop::sample::select(RATE_HEADERS.to_vec()).prop_map(str::to_owned),
            prop_oneof![
                "[0-9]{0,20}",
                "-?[0-9]{1,25}(\\.[0-9]{0,5})?",
                "(rejected|allowed|application/json|text/html)",
                ".{0,40}",
            ],
        ),
        0..8,
    )
}

/// JSON-ish bodies: real shapes with random values, and random text.
fn bodies() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<Vec<u8>>(),
        ".{0,200}".prop_map(String::into_bytes),
        (any::<i64>(), ".{0,30}").prop_map(|(n, s)| format!(
            r#"{{"error":{{"type":"{s}","message":"{s} insufficient_quota"}},"usage":{{"input_tokens":{n}}}}}"#
        )
        .into_bytes()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn classification_never_panics_and_is_total(status in 0u16..1000, pairs in header_pairs(), body in bodies(), now in any::<i64>(), threshold in any::<u64>()) {
        let classified = classify(status, &headers(&pairs), &body, now / 4, threshold);
        // A success is only ever 2xx.
        if classified.class == poolgate_core::outcome::OutcomeClass::Success {
            prop_assert!((200..300).contains(&status));
        }
        let _ = reset_at_ms(&headers(&pairs), now / 4);
    }

    #[test]
    fn session_hashes_are_bounded_and_never_panic(json in "\\PC{0,300}", header in "[ -~]{0,200}") {
        let value: serde_json::Value = serde_json::from_str(&json).unwrap_or(serde_json::Value::Null);
        let mut map = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&header) {
            map.insert("x-session-id", v.clone());
            map.insert("session_id", v);
        }
        for api in [Api::Anthropic, Api::OpenAi] {
            if let Some(hash) = session_hash(api, &map, &value) {
                prop_assert!(!hash.is_empty() && hash.len() <= 128);
            }
        }
    }

    #[test]
    fn session_hashes_of_real_shapes(user_id in "\\PC{0,400}", system in "\\PC{0,100}", first in "\\PC{0,100}") {
        let body = serde_json::json!({"metadata": {"user_id": user_id}, "system": system, "messages": [{"role": "user", "content": first}]});
        let hash = session_hash(Api::Anthropic, &HeaderMap::new(), &body);
        prop_assert!(hash.is_some_and(|h| !h.is_empty() && h.len() <= 128));
    }

    #[test]
    fn the_sse_scanner_never_panics_on_any_byte_stream(chunks in prop::collection::vec(any::<Vec<u8>>(), 0..20), events in prop::collection::vec("(data: |event: |: |)\\PC{0,80}\n{0,2}", 0..20)) {
        let mut scanner = SseScanner::default();
        for chunk in &chunks {
            scanner.feed(chunk);
        }
        for event in &events {
            scanner.feed(event.as_bytes());
        }
        let _ = scanner.usage.cost_usd(&poolgate_core::account::Price::default());
    }

    #[test]
    fn usage_absorbs_any_json(json in "\\PC{0,300}", n in any::<u64>()) {
        let mut usage = Usage::default();
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(&json) {
            usage.absorb_message(&value);
        }
        usage.absorb_message(&serde_json::json!({"usage": {"prompt_tokens": n, "prompt_tokens_details": {"cached_tokens": n / 2 + 1}}}));
        let price = poolgate_core::account::Price { input_per_mtok: 1.0, ..Default::default() };
        let cost = usage.cost_usd(&price);
        prop_assert!(cost.is_finite());
    }
}
