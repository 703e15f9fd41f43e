//! Classification against real error bodies and headers of both providers (as their docs and
//! the peers' code show them), and the rule behind it: nothing a client puts in its request
//! changes the class (upstreams echo client input into error messages).

use http::{HeaderMap, HeaderName, HeaderValue};
use poolgate_core::classify::{classify, classify_stream_error, is_stream_error};
use poolgate_core::outcome::OutcomeClass::{self, *};
use proptest::prelude::*;
use serde_json::{Value, json};

const NOW: i64 = 1_700_000_000_000;
const THRESHOLD: u64 = 60_000;

fn headers(pairs: &[(&str, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for (name, value) in pairs {
        map.insert(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
    }
    map
}

fn anthropic(kind: &str, message: &str) -> String {
    json!({"type": "error", "error": {"type": kind, "message": message}}).to_string()
}

fn openai(kind: &str, code: Option<&str>, message: &str) -> String {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}}).to_string()
}

const SECONDS: i64 = NOW / 1000;

struct Case {
    name: &'static str,
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
    class: OutcomeClass,
    reset_at_ms: Option<Option<i64>>,
}

fn case(name: &'static str, status: u16, body: String, class: OutcomeClass) -> Case {
    Case {
        name,
        status,
        headers: Vec::new(),
        body,
        class,
        reset_at_ms: None,
    }
}

