//! Reading usage windows from one upstream answer's headers (absent or malformed values are
//! skipped, never guessed):
//! - Anthropic subscriptions: `anthropic-ratelimit-unified-{5h,7d,overage}-{utilization,reset,
//!   status}` (utilization a fraction, reset in epoch seconds) for the account, and the
//!   model-scoped weekly limits of `scoped::ANTHROPIC_SCOPED`: the `7d_oi` family (Fable
//!   models, claim `seven_day_overage_included`) and the claims `seven_day_opus` /
//!   `seven_day_sonnet`, which arrive as `anthropic-ratelimit-unified-representative-claim`
//!   with the overall `-status` and `-reset` (and, should the upstream send them, as
//!   `7d_opus`/`7d_sonnet` families).
//! - ChatGPT/Codex: `x-codex-{primary,secondary}-{used-percent,window-minutes,reset-at,
//!   reset-after-seconds}` (percent 0–100) for the account, and the named limits
//!   `x-codex-<name>-…`, scoped to the models their `x-codex-<name>-limit-name` names.
//! - API keys, per minute: Anthropic `anthropic-ratelimit-{requests,tokens,input-tokens,
//!   output-tokens}-{limit,remaining,reset}` (RFC 3339 resets), OpenAI
//!   `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (Go-style durations: `6m0s`, `20ms`).

use http::HeaderMap;

use super::scoped::{ANTHROPIC_SCOPED, codex_scope};
use super::{MINUTE_MS, MinuteLimit, Scope, WindowKind, WindowReading, WindowStatus};

pub(super) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)?
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// A finite number; upstream headers are input, so it is clamped where it becomes arithmetic.
pub(super) fn number(headers: &HeaderMap, name: &str) -> Option<f64> {
    header(headers, name)?
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
}

/// Epoch seconds to ms, refusing values no reset can have (before 2001 or past 2500).
pub(super) fn epoch_seconds_ms(seconds: f64) -> Option<i64> {
    (1e9..=1.7e10)
        .contains(&seconds)
        .then_some((seconds * 1000.0) as i64)
}

/// Seconds from now to ms since the epoch; negative or absurd (over a year) values are refused.
pub(super) fn after_seconds_ms(seconds: f64, now_ms: i64) -> Option<i64> {
    (0.0..=3.2e7)
        .contains(&seconds)
        .then(|| now_ms.saturating_add((seconds * 1000.0) as i64))
}

/// A utilization fraction: negative is malformed, past 1 reads as full.
fn fraction(value: f64) -> Option<f64> {
    (value >= 0.0).then(|| value.min(1.0))
}

/// Every reading the headers of one answer carry, observed at `now_ms`.
pub fn read_windows(headers: &HeaderMap, now_ms: i64) -> Vec<WindowReading> {
    let mut readings = Vec::new();
    // Runs on every upstream answer: one pass over the names, and nothing built for an answer
    // that carries no rate-limit family at all (the family readers format their names).
    let carries_limits = headers.keys().any(|name| {
        let name = name.as_str();
        name.starts_with("anthropic-ratelimit-")
            || name.starts_with("x-codex-")
            || name.starts_with("x-ratelimit-")
    });
    if !carries_limits {
        return readings;
    }
    read_unified(headers, now_ms, &mut readings);
    read_codex(headers, now_ms, &mut readings);
    read_per_minute(headers, now_ms, &mut readings);
    readings
}

/// The account-wide unified families, by header tag; the model-scoped ones are
/// `scoped::ANTHROPIC_SCOPED`.
const UNIFIED_ACCOUNT: [(&str, WindowKind); 3] = [
    ("5h", WindowKind::FiveHour),
    ("7d", WindowKind::SevenDay),
    ("overage", WindowKind::Overage),
];

fn scope_of(models: Option<&str>) -> Scope {
    models.map_or(Scope::Account, |token| Scope::Models(token.to_owned()))
}

