//! Classifying an upstream outcome, once, into exactly one class (docs/DESIGN.md §1), from what the
//! upstream *asserts*: the status, the structured error fields each provider defines (Anthropic
//! `error.type`; OpenAI `error.type` / `error.code`) and documented headers.
//!
//! Message text is never enough on its own to change an account's health: upstreams echo the
//! client's input into it ("model: insufficient_quota"). It is read in two places only:
//! - Anthropic's credit-balance answer (a 400 `invalid_request_error`), and then only its
//!   documented opening and closing, and only to ask for a confirmation the client cannot shape
//!   (`confirm.rs`);
//! - the one stated exception: message text may make an answer *request-class* (nothing
//!   written), never the reverse. The upstreams' subscription refusals (a bare "Error" 400, the
//!   "Third-party apps now draw from … extra usage" and "only authorized for use with Claude
//!   Code" 400s, a 429 whose message is the bare "Error" with no rate-limit header) are
//!   `ClientError` / `subscription`: an echo that matches one only fails the request over.
//!
//! Who can change what:
//! - client-caused answers (`invalid_request_error`, `not_found_error`, 400/404/413/422) never
//!   touch account health;
//! - billing-class answers (`QuotaGone`) fail over and ask for confirmation; they never retire
//!   by themselves;
//! - a 429 is a window exhaustion only when the upstream says an account-wide window is used up
//!   (`anthropic-ratelimit-unified-status: rejected` about the 5h or 7d claim, a Codex primary
//!   or secondary window at 100 %, `usage_limit_reached` naming no other limit); a model-scoped
//!   limit (`windows::refused_by`: the Opus, Sonnet or Fable weekly claim, a Codex named limit)
//!   is `ClientError` / `model_limit`, which writes nothing; otherwise it is busy.

use http::HeaderMap;
use serde_json::Value;

use crate::outcome::OutcomeClass;
use crate::windows::{RefusedBy, refused_by};

/// A classified outcome, with the label failover metrics use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classified {
    pub class: OutcomeClass,
    /// When the upstream said the limit resets, ms since the epoch.
    pub reset_at_ms: Option<i64>,
    /// Failover reason label: `429`, `529`, `5xx`, `401`, `refused`, `connect`, `network`,
    /// `quota`, `409`, `client`, `subscription`, `model_limit`, `stream_error`.
    pub label: &'static str,
}

impl Classified {
    fn new(class: OutcomeClass, label: &'static str) -> Self {
        Classified {
            class,
            reset_at_ms: None,
            label,
        }
    }

    /// A 401/403 that refuses the *request*, not the credential (`permission_error`, a model
    /// the project may not use, a scope the key lacks for this endpoint): the client chose it.
    /// Another account may answer differently; the account's health is not touched.
    pub fn is_permission_refusal(&self) -> bool {
        self.class == OutcomeClass::ClientError && self.label == "refused"
    }

    /// The upstream's word that this subscription token serves only its own CLI, or that the
    /// request is third-party traffic it bills as extra usage (docs/SUBSCRIPTIONS.md, "What the
    /// upstreams enforce"): about the request and the kind of credential, never the account's
    /// health. Every subscription account of the platform would answer the same.
    pub fn is_subscription_refusal(&self) -> bool {
        self.class == OutcomeClass::ClientError && self.label == "subscription"
    }

    /// A 429 of a model-scoped limit (a weekly limit of one model family): the account serves
    /// every other model, so it is no account-wide block; the window reading the answer carries
    /// keeps that family off the account until its reset.
    pub fn is_model_limit(&self) -> bool {
        self.class == OutcomeClass::ClientError && self.label == "model_limit"
    }

    /// No answer because the connection never got as far as sending the request (DNS, TCP
    /// connect, TLS handshake): nothing of the client's request reached the upstream.
    pub fn is_connect_failure(&self) -> bool {
        self.label == "connect"
    }
}

/// The structured part of an upstream error body: Anthropic
/// `{"type":"error","error":{"type":…,"message":…}}`, OpenAI
/// `{"error":{"type":…,"code":…,"message":…}}`, or an SSE error event of either.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamError {
    /// `error.type`, as the upstream spelled it.
    pub kind: Option<String>,
    /// OpenAI's `error.code` (a string; numeric codes are ignored).
    pub code: Option<String>,
    /// `error.message`: may carry the client's input; read only where documented above.
    pub message: String,
}

