//! What a client key may reach (docs/DESIGN.md §6, "What a client key reaches"): its expiry, a
//! disable that an operator can lift, and the models and endpoints it is allowed, and an
//! operator's partial change to them and to its limits (`KeyUpdate`). Pure: the
//! selector answers with a key's `KeyAccess`, and the relay checks every request against it with
//! its own clock (so an expiry takes effect between two authentications too).

use std::fmt;

use crate::lease::KeyLimits;

/// The relay's client endpoints a key can be limited to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Endpoint {
    /// `POST /v1/messages` (Anthropic).
    Messages,
    /// `POST /v1/messages/count_tokens` (Anthropic).
    CountTokens,
    /// `POST /v1/chat/completions` (OpenAI).
    ChatCompletions,
    /// `POST /v1/responses` (OpenAI).
    Responses,
    /// `GET /v1/models` (both).
    Models,
    /// `POST /v1/embeddings` (OpenAI).
    Embeddings,
    /// `POST /v1/rerank` and `POST /v2/rerank` (Cohere's format).
    Rerank,
}

impl Endpoint {
    pub const ALL: [Endpoint; 7] = [
        Endpoint::Messages,
        Endpoint::CountTokens,
        Endpoint::ChatCompletions,
        Endpoint::Responses,
        Endpoint::Models,
        Endpoint::Embeddings,
        Endpoint::Rerank,
    ];

    /// The name operators write in a key's endpoint list.
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Messages => "messages",
            Endpoint::CountTokens => "count_tokens",
            Endpoint::ChatCompletions => "chat_completions",
            Endpoint::Responses => "responses",
            Endpoint::Models => "models",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Rerank => "rerank",
        }
    }

    pub fn parse(name: &str) -> Option<Endpoint> {
        Endpoint::ALL.into_iter().find(|e| e.as_str() == name)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Most entries in a key's model or endpoint list, and the longest model pattern.
pub const MAX_KEY_LIST_ENTRIES: usize = 256;
pub const MAX_MODEL_PATTERN_BYTES: usize = 128;

/// What a key may reach. Empty lists allow everything (a key created before lists existed keeps
/// today's behaviour).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyAccess {
    /// When the key stops working, ms since the epoch; `None`: never.
    pub expires_at_ms: Option<i64>,
    /// Disabled by an operator (and re-enabled without a new key); a revoked key is gone.
    pub disabled: bool,
    /// Glob patterns (`*` matches any run of characters) on the model the client asks for.
    pub allowed_models: Vec<String>,
    pub allowed_endpoints: Vec<Endpoint>,
}

/// Why a key's request is refused before any account is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRefusal {
    Disabled,
    Expired { at_ms: i64 },
    EndpointNotAllowed(Endpoint),
    ModelNotAllowed(String),
}

impl KeyRefusal {
    /// The message a client reads (it names the reason, never the key).
    pub fn message(&self) -> String {
        match self {
            KeyRefusal::Disabled => "this API key is disabled".to_owned(),
            KeyRefusal::Expired { at_ms } => {
                format!("this API key expired at {}", rfc3339_utc(*at_ms))
            }
            KeyRefusal::EndpointNotAllowed(endpoint) => {
                format!("this API key may not use the {endpoint} endpoint")
            }
            KeyRefusal::ModelNotAllowed(model) => {
                format!("this API key may not use the model {model:?}")
            }
        }
    }
}

impl KeyAccess {
    /// Whether the key itself may be used at `now_ms` (disabled first: it says more).
    pub fn check_key(&self, now_ms: i64) -> Result<(), KeyRefusal> {
        if self.disabled {
            return Err(KeyRefusal::Disabled);
        }
        match self.expires_at_ms {
            Some(at_ms) if at_ms <= now_ms => Err(KeyRefusal::Expired { at_ms }),
            _ => Ok(()),
        }
    }

    pub fn allows_endpoint(&self, endpoint: Endpoint) -> bool {
        self.allowed_endpoints.is_empty() || self.allowed_endpoints.contains(&endpoint)
    }

    pub fn allows_model(&self, model: &str) -> bool {
        self.allowed_models.is_empty()
            || self
                .allowed_models
                .iter()
                .any(|pattern| glob_match(pattern, model))
    }