fn read_unified(headers: &HeaderMap, now_ms: i64, readings: &mut Vec<WindowReading>) {
    let family = |tag: &str, suffix: &str| format!("anthropic-ratelimit-unified-{tag}-{suffix}");
    let families = UNIFIED_ACCOUNT
        .iter()
        .map(|(tag, kind)| (*tag, *kind, None))
        .chain(
            ANTHROPIC_SCOPED
                .iter()
                .map(|(_, tag, kind, token)| (*tag, *kind, Some(*token))),
        );
    for (tag, kind, models) in families {
        let Some(reset_at_ms) = number(headers, &family(tag, "reset")).and_then(epoch_seconds_ms)
        else {
            continue;
        };
        let utilization = number(headers, &family(tag, "utilization")).and_then(fraction);
        let status = header(headers, &family(tag, "status")).and_then(WindowStatus::parse);
        if utilization.is_none() && status.is_none() {
            continue;
        }
        readings.push(WindowReading {
            kind,
            scope: scope_of(models),
            utilization,
            reset_at_ms,
            length_ms: kind.default_length_ms(),
            status: status.unwrap_or(WindowStatus::Unknown),
            observed_at_ms: now_ms,
        });
    }
    // A claim names the window the overall status and reset are about; without that window's
    // own family it is the only reading of it (the Opus and Sonnet weekly claims come this way).
    let claim =
        header(headers, "anthropic-ratelimit-unified-representative-claim").and_then(|claim| {
            match claim {
                "five_hour" => Some((WindowKind::FiveHour, None)),
                "seven_day" => Some((WindowKind::SevenDay, None)),
                "overage" => Some((WindowKind::Overage, None)),
                _ => ANTHROPIC_SCOPED
                    .iter()
                    .find(|(name, ..)| *name == claim)
                    .map(|(_, _, kind, token)| (*kind, Some(*token))),
            }
        });
    if let Some((kind, models)) = claim
        && let Some(status) =
            header(headers, "anthropic-ratelimit-unified-status").and_then(WindowStatus::parse)
        && let Some(reset_at_ms) =
            number(headers, "anthropic-ratelimit-unified-reset").and_then(epoch_seconds_ms)
    {
        let scope = scope_of(models);
        match readings
            .iter_mut()
            .find(|r| r.kind == kind && r.scope == scope)
        {
            None => readings.push(WindowReading {
                kind,
                scope,
                utilization: None,
                reset_at_ms,
                length_ms: kind.default_length_ms(),
                status,
                observed_at_ms: now_ms,
            }),
            // A scoped limit's reset is the latest of those that belong to it: its family's
            // and, as the representative claim, the overall one (never an account-wide one).
            Some(reading) if models.is_some() => {
                reading.reset_at_ms = reading.reset_at_ms.max(reset_at_ms);
                reading.status = reading.status.max(status);
            }
            Some(_) => {}
        }
    }
}

/// A Codex family name from a header: `x-codex-primary-…` is the account's own (`None`),
/// `x-codex-<name>-primary-…` a named limit's.
pub(super) fn codex_families(headers: &HeaderMap) -> Vec<(Option<String>, &'static str)> {
    let mut families = Vec::new();
    for name in headers.keys() {
        let Some(middle) = name
            .as_str()
            .strip_prefix("x-codex-")
            .and_then(|rest| rest.strip_suffix("-used-percent"))
        else {
            continue;
        };
        for side in ["primary", "secondary"] {
            let family = if middle == side {
                Some(None)
            } else {
                middle
                    .strip_suffix(side)
                    .and_then(|prefix| prefix.strip_suffix('-'))
                    .filter(|limit| {
                        !limit.is_empty()
                            && limit.len() <= 64
                            && limit
                                .bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                    })
                    .map(|limit| Some(limit.to_ascii_lowercase().replace('_', "-")))
            };
            if let Some(family) = family
                && !families.contains(&(family.clone(), side))
            {
                families.push((family, side));
            }
        }
    }
    families
}