impl UpstreamError {
    /// Reads the structured fields of a JSON error body; `None` when it is not one.
    pub fn parse(body: &[u8]) -> Option<Self> {
        let json: Value = serde_json::from_slice(body).ok()?;
        Self::from_json(&json)
    }

    pub fn from_json(json: &Value) -> Option<Self> {
        let error = json.get("error")?;
        // Some OpenAI-compatible upstreams send `{"error": "text"}`: no structure to read.
        let error = error.as_object()?;
        let text = |name: &str| {
            error
                .get(name)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .filter(|s| !s.is_empty())
        };
        Some(UpstreamError {
            kind: text("type"),
            code: text("code"),
            message: text("message").unwrap_or_default(),
        })
    }

    fn is(&self, names: &[&str]) -> bool {
        [&self.kind, &self.code]
            .into_iter()
            .flatten()
            .any(|value| names.contains(&value.as_str()))
    }

    /// The account has no money left on it, as the upstream states it.
    fn is_billing(&self, status: u16) -> bool {
        if self.is(BILLING) {
            return true;
        }
        // Anthropic answers an empty prepaid balance with a 400 `invalid_request_error`. Its
        // message is the only sign, so the documented text must be the *whole* message: open
        // and close it. Upstreams echo client input with fixed text on at least one side
        // ("model: …", "…: Extra inputs are not permitted"), so an echo never matches.
        let message = self.message.trim().to_ascii_lowercase();
        status == 400
            && self.kind.as_deref() == Some("invalid_request_error")
            && message.starts_with(CREDIT_BALANCE_OPENING)
            && message.ends_with(CREDIT_BALANCE_CLOSING)
    }

    /// A 400 meaning "this token serves only its own CLI" or "this is third-party traffic"
    /// (docs/SUBSCRIPTIONS.md): Anthropic's bare `invalid_request_error` "Error", its
    /// "Third-party apps now draw from … extra usage" and its "only authorized for use with
    /// Claude Code". Message text, read only to make an answer request-class (nothing written).
    fn is_subscription_refusal(&self) -> bool {
        let message = self.message.trim();
        if message == "Error" {
            return self.kind.as_deref() == Some("invalid_request_error");
        }
        let message = message.to_ascii_lowercase();
        SUBSCRIPTION_OPENINGS
            .iter()
            .any(|opening| message.starts_with(opening))
    }

    /// Anthropic's answer to a revoked OAuth token: a `permission_error` (or
    /// `authentication_error`) whose *whole* message is "OAuth token has been revoked. Please
    /// obtain a new token." (docs/SUBSCRIPTIONS.md names the reports). Its type alone
    /// would read as the request's refusal, so the revoked token would never be refreshed. The
    /// message only makes the credential *suspected*: the selector confirms with the stored
    /// token before anything is written (docs/SECURITY.md, "Health writes"), and an echo of
    /// client input never matches a whole fixed message.
    fn is_revoked_oauth_token(&self) -> bool {
        let message = self.message.trim().to_ascii_lowercase();
        matches!(
            self.kind.as_deref(),
            Some("permission_error" | "authentication_error")
        ) && REVOKED_TOKEN_MESSAGES.contains(&message.as_str())
    }

    /// `type` and `code`, reduced to a safe alphabet: fit for a status reason or a log line
    /// (never the message, which can carry client input).
    pub fn summary(&self) -> String {
        let clean = |text: &str| -> String {
            text.chars()
                .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                .take(64)
                .collect()
        };
        match (&self.kind, &self.code) {
            (Some(kind), Some(code)) if kind != code => format!("{}/{}", clean(kind), clean(code)),
            (Some(kind), _) => clean(kind),
            (None, Some(code)) => clean(code),
            (None, None) => String::new(),
        }
    }
}

/// What a 401 or 403 refuses (docs/SECURITY.md, "Health writes"), read from the error's code
/// before its type: a code is the most specific thing the upstream asserts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The request: a model not found or not permitted, a scope the key lacks for this
    /// endpoint, `permission_error`. The client chose it; never reported.
    Request,
    /// The credential: an invalid, expired or revoked key or token. Confirmed by the probe.
    Credential,
    /// Neither is asserted. Confirmed by the probe; never taken for a client error.
    Unknown,
}

/// Codes that name the credential (OpenAI `invalid_api_key`; ChatGPT's token codes).
const CREDENTIAL_CODES: &[&str] = &[
    "invalid_api_key",
    "token_expired",
    "token_revoked",
    "token_invalidated",
    "invalid_token",
    "account_deactivated",
];

