//! Classifying an upstream outcome, once, into exactly one class (DESIGN §1). The body decides
//! before the status: a 429 whose body says `insufficient_quota` is *quota gone*, not *busy*.
//! Then reset headers decide soft (busy) against hard (window exhausted).

use http::HeaderMap;
use selector_svc::domain::OutcomeClass;

/// A classified outcome, with the label failover metrics use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classified {
    pub class: OutcomeClass,
    /// When the upstream said the limit resets, ms since the epoch.
    pub reset_at_ms: Option<i64>,
    /// Failover reason label: `429`, `529`, `5xx`, `401`, `network`, `quota`, `409`, `client`.
    pub label: &'static str,
}

const QUOTA_MARKERS: [&str; 4] = [
    "insufficient_quota",
    "credit balance is too low",
    "billing_hard_limit_reached",
    "exceeded your current quota",
];

fn header_i64(headers: &HeaderMap, name: &str) -> Option<i64> {
    headers
        .get(name)?
        .to_str()
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        // Upstream headers are input: clamp to ±100 years of seconds so no arithmetic overflows.
        .map(|v| v.clamp(-3.2e9, 3.2e12) as i64)
}

/// Every reset the upstream announced for an exhausted limit, as ms since the epoch; the latest
/// wins (the account is unusable until all of them passed).
pub fn reset_at_ms(headers: &HeaderMap, now_ms: i64) -> Option<i64> {
    let mut resets = Vec::new();
    if let Some(seconds) = header_i64(headers, "retry-after") {
        resets.push(now_ms.saturating_add(seconds.max(0).saturating_mul(1000)));
    }
    if let Some(ms) = header_i64(headers, "retry-after-ms") {
        resets.push(now_ms.saturating_add(ms.max(0)));
    }
    // Anthropic subscription windows: epoch seconds.
    if let Some(at) = header_i64(headers, "anthropic-ratelimit-unified-reset") {
        resets.push(at.saturating_mul(1000));
    }
    for window in ["5h", "7d", "7d_opus", "7d_sonnet"] {
        let rejected = headers
            .get(format!("anthropic-ratelimit-unified-{window}-status"))
            .and_then(|v| v.to_str().ok())
            .is_some_and(|status| status == "rejected");
        if rejected
            && let Some(at) = header_i64(
                headers,
                &format!("anthropic-ratelimit-unified-{window}-reset"),
            )
        {
            resets.push(at.saturating_mul(1000));
        }
    }
    // Codex windows: a window at 100 % resets after so many seconds.
    for window in ["primary", "secondary"] {
        let used = header_i64(headers, &format!("x-codex-{window}-used-percent")).unwrap_or(0);
        if used >= 100
            && let Some(seconds) =
                header_i64(headers, &format!("x-codex-{window}-reset-after-seconds"))
        {
            resets.push(now_ms.saturating_add(seconds.max(0).saturating_mul(1000)));
        }
    }
    resets.into_iter().max()
}

fn looks_like_quota(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(&body[..body.len().min(16 * 1024)]).to_ascii_lowercase();
    QUOTA_MARKERS.iter().any(|marker| text.contains(marker))
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("json"))
}

/// Classifies a response the upstream sent.
pub fn classify(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    now_ms: i64,
    hard_block_threshold_ms: u64,
) -> Classified {
    let outcome = |class, label| Classified {
        class,
        reset_at_ms: None,
        label,
    };
    if (200..300).contains(&status) {
        return outcome(OutcomeClass::Success, "success");
    }
    if status == 402 || (status >= 400 && looks_like_quota(body)) {
        return outcome(OutcomeClass::QuotaGone, "quota");
    }
    match status {
        409 | 423 => outcome(OutcomeClass::Conflict, "409"),
        429 => {
            let reset = reset_at_ms(headers, now_ms);
            let threshold = i64::try_from(hard_block_threshold_ms).unwrap_or(i64::MAX);
            let hard = reset.is_some_and(|at| at.saturating_sub(now_ms) > threshold);
            Classified {
                class: if hard {
                    OutcomeClass::WindowExhausted
                } else {
                    OutcomeClass::Busy
                },
                reset_at_ms: reset,
                label: "429",
            }
        }
        529 => Classified {
            class: OutcomeClass::Busy,
            reset_at_ms: reset_at_ms(headers, now_ms).filter(|at| {
                at.saturating_sub(now_ms)
                    <= i64::try_from(hard_block_threshold_ms).unwrap_or(i64::MAX)
            }),
            label: "529",
        },
        401 => outcome(OutcomeClass::Unauthorized, "401"),
        // A JSON 403 is the upstream refusing the credential; an HTML one is a proxy in the way.
        403 if is_json(headers) => outcome(OutcomeClass::Unauthorized, "401"),
        403 => outcome(OutcomeClass::Broken, "5xx"),
        500..=599 => outcome(OutcomeClass::Broken, "5xx"),
        _ => outcome(OutcomeClass::ClientError, "client"),
    }
}