    /// Everything a request must pass: the key, the endpoint, then the model (when the endpoint
    /// names one).
    pub fn check(
        &self,
        now_ms: i64,
        endpoint: Endpoint,
        model: Option<&str>,
    ) -> Result<(), KeyRefusal> {
        self.check_key(now_ms)?;
        if !self.allows_endpoint(endpoint) {
            return Err(KeyRefusal::EndpointNotAllowed(endpoint));
        }
        match model {
            Some(model) if !self.allows_model(model) => {
                Err(KeyRefusal::ModelNotAllowed(model.to_owned()))
            }
            _ => Ok(()),
        }
    }
}

/// Checks a model list as an operator wrote it: at most [`MAX_KEY_LIST_ENTRIES`] non-empty
/// patterns of at most [`MAX_MODEL_PATTERN_BYTES`], printable ASCII. The error says what is wrong.
pub fn check_model_patterns(patterns: &[String]) -> Result<(), String> {
    if patterns.len() > MAX_KEY_LIST_ENTRIES {
        return Err(format!("at most {MAX_KEY_LIST_ENTRIES} patterns"));
    }
    for pattern in patterns {
        if pattern.is_empty() || pattern.len() > MAX_MODEL_PATTERN_BYTES {
            return Err(format!("a pattern is 1 to {MAX_MODEL_PATTERN_BYTES} bytes"));
        }
        if !pattern.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("a pattern is printable ASCII without spaces".to_owned());
        }
    }
    Ok(())
}

/// The characters a model pattern is written with (docs/DESIGN.md §6): what model names hold,
/// and `*` for any run of characters.
fn pattern_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':' | '/' | '@' | '+' | '*')
}

/// Checks a model list an operator writes now (a key created or changed, a config file
/// loaded): [`check_model_patterns`], and only the documented syntax — letters, digits,
/// `- . _ : / @ +` and `*` — so a glob character poolgate does not implement (`?`, `[…]`,
/// `{…}`, `!`) is refused naming it instead of matching itself, which no model name would. A
/// list stored by an older release is read with [`check_model_patterns`] alone.
pub fn check_new_model_patterns(patterns: &[String]) -> Result<(), String> {
    check_model_patterns(patterns)?;
    for pattern in patterns {
        if let Some(c) = pattern.chars().find(|c| !pattern_char(*c)) {
            return Err(format!(
                "the pattern {pattern:?} holds {c:?}: patterns are letters, digits and - . _ : / @ +, with * for any run of characters"
            ));
        }
    }
    Ok(())
}

/// A new expiry (a key created or changed): not in the past at `now_ms`. A key that should
/// stop now is disabled instead.
pub fn check_new_expiry(expires_at_ms: Option<i64>, now_ms: i64) -> Result<(), String> {
    match expires_at_ms {
        Some(at) if at <= now_ms => Err(format!(
            "{} is in the past (now {}); disable the key to stop it now",
            rfc3339_utc(at),
            rfc3339_utc(now_ms)
        )),
        _ => Ok(()),
    }
}

/// Parses an endpoint list as an operator wrote it; the error names the unknown entry.
pub fn parse_endpoints(names: &[String]) -> Result<Vec<Endpoint>, String> {
    let mut endpoints = Vec::with_capacity(names.len());
    for name in names {
        let endpoint = Endpoint::parse(name).ok_or_else(|| {
            let known: Vec<&str> = Endpoint::ALL.iter().map(|e| e.as_str()).collect();
            format!("unknown endpoint {name:?} (known: {})", known.join(", "))
        })?;
        if !endpoints.contains(&endpoint) {
            endpoints.push(endpoint);
        }
    }
    Ok(endpoints)
}

/// An endpoint list as a reader of an older release reads one a newer release wrote
/// (docs/DESIGN.md §8, "Enum values across releases"): the names it knows, and whether the list
/// named only endpoints it does not know. Such a list reaches nothing this release serves; read
/// as no list it would reach every endpoint, so the caller holds the key disabled instead.
pub fn known_endpoints(names: &[String]) -> (Vec<Endpoint>, bool) {
    let mut endpoints = Vec::new();
    for endpoint in names.iter().filter_map(|name| Endpoint::parse(name)) {
        if !endpoints.contains(&endpoint) {
            endpoints.push(endpoint);
        }
    }
    let only_newer = !names.is_empty() && endpoints.is_empty();
    (endpoints, only_newer)
}

