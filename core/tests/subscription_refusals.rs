//! The upstream's answers meaning "this token serves only its own CLI" or "this is third-party
//! traffic" are request-class (`ClientError` / `subscription`: nothing written, the relay fails
//! over to an API-key account), read from the upstream's exact wording (docs/SUBSCRIPTIONS.md,
//! "What the upstreams enforce"). Message text only ever makes an answer request-class: an echo
//! of client input elsewhere in a message matches nothing.

use http::{HeaderMap, HeaderName, HeaderValue};
use poolgate_core::classify::classify;
use poolgate_core::outcome::{Decision, Outcome, OutcomeClass, RuntimeBlockSettings, decide};

const NOW: i64 = 1_790_000_000_000;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.insert(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
    }
    map
}

fn anthropic_error(kind: &str, message: &str) -> String {
    serde_json::json!({"type": "error", "error": {"type": kind, "message": message}}).to_string()
}

#[test]
fn the_upstreams_subscription_refusals_are_request_class() {
    let json = headers(&[("content-type", "application/json")]);
    let cases = [
        // Since 2026-03-17, a non-Haiku model without Claude Code's billing block (the sources of
        // every wording here: docs/SUBSCRIPTIONS.md).
        (400, anthropic_error("invalid_request_error", "Error")),
        // Since April 2026, both wordings.
        (
            400,
            anthropic_error(
                "invalid_request_error",
                "Third-party apps now draw from your extra usage, not your plan limits. We've added a $100 credit to get you started. Claim it at claude.ai/settings/usage and keep going.",
            ),
        ),
        (
            400,
            anthropic_error(
                "invalid_request_error",
                "Third-party apps now draw from extra usage, not plan limits. Ask your workspace admin to add more and keep going.",
            ),
        ),
        // 2025 to early 2026.
        (
            400,
            anthropic_error(
                "invalid_request_error",
                "This credential is only authorized for use with Claude Code and cannot be used for other API requests.",
            ),
        ),
        // A bare "Error" 429 with no rate-limit header at all.
        (429, anthropic_error("rate_limit_error", "Error")),
    ];
    for (status, body) in cases {
        let got = classify(status, &json, body.as_bytes(), NOW, 60_000);
        assert!(got.is_subscription_refusal(), "{status} {body}: {got:?}");
        assert_eq!(got.class, OutcomeClass::ClientError);
        assert_eq!(
            decide(
                &Outcome::new(1, got.class, status),
                &RuntimeBlockSettings::default(),
                NOW
            ),
            Decision::Nothing,
            "nothing written"
        );
    }
}

#[test]
fn other_answers_are_not_taken_for_subscription_refusals() {
    let json = headers(&[("content-type", "application/json")]);
    let not = [
        // Client input echoed after fixed text: the opening is not the upstream's.
        (
            400,
            &json,
            anthropic_error(
                "invalid_request_error",
                "messages.0.content: Third-party apps now draw from extra usage, not plan limits",
            ),
        ),
        (
            400,
            &json,
            anthropic_error("invalid_request_error", "Error: max_tokens too large"),
        ),
        // A bare "Error" of another type, or on another status.
        (400, &json, anthropic_error("api_error", "Error")),
        (401, &json, anthropic_error("authentication_error", "Error")),
    ];
    for (status, headers, body) in not {
        let got = classify(status, headers, body.as_bytes(), NOW, 60_000);
        assert!(!got.is_subscription_refusal(), "{status} {body}: {got:?}");
    }
    // The credit-balance 400 stays a billing answer.
    let credit = anthropic_error(
        "invalid_request_error",
        "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
    );
    assert_eq!(
        classify(400, &json, credit.as_bytes(), NOW, 60_000).class,
        OutcomeClass::QuotaGone
    );
    // A bare "Error" 429 that states a limit is about that limit: busy, not a refusal.
    let error = anthropic_error("rate_limit_error", "Error");
    for limit in [
        ("anthropic-ratelimit-unified-status", "allowed"),
        ("retry-after", "5"),
        ("anthropic-ratelimit-requests-remaining", "0"),
    ] {
        let got = classify(429, &headers(&[limit]), error.as_bytes(), NOW, 60_000);
        assert_eq!(
            (got.class, got.label),
            (OutcomeClass::Busy, "429"),
            "{limit:?}"
        );
    }
}