fn read_codex(headers: &HeaderMap, now_ms: i64, readings: &mut Vec<WindowReading>) {
    for (limit, side) in codex_families(headers) {
        let (prefix, scope) = match &limit {
            None => (format!("x-codex-{side}"), Scope::Account),
            // A named limit covers the models its limit name names; without one, they are
            // unknown and the family is skipped.
            Some(limit) => match codex_scope(headers, limit) {
                Some(scope) => (format!("x-codex-{limit}-{side}"), scope),
                None => continue,
            },
        };
        let field = |suffix: &str| number(headers, &format!("{prefix}-{suffix}"));
        let Some(used) = field("used-percent").and_then(fraction_of_percent) else {
            continue;
        };
        let reset_at_ms = field("reset-at")
            .and_then(epoch_seconds_ms)
            .or_else(|| field("reset-after-seconds").and_then(|s| after_seconds_ms(s, now_ms)));
        let Some(reset_at_ms) = reset_at_ms else {
            continue;
        };
        let length_ms = field("window-minutes")
            .filter(|m| *m > 0.0 && *m <= 60.0 * 24.0 * 366.0)
            .map(|m| (m * MINUTE_MS as f64) as i64);
        readings.push(WindowReading {
            kind: if side == "primary" {
                WindowKind::CodexPrimary
            } else {
                WindowKind::CodexSecondary
            },
            scope,
            utilization: Some(used),
            reset_at_ms,
            length_ms,
            // Codex states no status; at 100 % the next request is refused (docs/DESIGN.md §1).
            status: if used >= 1.0 {
                WindowStatus::Rejected
            } else {
                WindowStatus::Unknown
            },
            observed_at_ms: now_ms,
        });
    }
}

fn fraction_of_percent(percent: f64) -> Option<f64> {
    fraction(percent / 100.0)
}

const ANTHROPIC_MINUTE: [(&str, MinuteLimit); 4] = [
    ("requests", MinuteLimit::Requests),
    ("tokens", MinuteLimit::Tokens),
    ("input-tokens", MinuteLimit::InputTokens),
    ("output-tokens", MinuteLimit::OutputTokens),
];

fn read_per_minute(headers: &HeaderMap, now_ms: i64, readings: &mut Vec<WindowReading>) {
    let mut push = |what, limit: Option<f64>, remaining: Option<f64>, reset: Option<&str>| {
        let (Some(limit), Some(remaining), Some(reset)) = (limit, remaining, reset) else {
            return;
        };
        if limit <= 0.0 || remaining < 0.0 {
            return;
        }
        let Some(reset_at_ms) = parse_reset(reset, now_ms) else {
            return;
        };
        readings.push(WindowReading {
            kind: WindowKind::PerMinute(what),
            scope: Scope::Account,
            utilization: Some(((limit - remaining) / limit).clamp(0.0, 1.0)),
            reset_at_ms,
            length_ms: Some(MINUTE_MS),
            status: WindowStatus::Unknown,
            observed_at_ms: now_ms,
        });
    };
    for (tag, what) in ANTHROPIC_MINUTE {
        let name = |suffix: &str| format!("anthropic-ratelimit-{tag}-{suffix}");
        push(
            what,
            number(headers, &name("limit")),
            number(headers, &name("remaining")),
            header(headers, &name("reset")),
        );
    }
    for (tag, what) in [
        ("requests", MinuteLimit::Requests),
        ("tokens", MinuteLimit::Tokens),
    ] {
        let name = |field: &str| format!("x-ratelimit-{field}-{tag}");
        push(
            what,
            number(headers, &name("limit")),
            number(headers, &name("remaining")),
            header(headers, &name("reset")),
        );
    }
}

/// A per-minute reset: an RFC 3339 time (Anthropic), a Go-style duration (OpenAI: `1s`,
/// `6m0s`, `20ms`, `1h2m3.5s`), or a bare number: epoch seconds from 10^9 up, else seconds from
/// now.
fn parse_reset(text: &str, now_ms: i64) -> Option<i64> {
    if let Ok(value) = text.parse::<f64>() {
        if !value.is_finite() {
            return None;
        }
        return if value >= 1e9 {
            epoch_seconds_ms(value)
        } else {
            after_seconds_ms(value, now_ms)
        };
    }
    if let Some(at) = rfc3339_ms(text) {
        return Some(at);
    }
    duration_ms(text).map(|ms| now_ms.saturating_add(ms))
}