/// A stretch of time a key's usage is summed over (calendar periods in UTC, weeks from Monday).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsagePeriod {
    Day,
    Week,
    Month,
    /// Since the key was created.
    Total,
}

impl UsagePeriod {
    pub const ALL: [UsagePeriod; 4] = [
        UsagePeriod::Day,
        UsagePeriod::Week,
        UsagePeriod::Month,
        UsagePeriod::Total,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            UsagePeriod::Day => "day",
            UsagePeriod::Week => "week",
            UsagePeriod::Month => "month",
            UsagePeriod::Total => "total",
        }
    }

    /// When the period that holds `now_ms` began, ms since the epoch (UTC; `Total`: 0).
    pub fn start_ms(self, now_ms: i64) -> i64 {
        const DAY_MS: i64 = 86_400_000;
        let day = now_ms.div_euclid(DAY_MS);
        match self {
            UsagePeriod::Day => day * DAY_MS,
            // 1970-01-01 was a Thursday: Monday is three days later in the cycle.
            UsagePeriod::Week => (day - (day + 3).rem_euclid(7)) * DAY_MS,
            UsagePeriod::Month => {
                let utc = jiff::tz::TimeZone::UTC;
                jiff::Timestamp::from_millisecond(now_ms)
                    .and_then(|now| {
                        let first = now.to_zoned_datetime(utc.clone()).date().first_of_month();
                        first.to_zoned_datetime(utc)
                    })
                    .map(|start| start.timestamp().as_millisecond())
                    // Out of jiff's range (±9999 years): the day's start stands in.
                    .unwrap_or(day * DAY_MS)
            }
            UsagePeriod::Total => 0,
        }
    }
}

/// An hour: shorter than any calendar period, so a step back of one from a period's first
/// instant lands in the period before it.
pub const STEP_MS: i64 = 3_600_000;

/// More hours than the longest month (31 days and a DST hour).
pub const MAX_STEPS: i64 = 32 * 24;

/// When the period that ends at `ends_ms` began: the end of the period before it, the first
/// instant `period_at` places in the same period as `ends_ms - 1` (a binary search over the
/// month before, as ids are contiguous in time). `period_at(instant)` is the calendar's period
/// containing `instant`, as (id, ends_ms). Calendars name a period only by its end, and the end
/// of one is the start of the next (a day across a DST change lasts 23 or 25 hours, so a start
/// is not an end minus a fixed length). Should no earlier period turn up within a month, the
/// earliest instant looked at is returned: a longer range counts more spend, never less.
pub fn period_start(ends_ms: i64, period_at: impl Fn(i64) -> (String, i64)) -> i64 {
    let last = ends_ms - 1;
    let (id, _) = period_at(last);
    let earliest = last - MAX_STEPS * STEP_MS;
    if period_at(earliest).0 == id {
        return earliest;
    }
    // `low` is in an earlier period, `high` in this one.
    let (mut low, mut high) = (earliest, last);
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        if period_at(middle).0 == id {
            high = middle;
        } else {
            low = middle;
        }
    }
    high
}

/// One key's usage over one period, from the usage ledger.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PeriodUsage {
    pub requests: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_usd: f64,
}

/// A key as its holder may see it (the self-service view): its own record and usage, nothing
/// about any other key.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyDescription {
    pub record: crate::account::ApiKeyRecord,
    /// Each of `UsagePeriod::ALL` with when it began.
    pub usage: Vec<(UsagePeriod, i64, PeriodUsage)>,
    /// The current month's usage (the `Month` period's) per model and the price it was charged
    /// at, ascending by model (docs/DESIGN.md §6, "Prices"); empty from an older selector.
    pub models: Vec<ModelPeriodUsage>,
}

/// One model's usage in a period under one price source.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPeriodUsage {
    pub model: String,
    /// `None`: records that did not say (an older relay's).
    pub price_source: Option<crate::price::PriceSource>,
    pub usage: PeriodUsage,
}