/// Codes that name the request (OpenAI's 403 for a model the project may not use).
const REQUEST_CODES: &[&str] = &["model_not_found", "unsupported_model", "missing_scope"];

/// Types that name the credential (Anthropic, and OpenAI-compatible upstreams).
const CREDENTIAL_TYPES: &[&str] = &["authentication_error", "invalid_authentication"];

/// Types that name the request: Anthropic's `permission_error` and `not_found_error`; OpenAI's
/// `invalid_request_error` when no credential code says otherwise (a restricted key's
/// "Missing scopes: api.responses.write" is a 401 `invalid_request_error` with no code).
const REQUEST_TYPES: &[&str] = &[
    "permission_error",
    "not_found_error",
    "invalid_request_error",
];

/// What a 401/403's error body refuses; `None` for a body with no structured error.
pub fn refusal(error: Option<&UpstreamError>) -> Refusal {
    let Some(error) = error else {
        return Refusal::Unknown;
    };
    if error.is_revoked_oauth_token() {
        return Refusal::Credential;
    }
    if let Some(code) = error.code.as_deref() {
        if CREDENTIAL_CODES.contains(&code) {
            return Refusal::Credential;
        }
        if REQUEST_CODES.contains(&code) {
            return Refusal::Request;
        }
    }
    match error.kind.as_deref() {
        Some(kind) if CREDENTIAL_TYPES.contains(&kind) => Refusal::Credential,
        // A code we do not know next to a request type: the code may name the credential in a
        // way we have not seen, so it is not taken for the request's doing.
        Some(kind) if REQUEST_TYPES.contains(&kind) && error.code.is_none() => Refusal::Request,
        Some("permission_error" | "not_found_error") => Refusal::Request,
        _ => Refusal::Unknown,
    }
}

/// Anthropic's whole message for a revoked OAuth token, lowercase (the short form is the
/// older one).
const REVOKED_TOKEN_MESSAGES: &[&str] = &[
    "oauth token has been revoked. please obtain a new token.",
    "oauth token has been revoked.",
];

/// Error types and codes that mean "the account's money or plan is gone" (either provider).
const BILLING: &[&str] = &[
    "billing_error",
    "insufficient_quota",
    "billing_hard_limit_reached",
    "billing_not_active",
];

/// How Anthropic's "Your credit balance is too low to access the Anthropic API. Please go to
/// Plans & Billing to upgrade or purchase credits." opens and closes.
const CREDIT_BALANCE_OPENING: &str = "your credit balance is too low";
const CREDIT_BALANCE_CLOSING: &str = "purchase credits.";

/// How the upstream's subscription refusals open (lowercase): the third-party answer in both
/// wordings seen since April 2026, and the older Claude-Code-only one (the sources:
/// docs/SUBSCRIPTIONS.md, "What the upstreams enforce, and how we know").
const SUBSCRIPTION_OPENINGS: &[&str] = &[
    "third-party apps now draw from extra usage, not plan limits",
    "third-party apps now draw from your extra usage, not your plan limits",
    "this credential is only authorized for use with claude code",
];

/// Whether an answer carries any rate-limit header: a 429 with one is about a limit, never a
/// subscription refusal.
fn states_limits(headers: &HeaderMap) -> bool {
    headers.keys().any(|name| {
        let name = name.as_str();
        name.starts_with("anthropic-ratelimit-")
            || name.starts_with("x-codex-")
            || name.starts_with("x-ratelimit-")
            || name == "retry-after"
            || name == "retry-after-ms"
    })
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name)?.to_str().ok().map(str::trim)
}

fn header_i64(headers: &HeaderMap, name: &str) -> Option<i64> {
    parse_number(header(headers, name)?)
}

/// Upstream headers are input: clamp to ±100 years of seconds so no arithmetic overflows.
fn parse_number(text: &str) -> Option<i64> {
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .map(|v| v.clamp(-3.2e9, 3.2e12) as i64)
}