/// `1h2m3.5s`, `6m0s`, `20ms`: a Go `time.Duration` as OpenAI prints it, in ms.
fn duration_ms(text: &str) -> Option<i64> {
    let mut total = 0.0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&end| end > 0)?;
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ms" => 1.0,
            "s" => 1_000.0,
            "m" => 60_000.0,
            "h" => 3_600_000.0,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[unit_end..];
    }
    (total.is_finite() && total <= 3.2e10).then_some(total as i64)
}

/// `2026-03-01T12:00:30Z`, with optional fraction and a `Z` or `±hh:mm` offset, in ms.
fn rfc3339_ms(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    // ASCII only, so every byte index below is a character boundary.
    if !text.is_ascii() || bytes.len() < 20 || !matches!(bytes[10], b'T' | b't' | b' ') {
        return None;
    }
    let int = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (year, month, day) = (int(0..4)?, int(5..7)?, int(8..10)?);
    let (hour, minute, second) = (int(11..13)?, int(14..16)?, int(17..19)?);
    if bytes[4] != b'-' || bytes[7] != b'-' || bytes[13] != b':' || bytes[16] != b':' {
        return None;
    }
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let end = fraction
            .find(|c: char| !c.is_ascii_digit())
            .filter(|&end| end > 0)?;
        let digits = &fraction[..end.min(3)];
        millis = digits.parse::<i64>().ok()? * 10_i64.pow(3 - digits.len() as u32);
        rest = &fraction[end..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && rest.as_bytes()[3] == b':' => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (h, m) = (int_of(&rest[1..3])?, int_of(&rest[4..6])?);
            sign * (h * 60 + m)
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1000 + millis)
}

fn int_of(text: &str) -> Option<i64> {
    text.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| text.parse().ok())?
}