/// `*` matches any run of characters (none included); every other character matches itself.
/// Linear in practice: the classic two-pointer match with one backtrack point.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((star_pi, star_ti)) = star {
            pi = star_pi + 1;
            ti = star_ti + 1;
            star = Some((star_pi, star_ti + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

/// `2026-12-02T16:09:05Z` for ms since the epoch (whole seconds; an instant out of jiff's range,
/// ±9999 years, prints as its nearest end).
pub fn rfc3339_utc(ms: i64) -> String {
    let seconds = ms.div_euclid(1000).clamp(
        jiff::Timestamp::MIN.as_second(),
        jiff::Timestamp::MAX.as_second(),
    );
    jiff::Timestamp::from_second(seconds)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .to_string()
}

/// An operator's change to a key: only what is `Some` changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyUpdate {
    /// `true`: disable; `false`: enable.
    pub disabled: Option<bool>,
    /// `Some(None)`: clear the expiry.
    pub expires_at_ms: Option<Option<i64>>,
    /// The new model list (empty: every model).
    pub allowed_models: Option<Vec<String>>,
    /// The new endpoint list (empty: every endpoint).
    pub allowed_endpoints: Option<Vec<Endpoint>>,
    /// The key's limits (`lease::KeyLimits`): each given one replaces the stored one; 0 clears.
    pub concurrency_limit: Option<i32>,
    pub tpm_limit: Option<i64>,
    pub budget_total_micros: Option<i64>,
    pub budget_day_micros: Option<i64>,
    pub budget_week_micros: Option<i64>,
    pub budget_month_micros: Option<i64>,
}

impl KeyUpdate {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == KeyUpdate::default()
    }

    /// `access` with this change made.
    pub fn apply(&self, access: &KeyAccess) -> KeyAccess {
        KeyAccess {
            expires_at_ms: self.expires_at_ms.unwrap_or(access.expires_at_ms),
            disabled: self.disabled.unwrap_or(access.disabled),
            allowed_models: self
                .allowed_models
                .clone()
                .unwrap_or_else(|| access.allowed_models.clone()),
            allowed_endpoints: self
                .allowed_endpoints
                .clone()
                .unwrap_or_else(|| access.allowed_endpoints.clone()),
        }
    }

    /// `limits` with this change made.
    pub fn apply_limits(&self, limits: &KeyLimits) -> KeyLimits {
        KeyLimits {
            api_key_id: limits.api_key_id,
            concurrency_limit: self.concurrency_limit.unwrap_or(limits.concurrency_limit),
            tpm_limit: self.tpm_limit.unwrap_or(limits.tpm_limit),
            budget_total_micros: self
                .budget_total_micros
                .unwrap_or(limits.budget_total_micros),
            budget_day_micros: self.budget_day_micros.unwrap_or(limits.budget_day_micros),
            budget_week_micros: self.budget_week_micros.unwrap_or(limits.budget_week_micros),
            budget_month_micros: self
                .budget_month_micros
                .unwrap_or(limits.budget_month_micros),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_runs_of_any_characters() {
        for (pattern, text, expected) in [
            ("*", "anything", true),
            ("*", "", true),
            ("claude-*", "claude-sonnet-4-5", true),
            ("claude-*", "gpt-4o", false),
            ("*sonnet*", "claude-sonnet-4-5", true),
            ("*-mini", "gpt-4o-mini", true),
            ("*-mini", "gpt-4o-mini-2", false),
            ("gpt-4o", "gpt-4o", true),
            ("gpt-4o", "gpt-4o-mini", false),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
            ("a**", "a", true),
            ("", "", true),
            ("", "x", false),
        ] {
            assert_eq!(glob_match(pattern, text), expected, "{pattern} on {text}");
        }
    }

    #[test]
    fn a_key_is_refused_disabled_first_then_expired_then_endpoint_then_model() {
        let now = 1_800_000_000_000;
        let access = KeyAccess {
            expires_at_ms: Some(now + 1),
            disabled: false,
            allowed_models: vec!["claude-*".into()],
            allowed_endpoints: vec![Endpoint::Messages, Endpoint::Models],
        };
        assert_eq!(
            access.check(now, Endpoint::Messages, Some("claude-haiku")),
            Ok(())
        );
        assert_eq!(
            access.check(now, Endpoint::Messages, Some("gpt-4o")),
            Err(KeyRefusal::ModelNotAllowed("gpt-4o".into()))
        );
        assert_eq!(
            access.check(now, Endpoint::ChatCompletions, Some("claude-haiku")),
            Err(KeyRefusal::EndpointNotAllowed(Endpoint::ChatCompletions))
        );
        assert_eq!(
            access.check(now + 1, Endpoint::Messages, None),
            Err(KeyRefusal::Expired { at_ms: now + 1 })
        );
        let disabled = KeyAccess {
            disabled: true,
            ..access
        };
        assert_eq!(
            disabled.check(now + 5, Endpoint::Messages, None),
            Err(KeyRefusal::Disabled)
        );
        assert_eq!(
            KeyAccess::default().check(now, Endpoint::Responses, Some("x")),
            Ok(())
        );
    }

    #[test]
    fn a_new_pattern_holds_only_the_documented_syntax_and_a_refusal_names_the_character() {
        assert!(
            check_new_model_patterns(&[
                "claude-*".into(),
                "gpt-4o".into(),
                "claude-3-5-sonnet@20240620".into(),
                "models/gemini-1.5-pro:latest".into(),
                "a_b+c".into(),
            ])
            .is_ok()
        );
        for (pattern, c) in [
            ("claude-?", '?'),
            ("claude-[34]*", '['),
            ("gpt-{4o,5}", '{'),
            ("!gpt", '!'),
        ] {
            let error = check_new_model_patterns(&[pattern.to_owned()]).expect_err(pattern);
            assert!(error.contains(&format!("{c:?}")), "{error}");
            // What an older release stored is still read.
            assert!(check_model_patterns(&[pattern.to_owned()]).is_ok());
        }
        assert!(check_new_model_patterns(&["has space".into()]).is_err());
    }

    #[test]
    fn a_new_expiry_in_the_past_is_refused() {
        assert_eq!(check_new_expiry(None, 1_000), Ok(()));
        assert_eq!(check_new_expiry(Some(1_001), 1_000), Ok(()));
        let error = check_new_expiry(Some(1_000), 1_000).expect_err("now is not ahead");
        assert!(error.contains("in the past"), "{error}");
        assert!(check_new_expiry(Some(0), 1_000).is_err());
    }

    #[test]
    fn lists_as_operators_write_them_are_checked() {
        assert!(check_model_patterns(&["claude-*".into(), "gpt-4o".into()]).is_ok());
        assert!(check_model_patterns(&[String::new()]).is_err());
        assert!(check_model_patterns(&["has space".into()]).is_err());
        assert!(check_model_patterns(&vec!["m".to_owned(); MAX_KEY_LIST_ENTRIES + 1]).is_err());
        assert_eq!(
            parse_endpoints(&["messages".into(), "models".into(), "messages".into()]),
            Ok(vec![Endpoint::Messages, Endpoint::Models])
        );
        let unknown = parse_endpoints(&["images".into()]).expect_err("unknown");
        assert!(unknown.contains("\"images\"") && unknown.contains("count_tokens"));
    }

    #[test]
    fn usage_periods_start_at_utc_midnight_monday_and_the_first_of_the_month() {
        // Wednesday 2026-12-02T16:09:05Z.
        let now = 1_796_227_745_000;
        assert_eq!(
            rfc3339_utc(UsagePeriod::Day.start_ms(now)),
            "2026-12-02T00:00:00Z"
        );
        assert_eq!(
            rfc3339_utc(UsagePeriod::Week.start_ms(now)),
            "2026-11-30T00:00:00Z"
        );
        assert_eq!(
            rfc3339_utc(UsagePeriod::Month.start_ms(now)),
            "2026-12-01T00:00:00Z"
        );
        assert_eq!(UsagePeriod::Total.start_ms(now), 0);
        // A Monday is its own week's start; 1 March follows 29 February in a leap year.
        let monday = UsagePeriod::Week.start_ms(now);
        assert_eq!(UsagePeriod::Week.start_ms(monday), monday);
        let leap_day = 951_782_400_000 + 3_600_000;
        assert_eq!(
            rfc3339_utc(UsagePeriod::Month.start_ms(leap_day)),
            "2000-02-01T00:00:00Z"
        );
        assert_eq!(
            rfc3339_utc(UsagePeriod::Month.start_ms(1_796_227_745_000)),
            "2026-12-01T00:00:00Z"
        );
        assert_eq!(
            rfc3339_utc(UsagePeriod::Month.start_ms(-1)),
            "1969-12-01T00:00:00Z"
        );
    }

    #[test]
    fn expiry_messages_name_the_instant_in_utc() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(1_796_227_745_000), "2026-12-02T16:09:05Z");
        assert_eq!(rfc3339_utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert!(
            KeyRefusal::Expired { at_ms: 0 }
                .message()
                .contains("1970-01-01T00:00:00Z")
        );
    }
}