/// `Retry-After` as delay seconds or as an HTTP date (RFC 9110 §10.2.3), as ms since the epoch.
pub fn retry_after_at_ms(headers: &HeaderMap, now_ms: i64) -> Option<i64> {
    let value = header(headers, "retry-after")?;
    if let Some(seconds) = parse_number(value) {
        return Some(now_ms.saturating_add(seconds.max(0).saturating_mul(1000)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))?;
    Some(ms.max(now_ms))
}

/// Every reset the upstream announced, as ms since the epoch; the latest wins. Used for how long
/// a busy account is moved back (soft block), never to decide a hard block on its own.
pub fn reset_at_ms(headers: &HeaderMap, now_ms: i64) -> Option<i64> {
    let mut resets = Vec::new();
    resets.extend(retry_after_at_ms(headers, now_ms));
    if let Some(ms) = header_i64(headers, "retry-after-ms") {
        resets.push(now_ms.saturating_add(ms.max(0)));
    }
    // An account-wide window's reset; a model-scoped limit's is no reason to move the whole
    // account back.
    if let Some(RefusedBy::Account {
        reset_at_ms: Some(at),
    }) = refused_by(headers, b"", now_ms)
    {
        resets.push(at);
    }
    resets.into_iter().max()
}

fn is_json(headers: &HeaderMap) -> bool {
    header(headers, http::header::CONTENT_TYPE.as_str()).is_some_and(|ct| ct.contains("json"))
}

/// Classifies a response the upstream sent.
pub fn classify(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    now_ms: i64,
    hard_block_threshold_ms: u64,
) -> Classified {
    if (200..300).contains(&status) {
        return Classified::new(OutcomeClass::Success, "success");
    }
    let error = UpstreamError::parse(&body[..body.len().min(64 * 1024)]);
    let error = error.as_ref();
    let threshold = i64::try_from(hard_block_threshold_ms).unwrap_or(i64::MAX);
    if status == 402 || error.is_some_and(|e| e.is_billing(status)) {
        return Classified::new(OutcomeClass::QuotaGone, "quota");
    }
    if error.is_some_and(|e| e.is(&["overloaded_error"])) || status == 529 {
        return Classified {
            class: OutcomeClass::Busy,
            reset_at_ms: reset_at_ms(headers, now_ms)
                .filter(|at| at.saturating_sub(now_ms) <= threshold),
            label: "529",
        };
    }
    match status {
        429 if error.is_some_and(|e| e.message.trim() == "Error") && !states_limits(headers) => {
            Classified::new(OutcomeClass::ClientError, "subscription")
        }
        429 => {
            let body = &body[..body.len().min(64 * 1024)];
            match refused_by(headers, body, now_ms) {
                // A limit of one model family: the account serves every other model, so
                // nothing is written; the answer's window reading keeps the family off it.
                Some(RefusedBy::Models { reset_at_ms }) => Classified {
                    class: OutcomeClass::ClientError,
                    reset_at_ms,
                    label: "model_limit",
                },
                Some(RefusedBy::Account { reset_at_ms: reset }) => Classified {
                    class: OutcomeClass::WindowExhausted,
                    reset_at_ms: reset.or_else(|| reset_at_ms(headers, now_ms)),
                    label: "429",
                },
                None => Classified {
                    class: OutcomeClass::Busy,
                    reset_at_ms: reset_at_ms(headers, now_ms),
                    label: "429",
                },
            }
        }
        409 | 423 => Classified::new(OutcomeClass::Conflict, "409"),
        401 | 403 => match refusal(error) {
            Refusal::Request => Classified::new(OutcomeClass::ClientError, "refused"),
            Refusal::Credential => Classified::new(OutcomeClass::Unauthorized, "401"),
            // An HTML 403 is a proxy or firewall in the way, not the upstream's word.
            Refusal::Unknown if status == 403 && !is_json(headers) && error.is_none() => {
                Classified::new(OutcomeClass::Broken, "5xx")
            }
            // Suspected, never assumed: the selector's probe decides.
            Refusal::Unknown => Classified::new(OutcomeClass::Unauthorized, "401"),
        },
        // Cohere's "invalid token" (its SDK's `InvalidTokenError`, cohere-python 7.0.9
        // `v2/raw_client.py`): the credential refused, suspected like a 401 until the probe
        // confirms it.
        498 => Classified::new(OutcomeClass::Unauthorized, "401"),
        400 if error.is_some_and(UpstreamError::is_subscription_refusal) => {
            Classified::new(OutcomeClass::ClientError, "subscription")
        }
        500..=599 => Classified::new(OutcomeClass::Broken, "5xx"),
        _ => Classified::new(OutcomeClass::ClientError, "client"),
    }
}

/// An `error` event inside a 200 stream (Anthropic `event: error`, OpenAI Responses
/// `response.failed` / `error`, chat completions `{"error":…}`): never a success. Overload and
/// rate limits are busy, the upstream's own failure is broken, a billing type asks for
/// confirmation; anything else (an invalid request found mid-way) leaves the account alone.
pub fn classify_stream_error(event: &Value) -> Classified {
    let error = UpstreamError::from_json(event)
        .or_else(|| {
            event
                .pointer("/response")
                .and_then(UpstreamError::from_json)
        })
        .or_else(|| {
            // OpenAI Responses `{"type":"error","code":…,"message":…}` carries the fields flat.
            (event.get("type").and_then(Value::as_str) == Some("error")).then(|| UpstreamError {
                kind: None,
                code: event.get("code").and_then(Value::as_str).map(str::to_owned),
                message: String::new(),
            })
        })
        .unwrap_or_default();
    let class = if error.is(&[
        "overloaded_error",
        "rate_limit_error",
        "rate_limit_exceeded",
    ]) {
        OutcomeClass::Busy
    } else if error.is(BILLING) {
        OutcomeClass::QuotaGone
    } else if error.is(&["api_error", "server_error", "internal_error"]) {
        OutcomeClass::Broken
    } else {
        OutcomeClass::ClientError
    };
    Classified::new(class, "stream_error")
}

/// Whether a parsed SSE event is an error event (see `classify_stream_error`).
pub fn is_stream_error(event: &Value) -> bool {
    match event.get("type").and_then(Value::as_str) {
        Some("error") | Some("response.failed") => true,
        Some(_) => false,
        None => event.get("error").is_some_and(Value::is_object),
    }
}

/// No usable answer after the request started going out: a timeout, an early close, an answer
/// too large to keep, a stream that broke off. The request may have caused it (a huge body, a
/// prompt the upstream chokes on), so the selector's probe confirms it before anything applies.
pub fn network_failure() -> Classified {
    Classified::new(OutcomeClass::Broken, "network")
}

/// The connection failed before any byte of the request left (DNS, TCP connect, TLS
/// handshake): nothing the client sent shaped it, so it applies at once.
pub fn connect_failure() -> Classified {
    Classified::new(OutcomeClass::Broken, "connect")
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

    /// Cohere's errors carry no `error` object (`{"message": …}`): the status decides, as the
    /// SDK's typed errors do (cohere-python 7.0.9 `v2/raw_client.py`).
    #[test]
    fn cohere_answers_are_classified_by_status() {
        let json = headers(&[("content-type", "application/json")]);
        let class = |status: u16, body: &str| classify(status, &json, body.as_bytes(), NOW, 60_000);
        let past_limit = r#"{"message":"You are past the per minute request limit, please wait and try again later."}"#;
        assert_eq!(class(429, past_limit).class, OutcomeClass::Busy);
        assert_eq!(
            class(401, r#"{"message":"invalid api token"}"#).class,
            OutcomeClass::Unauthorized
        );
        assert_eq!(
            class(498, r#"{"message":"invalid api token"}"#).class,
            OutcomeClass::Unauthorized,
            "Cohere's 498 is a refused credential, confirmed by the probe"
        );
        assert_eq!(
            class(402, r#"{"message":"payment required"}"#).class,
            OutcomeClass::QuotaGone
        );
        let empty = r#"{"message":"invalid request: list of documents must not be empty"}"#;
        assert_eq!(class(400, empty).class, OutcomeClass::ClientError);
        assert_eq!(class(422, empty).class, OutcomeClass::ClientError);
        assert_eq!(
            class(503, r#"{"message":"unavailable"}"#).class,
            OutcomeClass::Broken
        );
    }

    #[test]
    fn retry_after_is_read_as_seconds_and_as_an_http_date() {
        let seconds = headers(&[("retry-after", "20")]);
        assert_eq!(retry_after_at_ms(&seconds, NOW), Some(NOW + 20_000));
        // 2023-11-14T22:13:20Z is NOW; a date 90 s later.
        let date = headers(&[("retry-after", "Tue, 14 Nov 2023 22:14:50 GMT")]);
        assert_eq!(retry_after_at_ms(&date, NOW), Some(NOW + 90_000));
        let past = headers(&[("retry-after", "Tue, 14 Nov 2000 22:14:50 GMT")]);
        assert_eq!(retry_after_at_ms(&past, NOW), Some(NOW));
        assert_eq!(
            retry_after_at_ms(&headers(&[("retry-after", "soon")]), NOW),
            None
        );
    }

    #[test]
    fn summaries_are_type_and_code_only() {
        let error = UpstreamError::parse(
            br#"{"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"secret client text"}}"#,
        )
        .expect("parsed");
        assert_eq!(error.summary(), "insufficient_quota");
        let odd = UpstreamError {
            kind: Some("a b<script>".into()),
            code: Some("c\nd".into()),
            message: String::new(),
        };
        assert_eq!(odd.summary(), "abscript/cd");
    }

    /// Real 401/403 answers of the providers (messages shortened), and what each refuses.
    #[test]
    fn refusals_are_classified_by_code_before_type() {
        let json = headers(&[("content-type", "application/json")]);
        let html = headers(&[("content-type", "text/html")]);
        let cases: &[(u16, &HeaderMap, &str, OutcomeClass, &str)] = &[
            // Anthropic: a bad key, a revoked OAuth token, a resource the key may not use.
            (
                401,
                &json,
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
                OutcomeClass::Unauthorized,
                "401",
            ),
            (
                401,
                &json,
                r#"{"type":"error","error":{"type":"authentication_error","message":"OAuth token has been revoked. Please obtain a new token."}}"#,
                OutcomeClass::Unauthorized,
                "401",
            ),
            // What Anthropic answers a revoked OAuth token with today (docs/SUBSCRIPTIONS.md): a
            // permission_error, read as the credential's by its whole message.
            (
                403,
                &json,
                r#"{"type":"error","error":{"type":"permission_error","message":"OAuth token has been revoked. Please obtain a new token."},"request_id":"req_011CX6Cwz8rJqKAK3zdtL3aC"}"#,
                OutcomeClass::Unauthorized,
                "401",
            ),
            // An echo of the same words with the client's around them is not it.
            (
                403,
                &json,
                r#"{"type":"error","error":{"type":"permission_error","message":"model: OAuth token has been revoked. Please obtain a new token."}}"#,
                OutcomeClass::ClientError,
                "refused",
            ),
            (
                403,
                &json,
                r#"{"type":"error","error":{"type":"permission_error","message":"Your API key does not have permission to use the specified resource."}}"#,
                OutcomeClass::ClientError,
                "refused",
            ),
            // OpenAI: a revoked key is an invalid_request_error whose code names the key.
            (
                401,
                &json,
                r#"{"error":{"message":"Incorrect API key provided: sk-abc***.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
                OutcomeClass::Unauthorized,
                "401",
            ),
            // A model the project may not use, and a restricted key on an endpoint it lacks.
            (
                403,
                &json,
                r#"{"error":{"message":"Project `proj_x` does not have access to model `gpt-5`","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#,
                OutcomeClass::ClientError,
                "refused",
            ),
            (
                401,
                &json,
                r#"{"error":{"message":"You have insufficient permissions for this operation. Missing scopes: api.responses.write.","type":"invalid_request_error","param":null,"code":null}}"#,
                OutcomeClass::ClientError,
                "refused",
            ),
            // Neither asserted: confirmed by the probe.
            (
                403,
                &json,
                r#"{"error":{"code":"unsupported_country_region_territory","message":"Country, region, or territory not supported","param":null,"type":"request_forbidden"}}"#,
                OutcomeClass::Unauthorized,
                "401",
            ),
            (
                401,
                &json,
                r#"{"detail":"Unauthorized"}"#,
                OutcomeClass::Unauthorized,
                "401",
            ),
            (
                401,
                &HeaderMap::new(),
                "",
                OutcomeClass::Unauthorized,
                "401",
            ),
            // An unknown code beside a request type is not taken for the request's doing.
            (
                401,
                &json,
                r#"{"error":{"type":"invalid_request_error","code":"key_disabled_somehow"}}"#,
                OutcomeClass::Unauthorized,
                "401",
            ),
            // ChatGPT (Codex): an expired sign-in.
            (
                401,
                &json,
                r#"{"error":{"message":"Provided authentication token is expired.","type":null,"code":"token_expired","param":null}}"#,
                OutcomeClass::Unauthorized,
                "401",
            ),
            // A proxy's HTML page: not the upstream's word.
            (
                403,
                &html,
                "<html>Forbidden</html>",
                OutcomeClass::Broken,
                "5xx",
            ),
        ];
        for (status, headers, body, class, label) in cases {
            let got = classify(*status, headers, body.as_bytes(), NOW, 60_000);
            assert_eq!((got.class, got.label), (*class, *label), "{status} {body}");
        }
        // The client's text never decides: a message naming a credential changes nothing.
        let echoed = r#"{"error":{"message":"invalid_api_key authentication_error","type":"invalid_request_error","code":null}}"#;
        assert_eq!(
            classify(403, &json, echoed.as_bytes(), NOW, 60_000).class,
            OutcomeClass::ClientError
        );
    }
}