/// A group's shed thresholds (docs/DESIGN.md §5).
#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;
    use crate::windows::{DAY_MS, HOUR_MS};

    const NOW: i64 = 1_770_000_000_000;
    const NOW_S: i64 = NOW / 1000;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                http::HeaderName::from_bytes(name.as_bytes()).expect("test header name"),
                HeaderValue::from_str(value).expect("test header value"),
            );
        }
        map
    }

    fn find(readings: &[WindowReading], kind: WindowKind) -> Option<&WindowReading> {
        readings.iter().find(|r| r.kind == kind)
    }

    #[test]
    fn anthropic_unified_windows_are_read_with_fractions_epoch_resets_and_statuses() {
        let reset_5h = (NOW_S + 3_600).to_string();
        let reset_7d = (NOW_S + 86_400).to_string();
        let set = headers(&[
            ("anthropic-ratelimit-unified-status", "allowed_warning"),
            ("anthropic-ratelimit-unified-5h-utilization", "0.42"),
            ("anthropic-ratelimit-unified-5h-reset", &reset_5h),
            ("anthropic-ratelimit-unified-5h-status", "allowed"),
            ("anthropic-ratelimit-unified-7d-utilization", "0.91"),
            ("anthropic-ratelimit-unified-7d-reset", &reset_7d),
            ("anthropic-ratelimit-unified-7d-status", "allowed_warning"),
            ("anthropic-ratelimit-unified-7d_oi-utilization", "1.2"),
            ("anthropic-ratelimit-unified-7d_oi-reset", &reset_7d),
            ("anthropic-ratelimit-unified-overage-utilization", "0"),
            ("anthropic-ratelimit-unified-overage-reset", &reset_7d),
            ("anthropic-ratelimit-unified-overage-status", "allowed"),
            (
                "anthropic-ratelimit-unified-representative-claim",
                "seven_day",
            ),
            ("anthropic-ratelimit-unified-reset", &reset_7d),
        ]);
        let readings = read_windows(&set, NOW);
        assert_eq!(readings.len(), 4, "{readings:?}");
        let five = find(&readings, WindowKind::FiveHour).expect("5h");
        assert_eq!(five.utilization, Some(0.42));
        assert_eq!(five.reset_at_ms, (NOW_S + 3_600) * 1000);
        assert_eq!(five.length_ms, Some(5 * HOUR_MS));
        assert_eq!(five.status, WindowStatus::Allowed);
        assert_eq!(five.observed_at_ms, NOW);
        let week = find(&readings, WindowKind::SevenDay).expect("7d");
        assert_eq!(week.status, WindowStatus::AllowedWarning);
        // Past the cap reads as full; no status stated is unknown, not allowed.
        let oi = find(&readings, WindowKind::SevenDayOverageIncluded).expect("7d_oi");
        assert_eq!(
            (oi.utilization, oi.status),
            (Some(1.0), WindowStatus::Unknown)
        );
        // The Fable models' weekly limit: scoped to them, never the account's.
        assert_eq!(oi.scope, Scope::Models("fable".into()));
        assert!(find(&readings, WindowKind::Overage).is_some());
    }

    #[test]
    fn a_model_scoped_claim_is_read_from_the_representative_claim() {
        let reset = (NOW_S + 2 * 86_400).to_string();
        for (claim, token) in [("seven_day_opus", "opus"), ("seven_day_sonnet", "sonnet")] {
            let set = headers(&[
                ("anthropic-ratelimit-unified-status", "rejected"),
                ("anthropic-ratelimit-unified-representative-claim", claim),
                ("anthropic-ratelimit-unified-reset", &reset),
            ]);
            let readings = read_windows(&set, NOW);
            assert_eq!(
                readings,
                vec![WindowReading {
                    kind: WindowKind::SevenDayModel,
                    scope: Scope::Models(token.into()),
                    utilization: None,
                    reset_at_ms: (NOW_S + 2 * 86_400) * 1000,
                    length_ms: Some(7 * DAY_MS),
                    status: WindowStatus::Rejected,
                    observed_at_ms: NOW,
                }]
            );
        }
    }

    #[test]
    fn absent_and_malformed_anthropic_values_are_skipped_never_guessed() {
        let reset = (NOW_S + 3_600).to_string();
        let cases: [&[(&str, &str)]; 7] = [
            &[],
            // No reset: when it stops counting is unknown.
            &[("anthropic-ratelimit-unified-5h-utilization", "0.5")],
            &[
                ("anthropic-ratelimit-unified-5h-utilization", "half"),
                ("anthropic-ratelimit-unified-5h-reset", &reset),
            ],
            &[
                ("anthropic-ratelimit-unified-5h-utilization", "-0.1"),
                ("anthropic-ratelimit-unified-5h-reset", &reset),
            ],
            &[
                ("anthropic-ratelimit-unified-5h-utilization", "0.5"),
                ("anthropic-ratelimit-unified-5h-reset", "tomorrow"),
            ],
            // An hour count is not an epoch reset.
            &[
                ("anthropic-ratelimit-unified-5h-utilization", "0.5"),
                ("anthropic-ratelimit-unified-5h-reset", "5"),
            ],
            &[
                ("anthropic-ratelimit-unified-5h-status", "maybe"),
                ("anthropic-ratelimit-unified-5h-reset", &reset),
            ],
        ];
        for case in cases {
            assert_eq!(read_windows(&headers(case), NOW), vec![], "{case:?}");
        }
        // An unknown claim is not taken for a known one.
        let set = headers(&[
            ("anthropic-ratelimit-unified-status", "rejected"),
            (
                "anthropic-ratelimit-unified-representative-claim",
                "seven_day_fable",
            ),
            ("anthropic-ratelimit-unified-reset", &reset),
        ]);
        assert_eq!(read_windows(&set, NOW), vec![]);
    }

    #[test]
    fn codex_windows_are_read_from_percentages_and_either_reset() {
        let reset_at = (NOW_S + 7_200).to_string();
        let set = headers(&[
            ("x-codex-primary-used-percent", "37.5"),
            ("x-codex-primary-window-minutes", "300"),
            ("x-codex-primary-reset-after-seconds", "600"),
            ("x-codex-secondary-used-percent", "100"),
            ("x-codex-secondary-window-minutes", "10080"),
            ("x-codex-secondary-reset-at", &reset_at),
            ("x-codex-bengalfox-primary-used-percent", "12"),
            ("x-codex-bengalfox-primary-reset-after-seconds", "60"),
            ("x-codex-bengalfox-limit-name", "GPT-5-Codex-Mini"),
        ]);
        let readings = read_windows(&set, NOW);
        assert_eq!(readings.len(), 3, "{readings:?}");
        let primary = readings
            .iter()
            .find(|r| r.kind == WindowKind::CodexPrimary && r.scope == Scope::Account)
            .expect("primary");
        assert_eq!(primary.utilization, Some(0.375));
        assert_eq!(primary.reset_at_ms, NOW + 600_000);
        assert_eq!(primary.length_ms, Some(300 * MINUTE_MS));
        let secondary = find(&readings, WindowKind::CodexSecondary).expect("secondary");
        assert_eq!(secondary.reset_at_ms, (NOW_S + 7_200) * 1000);
        assert_eq!(secondary.status, WindowStatus::Rejected);
        assert!(readings.iter().any(|r| r.kind == WindowKind::CodexPrimary
            && r.scope == Scope::Models("gpt-5-codex-mini".into())
            && r.utilization == Some(0.12)));
    }

    #[test]
    fn absent_and_malformed_codex_values_are_skipped() {
        let cases: [&[(&str, &str)]; 5] = [
            &[("x-codex-primary-used-percent", "40")],
            &[
                ("x-codex-primary-used-percent", "forty"),
                ("x-codex-primary-reset-after-seconds", "60"),
            ],
            &[
                ("x-codex-primary-used-percent", "-3"),
                ("x-codex-primary-reset-after-seconds", "60"),
            ],
            &[
                ("x-codex-primary-used-percent", "40"),
                ("x-codex-primary-reset-after-seconds", "-60"),
            ],
            &[
                ("x-codex-tertiary-used-percent", "40"),
                ("x-codex-tertiary-reset-after-seconds", "60"),
            ],
        ];
        for case in cases {
            assert_eq!(read_windows(&headers(case), NOW), vec![], "{case:?}");
        }
    }

    #[test]
    fn per_minute_api_key_limits_are_read_for_both_providers() {
        let set = headers(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "40"),
            ("anthropic-ratelimit-requests-reset", "2026-01-02T03:04:05Z"),
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "10000"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2026-01-02T04:04:05.5+01:00",
            ),
            // Malformed: skipped.
            ("anthropic-ratelimit-output-tokens-limit", "0"),
            ("anthropic-ratelimit-output-tokens-remaining", "0"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2026-01-02T03:04:05Z",
            ),
            ("anthropic-ratelimit-tokens-limit", "100"),
            ("anthropic-ratelimit-tokens-remaining", "10"),
            ("anthropic-ratelimit-tokens-reset", "2026-13-02T03:04:05Z"),
        ]);
        let readings = read_windows(&set, NOW);
        assert_eq!(readings.len(), 2, "{readings:?}");
        let requests = find(&readings, WindowKind::PerMinute(MinuteLimit::Requests)).expect("rq");
        assert_eq!(requests.utilization, Some(0.2));
        // 2026-01-02T03:04:05Z
        assert_eq!(requests.reset_at_ms, 1_767_323_045_000);
        let input = find(&readings, WindowKind::PerMinute(MinuteLimit::InputTokens)).expect("in");
        assert_eq!(input.utilization, Some(0.75));
        assert_eq!(input.reset_at_ms, 1_767_323_045_500);

        let set = headers(&[
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "499"),
            ("x-ratelimit-reset-requests", "120ms"),
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-tokens", "15000"),
            ("x-ratelimit-reset-tokens", "1m30.5s"),
        ]);
        let readings = read_windows(&set, NOW);
        let requests = find(&readings, WindowKind::PerMinute(MinuteLimit::Requests)).expect("rq");
        assert_eq!(requests.reset_at_ms, NOW + 120);
        let tokens = find(&readings, WindowKind::PerMinute(MinuteLimit::Tokens)).expect("tk");
        assert_eq!(tokens.utilization, Some(0.5));
        assert_eq!(tokens.reset_at_ms, NOW + 90_500);
        for bad in ["6x", "m", "", "1.2.3s", "-5s", "NaN"] {
            let set = headers(&[
                ("x-ratelimit-limit-requests", "500"),
                ("x-ratelimit-remaining-requests", "499"),
                ("x-ratelimit-reset-requests", bad),
            ]);
            assert_eq!(read_windows(&set, NOW), vec![], "{bad:?}");
        }
    }
}