fn table() -> Vec<Case> {
    vec![
        // Anthropic
        case(
            "anthropic invalid request",
            400,
            anthropic("invalid_request_error", "messages: Field required"),
            ClientError,
        ),
        case(
            "anthropic credit balance too low",
            400,
            anthropic(
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
            ),
            QuotaGone,
        ),
        case(
            "anthropic context too long",
            400,
            anthropic(
                "invalid_request_error",
                "prompt is too long: 215000 tokens > 200000 maximum",
            ),
            ClientError,
        ),
        case(
            "anthropic auth",
            401,
            anthropic("authentication_error", "invalid x-api-key"),
            Unauthorized,
        ),
        case(
            "anthropic billing",
            402,
            anthropic("billing_error", "Your account has a billing issue."),
            QuotaGone,
        ),
        case(
            "anthropic permission",
            403,
            anthropic(
                "permission_error",
                "Your API key does not have permission to use the specified resource.",
            ),
            ClientError,
        ),
        case(
            "anthropic unknown model",
            404,
            anthropic("not_found_error", "model: claude-nope"),
            ClientError,
        ),
        case(
            "anthropic unknown model named like a quota error",
            404,
            anthropic("not_found_error", "model: insufficient_quota"),
            ClientError,
        ),
        case(
            "anthropic too large",
            413,
            anthropic("request_too_large", "Request exceeds the maximum allowed number of bytes."),
            ClientError,
        ),
        Case {
            headers: vec![("retry-after", "20".into())],
            reset_at_ms: Some(Some(NOW + 20_000)),
            ..case(
                "anthropic api-key rate limit",
                429,
                anthropic("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
                Busy,
            )
        },
        Case {
            headers: vec![
                ("anthropic-ratelimit-unified-status", "rejected".into()),
                ("anthropic-ratelimit-unified-representative-claim", "five_hour".into()),
                ("anthropic-ratelimit-unified-5h-status", "rejected".into()),
                ("anthropic-ratelimit-unified-5h-reset", (SECONDS + 7200).to_string()),
                ("anthropic-ratelimit-unified-7d-status", "allowed".into()),
                ("anthropic-ratelimit-unified-7d-reset", (SECONDS + 400_000).to_string()),
                ("anthropic-ratelimit-unified-reset", (SECONDS + 7200).to_string()),
            ],
            reset_at_ms: Some(Some(NOW + 7_200_000)),
            ..case(
                "claude subscription window rejected",
                429,
                anthropic("rate_limit_error", "This request would exceed your account's rate limit."),
                WindowExhausted,
            )
        },
        Case {
            headers: vec![
                ("anthropic-ratelimit-unified-status", "rejected".into()),
                ("anthropic-ratelimit-unified-representative-claim", "seven_day".into()),
                ("anthropic-ratelimit-unified-5h-reset", (SECONDS + 600).to_string()),
                ("anthropic-ratelimit-unified-7d-reset", (SECONDS + 300_000).to_string()),
            ],
            reset_at_ms: Some(Some(NOW + 300_000_000)),
            ..case(
                "claude subscription: the representative claim's reset",
                429,
                anthropic("rate_limit_error", "rate limited"),
                WindowExhausted,
            )
        },
        Case {
            headers: vec![
                ("anthropic-ratelimit-unified-status", "allowed_warning".into()),
                ("anthropic-ratelimit-unified-reset", (SECONDS + 7200).to_string()),
                ("retry-after", "7200".into()),
            ],
            ..case(
                "claude subscription 429 without rejected is busy, whatever the reset",
                429,
                anthropic("rate_limit_error", "rate limited"),
                Busy,
            )
        },
        case(
            "anthropic api error",
            500,
            anthropic("api_error", "Internal server error"),
            Broken,
        ),
        case(
            "anthropic overloaded",
            529,
            anthropic("overloaded_error", "Overloaded"),
            Busy,
        ),
        // OpenAI
        case(
            "openai bad key",
            401,
            openai(
                "invalid_request_error",
                Some("invalid_api_key"),
                "Incorrect API key provided: sk-abc***xyz.",
            ),
            Unauthorized,
        ),
        case(
            "openai insufficient quota",
            429,
            openai(
                "insufficient_quota",
                Some("insufficient_quota"),
                "You exceeded your current quota, please check your plan and billing details.",
            ),
            QuotaGone,
        ),
        case(
            "openai billing hard limit",
            400,
            openai(
                "invalid_request_error",
                Some("billing_hard_limit_reached"),
                "Billing hard limit has been reached",
            ),
            QuotaGone,
        ),
        Case {
            headers: vec![("retry-after", "Tue, 14 Nov 2023 22:13:50 GMT".into())],
            reset_at_ms: Some(Some(NOW + 30_000)),
            ..case(
                "openai rate limit, retry-after as an http date",
                429,
                openai(
                    "requests",
                    Some("rate_limit_exceeded"),
                    "Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): Limit 500, Used 500.",
                ),
                Busy,
            )
        },
        case(
            "openai unknown model",
            404,
            openai(
                "invalid_request_error",
                Some("model_not_found"),
                "The model `insufficient_quota` does not exist or you do not have access to it.",
            ),
            ClientError,
        ),
        case(
            "openai context too long",
            400,
            openai(
                "invalid_request_error",
                Some("context_length_exceeded"),
                "This model's maximum context length is 128000 tokens.",
            ),
            ClientError,
        ),
        case(
            "openai server error",
            500,
            openai("server_error", None, "The server had an error while processing your request."),
            Broken,
        ),
        Case {
            reset_at_ms: Some(Some((SECONDS + 3600) * 1000)),
            ..case(
                "codex usage limit reached",
                429,
                json!({"error": {"type": "usage_limit_reached", "message": "The usage limit has been reached", "plan_type": "plus", "resets_at": SECONDS + 3600, "resets_in_seconds": 3600}}).to_string(),
                WindowExhausted,
            )
        },
        Case {
            headers: vec![
                ("x-codex-primary-used-percent", "100".into()),
                ("x-codex-primary-reset-after-seconds", "1800".into()),
                ("x-codex-secondary-used-percent", "35".into()),
                ("x-codex-secondary-reset-after-seconds", "90000".into()),
            ],
            reset_at_ms: Some(Some(NOW + 1_800_000)),
            ..case("codex primary window used up", 429, "{}".into(), WindowExhausted)
        },
        // Not JSON at all.
        case("html 403 from a proxy", 403, "<html>denied</html>".into(), Broken),
        case("bare 409", 409, String::new(), Conflict),
    ]
}

#[test]
fn real_error_answers_get_their_class() {
    for case in table() {
        let mut map = headers(&case.headers);
        if case.name.starts_with("html") {
            map.remove(http::header::CONTENT_TYPE);
        }
        let classified = classify(case.status, &map, case.body.as_bytes(), NOW, THRESHOLD);
        assert_eq!(classified.class, case.class, "{}", case.name);
        if let Some(reset) = case.reset_at_ms {
            assert_eq!(classified.reset_at_ms, reset, "{}", case.name);
        }
    }
}

#[test]
fn error_events_inside_a_200_stream_are_never_successes() {
    let cases: [(Value, OutcomeClass); 6] = [
        (
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            Busy,
        ),
        (
            json!({"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}),
            Broken,
        ),
        (
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "model: x"}}),
            ClientError,
        ),
        (
            json!({"type": "response.failed", "response": {"id": "resp_1", "status": "failed", "error": {"code": "server_error", "message": "boom"}}}),
            Broken,
        ),
        (
            json!({"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "param": null}),
            Busy,
        ),
        (
            json!({"error": {"message": "The server had an error", "type": "server_error"}}),
            Broken,
        ),
    ];
    for (event, class) in cases {
        assert!(is_stream_error(&event), "{event}");
        let classified = classify_stream_error(&event);
        assert_eq!(classified.class, class, "{event}");
        assert_ne!(classified.class, Success);
    }
    for event in [
        json!({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "an \"error\": {} in text"}}),
        json!({"type": "response.completed", "response": {"id": "resp_1", "error": null}}),
    ] {
        assert!(!is_stream_error(&event), "{event}");
    }
}

/// Error answers that echo client input, as the real APIs do, with `{}` where the client's
/// string goes; every one has fixed upstream text on at least one side of it.
const ECHOES: &[(u16, &str, Option<&str>, &str)] = &[
    (404, "not_found_error", None, "model: {}"),
    (
        400,
        "invalid_request_error",
        None,
        "{}: Extra inputs are not permitted",
    ),
    (
        400,
        "invalid_request_error",
        None,
        "messages.0.content.0: Input tag '{}' found using 'type' does not match any of the expected tags",
    ),
    (
        400,
        "invalid_request_error",
        Some("model_not_found"),
        "The model `{}` does not exist or you do not have access to it.",
    ),
    (
        400,
        "invalid_request_error",
        Some("invalid_value"),
        "Invalid value: '{}'. Supported values are: 'auto'.",
    ),
    (
        403,
        "permission_error",
        None,
        "model {} is not available on your plan",
    ),
    (413, "request_too_large", None, "request for {} too large"),
    (422, "invalid_request_error", None, "unprocessable: {}"),
    (429, "rate_limit_error", None, "rate limit exceeded for {}"),
    (500, "api_error", None, "internal error while handling {}"),
    (529, "overloaded_error", None, "overloaded while serving {}"),
];

/// What a hostile client would try: every phrase the old classifier searched for, the whole
/// credit-balance sentence, JSON and header lookalikes, and anything else.
fn client_strings() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("insufficient_quota".to_owned()),
        Just("billing_error".to_owned()),
        Just("Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.".to_owned()),
        Just("exceeded your current quota".to_owned()),
        Just("billing_hard_limit_reached".to_owned()),
        Just("\"},\"type\":\"billing_error".to_owned()),
        Just("anthropic-ratelimit-unified-status: rejected".to_owned()),
        "\\PC{0,120}",
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn no_client_string_changes_the_class(echo in 0..ECHOES.len(), anthropic_shape in any::<bool>(), client in client_strings()) {
        let (status, kind, code, template) = ECHOES[echo];
        let body = |input: &str| {
            let message = template.replace("{}", input);
            if anthropic_shape {
                anthropic(kind, &message)
            } else {
                openai(kind, code, &message)
            }
        };
        let map = headers(&[]);
        let baseline = classify(status, &map, body("x").as_bytes(), NOW, THRESHOLD);
        let crafted = classify(status, &map, body(&client).as_bytes(), NOW, THRESHOLD);
        prop_assert_eq!(crafted, baseline, "client input {:?} changed the class", client);
        prop_assert!(!matches!(crafted.class, QuotaGone | WindowExhausted | Unauthorized));
    }
}