/// A network error or timeout before any response.
pub fn network_failure() -> Classified {
    Classified {
        class: OutcomeClass::Broken,
        reset_at_ms: None,
        label: "network",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
                value.parse().expect("value"),
            );
        }
        map
    }

    const NOW: i64 = 1_700_000_000_000;
    const THRESHOLD: u64 = 60_000;

    #[test]
    fn the_body_decides_before_the_status() {
        let body = br#"{"error":{"type":"insufficient_quota","message":"You exceeded your current quota"}}"#;
        let c = classify(429, &HeaderMap::new(), body, NOW, THRESHOLD);
        assert_eq!((c.class, c.label), (OutcomeClass::QuotaGone, "quota"));
        let credit = br#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#;
        assert_eq!(
            classify(400, &HeaderMap::new(), credit, NOW, THRESHOLD).class,
            OutcomeClass::QuotaGone
        );
        assert_eq!(
            classify(402, &HeaderMap::new(), b"", NOW, THRESHOLD).class,
            OutcomeClass::QuotaGone
        );
    }

    #[test]
    fn a_429_is_busy_unless_its_reset_is_far_ahead() {
        assert_eq!(
            classify(429, &HeaderMap::new(), b"{}", NOW, THRESHOLD).class,
            OutcomeClass::Busy
        );
        let soon = headers(&[("retry-after", "20")]);
        let c = classify(429, &soon, b"{}", NOW, THRESHOLD);
        assert_eq!(
            (c.class, c.reset_at_ms),
            (OutcomeClass::Busy, Some(NOW + 20_000))
        );
        let later = headers(&[(
            "anthropic-ratelimit-unified-reset",
            &((NOW / 1000) + 7200).to_string(),
        )]);
        let c = classify(429, &later, b"{}", NOW, THRESHOLD);
        assert_eq!(c.class, OutcomeClass::WindowExhausted);
        assert_eq!(c.reset_at_ms, Some(NOW + 7_200_000));
        let codex = headers(&[
            ("x-codex-primary-used-percent", "100"),
            ("x-codex-primary-reset-after-seconds", "3600"),
            ("x-codex-secondary-used-percent", "40"),
            ("x-codex-secondary-reset-after-seconds", "90000"),
        ]);
        let c = classify(429, &codex, b"{}", NOW, THRESHOLD);
        assert_eq!(
            (c.class, c.reset_at_ms),
            (OutcomeClass::WindowExhausted, Some(NOW + 3_600_000))
        );
        let window = headers(&[
            ("anthropic-ratelimit-unified-5h-status", "rejected"),
            (
                "anthropic-ratelimit-unified-5h-reset",
                &((NOW / 1000) + 600).to_string(),
            ),
            ("anthropic-ratelimit-unified-7d-status", "allowed"),
            (
                "anthropic-ratelimit-unified-7d-reset",
                &((NOW / 1000) + 99_999).to_string(),
            ),
        ]);
        assert_eq!(
            classify(429, &window, b"{}", NOW, THRESHOLD).reset_at_ms,
            Some(NOW + 600_000)
        );
    }

    #[test]
    fn overloaded_is_busy_and_5xx_is_broken() {
        assert_eq!(
            classify(529, &HeaderMap::new(), b"{}", NOW, THRESHOLD).class,
            OutcomeClass::Busy
        );
        for status in [500, 502, 503, 504] {
            assert_eq!(
                classify(status, &HeaderMap::new(), b"oops", NOW, THRESHOLD).class,
                OutcomeClass::Broken
            );
        }
    }

    #[test]
    fn auth_conflict_and_client_errors() {
        assert_eq!(
            classify(401, &HeaderMap::new(), b"{}", NOW, THRESHOLD).class,
            OutcomeClass::Unauthorized
        );
        let json = headers(&[("content-type", "application/json")]);
        let html = headers(&[("content-type", "text/html")]);
        assert_eq!(
            classify(403, &json, b"{}", NOW, THRESHOLD).class,
            OutcomeClass::Unauthorized
        );
        assert_eq!(
            classify(403, &html, b"<html>", NOW, THRESHOLD).class,
            OutcomeClass::Broken
        );
        assert_eq!(
            classify(409, &HeaderMap::new(), b"", NOW, THRESHOLD).class,
            OutcomeClass::Conflict
        );
        for status in [400, 404, 413, 422] {
            assert_eq!(
                classify(status, &json, b"{}", NOW, THRESHOLD).class,
                OutcomeClass::ClientError
            );
        }
        assert_eq!(
            classify(200, &json, b"{}", NOW, THRESHOLD).class,
            OutcomeClass::Success
        );
    }
}
