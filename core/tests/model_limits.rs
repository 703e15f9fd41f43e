//! A one-model limit blocks one model (docs/DESIGN.md §5, "Model-scoped limits"): a 429 whose
//! representative claim or bucket is model-scoped is `ClientError` / `model_limit` (nothing
//! written, no hard block), its reset is the latest of the resets that belong to that limit
//! (never an account-wide one), and the window reading the same answer carries is full at once
//! and covers only the family the upstream names (`7d_oi` → Fable; a Codex named limit → its
//! `-limit-name`). Header sets are the real ones the sources show (docs/SUBSCRIPTIONS.md).

use http::{HeaderMap, HeaderName, HeaderValue};
use poolgate_core::classify::classify;
use poolgate_core::outcome::{Decision, Outcome, OutcomeClass, RuntimeBlockSettings, decide};
use poolgate_core::windows::{Scope, Thresholds, WindowKind, WindowStatus, assess, read_windows};

const NOW: i64 = 1_790_000_000_000;
const NOW_S: i64 = NOW / 1000;
const HOUR_S: i64 = 3_600;
const DAY_S: i64 = 86_400;

fn headers(pairs: &[(&str, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.insert(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
    }
    map
}

fn at(seconds_from_now: i64) -> String {
    (NOW_S + seconds_from_now).to_string()
}

fn ms(seconds_from_now: i64) -> i64 {
    (NOW_S + seconds_from_now) * 1000
}

const RATE_LIMITED: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed your account's rate limit. Please try again later."}}"#;

fn classify_429(headers: &HeaderMap, body: &str) -> poolgate_core::classify::Classified {
    classify(429, headers, body.as_bytes(), NOW, 60_000)
}

/// The Opus weekly claim rejected while the 5-hour and 7-day windows are allowed.
fn opus_rejected() -> HeaderMap {
    headers(&[
        ("anthropic-ratelimit-unified-status", "rejected".into()),
        (
            "anthropic-ratelimit-unified-representative-claim",
            "seven_day_opus".into(),
        ),
        ("anthropic-ratelimit-unified-reset", at(2 * DAY_S)),
        ("anthropic-ratelimit-unified-5h-status", "allowed".into()),
        ("anthropic-ratelimit-unified-5h-utilization", "0.12".into()),
        ("anthropic-ratelimit-unified-5h-reset", at(3 * HOUR_S)),
        ("anthropic-ratelimit-unified-7d-status", "allowed".into()),
        ("anthropic-ratelimit-unified-7d-utilization", "0.4".into()),
        ("anthropic-ratelimit-unified-7d-reset", at(4 * DAY_S)),
    ])
}

#[test]
fn an_opus_weekly_429_is_a_model_limit_that_writes_nothing() {
    let got = classify_429(&opus_rejected(), RATE_LIMITED);
    assert!(got.is_model_limit(), "{got:?}");
    assert_eq!(got.class, OutcomeClass::ClientError);
    assert_eq!(got.reset_at_ms, Some(ms(2 * DAY_S)));
    // Were it reported, nothing would apply: no hard block, no breaker count.
    let outcome = Outcome {
        reset_at_ms: got.reset_at_ms,
        ..Outcome::new(1, got.class, 429)
    };
    assert_eq!(
        decide(&outcome, &RuntimeBlockSettings::default(), NOW),
        Decision::Nothing
    );
    // The same for the Sonnet claim.
    let mut sonnet = opus_rejected();
    sonnet.insert(
        "anthropic-ratelimit-unified-representative-claim",
        HeaderValue::from_static("seven_day_sonnet"),
    );
    assert!(classify_429(&sonnet, RATE_LIMITED).is_model_limit());
}

#[test]
fn the_opus_429s_reading_keeps_only_opus_off_the_account_at_once() {
    let readings = read_windows(&opus_rejected(), NOW);
    let opus = readings
        .iter()
        .find(|r| r.scope == Scope::Models("opus".into()))
        .expect("an Opus reading");
    assert_eq!(
        (opus.kind, opus.status, opus.reset_at_ms),
        (
            WindowKind::SevenDayModel,
            WindowStatus::Rejected,
            ms(2 * DAY_S)
        )
    );
    let assessment = assess(&readings, NOW, Thresholds::default());
    assert_eq!(
        assessment.blocked_for_model("claude-opus-4-5-20251101"),
        Some(ms(2 * DAY_S))
    );
    assert_eq!(
        assessment.blocked_for_model("claude-sonnet-4-5-20250929"),
        None
    );
    assert_eq!(
        assessment.blocked_for_model("claude-haiku-4-5-20251001"),
        None
    );
    assert_eq!(assessment.exhausted_until_ms, None);
}

/// The headers of a Fable-limit rejection as a peer recorded them (docs/SUBSCRIPTIONS.md,
/// "Model-scoped limits"), with resets.
fn fable_rejected() -> HeaderMap {
    headers(&[
        ("anthropic-ratelimit-unified-status", "rejected".into()),
        (
            "anthropic-ratelimit-unified-representative-claim",
            "seven_day_overage_included".into(),
        ),
        ("anthropic-ratelimit-unified-reset", at(5 * DAY_S)),
        ("anthropic-ratelimit-unified-7d-status", "allowed".into()),
        ("anthropic-ratelimit-unified-7d-utilization", "0.69".into()),
        ("anthropic-ratelimit-unified-7d-reset", at(6 * DAY_S)),
        ("anthropic-ratelimit-unified-5h-utilization", "0.00".into()),
        ("anthropic-ratelimit-unified-5h-reset", at(HOUR_S)),
        (
            "anthropic-ratelimit-unified-7d_oi-status",
            "rejected".into(),
        ),
        (
            "anthropic-ratelimit-unified-7d_oi-utilization",
            "1.02".into(),
        ),
        ("anthropic-ratelimit-unified-7d_oi-reset", at(5 * DAY_S)),
        (
            "anthropic-ratelimit-unified-overage-status",
            "rejected".into(),
        ),
    ])
}

#[test]
fn a_fable_7d_oi_429_is_a_model_limit_and_its_reading_covers_only_fable_models() {
    let got = classify_429(&fable_rejected(), RATE_LIMITED);
    assert!(got.is_model_limit(), "{got:?}");
    assert_eq!(got.reset_at_ms, Some(ms(5 * DAY_S)));
    let readings = read_windows(&fable_rejected(), NOW);
    let fable = readings
        .iter()
        .find(|r| r.kind == WindowKind::SevenDayOverageIncluded)
        .expect("a 7d_oi reading");
    assert_eq!(fable.scope, Scope::Models("fable".into()));
    let assessment = assess(&readings, NOW, Thresholds::default());
    for model in [
        "claude-fable-5",
        "claude-fable-5-1",
        "Claude-Fable-5-20260601",
    ] {
        assert_eq!(
            assessment.blocked_for_model(model),
            Some(ms(5 * DAY_S)),
            "{model}"
        );
    }
    for model in ["claude-opus-4-5-20251101", "claude-sonnet-4-6"] {
        assert_eq!(assessment.blocked_for_model(model), None, "{model}");
    }
    // The account itself is not used up: a full 7d_oi is no account-wide exhaustion.
    assert_eq!(assessment.exhausted_until_ms, None);
    assert!(
        assessment.headroom.is_some_and(|h| h > 0.3),
        "{assessment:?}"
    );
    // The 7d_oi family alone, no overall status or claim (docs/SUBSCRIPTIONS.md).
    let only_bucket = headers(&[
        (
            "anthropic-ratelimit-unified-7d_oi-status",
            "rejected".into(),
        ),
        (
            "anthropic-ratelimit-unified-7d_oi-utilization",
            "1.0".into(),
        ),
        ("anthropic-ratelimit-unified-7d_oi-reset", at(3 * DAY_S)),
    ]);
    let got = classify_429(&only_bucket, RATE_LIMITED);
    assert!(got.is_model_limit(), "{got:?}");
    assert_eq!(got.reset_at_ms, Some(ms(3 * DAY_S)));
}

#[test]
fn a_scoped_limits_reset_is_the_latest_of_its_own_never_an_account_wide_one() {
    // Its own family's reset and, as the representative claim, the overall one: the latest.
    let mut both = fable_rejected();
    both.insert(
        "anthropic-ratelimit-unified-7d_oi-reset",
        HeaderValue::from_str(&at(4 * DAY_S)).expect("value"),
    );
    assert_eq!(
        classify_429(&both, RATE_LIMITED).reset_at_ms,
        Some(ms(5 * DAY_S))
    );
    let fable = read_windows(&both, NOW)
        .into_iter()
        .find(|r| r.kind == WindowKind::SevenDayOverageIncluded)
        .expect("a 7d_oi reading");
    assert_eq!(fable.reset_at_ms, ms(5 * DAY_S));
    // The overall reset is the 5-hour claim's here, and `retry-after` is the account's: neither
    // belongs to the Fable limit.
    let five_hour_claim = headers(&[
        ("anthropic-ratelimit-unified-status", "allowed".into()),
        (
            "anthropic-ratelimit-unified-representative-claim",
            "five_hour".into(),
        ),
        ("anthropic-ratelimit-unified-reset", at(6 * DAY_S)),
        ("anthropic-ratelimit-unified-5h-status", "allowed".into()),
        ("anthropic-ratelimit-unified-5h-reset", at(6 * DAY_S)),
        (
            "anthropic-ratelimit-unified-7d_oi-status",
            "rejected".into(),
        ),
        ("anthropic-ratelimit-unified-7d_oi-reset", at(2 * DAY_S)),
        ("retry-after", (7 * DAY_S).to_string()),
    ]);
    let got = classify_429(&five_hour_claim, RATE_LIMITED);
    assert!(got.is_model_limit(), "{got:?}");
    assert_eq!(got.reset_at_ms, Some(ms(2 * DAY_S)));
}

#[test]
fn an_account_wide_window_stays_an_exhausted_window_even_beside_a_scoped_claim() {
    let five_hour = headers(&[
        ("anthropic-ratelimit-unified-status", "rejected".into()),
        (
            "anthropic-ratelimit-unified-representative-claim",
            "five_hour".into(),
        ),
        ("anthropic-ratelimit-unified-reset", at(2 * HOUR_S)),
        ("anthropic-ratelimit-unified-5h-status", "rejected".into()),
        ("anthropic-ratelimit-unified-5h-reset", at(2 * HOUR_S)),
    ]);
    let got = classify_429(&five_hour, RATE_LIMITED);
    assert_eq!(
        (got.class, got.reset_at_ms),
        (OutcomeClass::WindowExhausted, Some(ms(2 * HOUR_S)))
    );
    // The Opus claim is representative, but the week is used up too: the account is out, until
    // the week's reset (not the Opus claim's).
    let mut week_too = opus_rejected();
    week_too.insert(
        "anthropic-ratelimit-unified-7d-status",
        HeaderValue::from_static("rejected"),
    );
    let got = classify_429(&week_too, RATE_LIMITED);
    assert_eq!(
        (got.class, got.reset_at_ms),
        (OutcomeClass::WindowExhausted, Some(ms(4 * DAY_S)))
    );
    // A claim poolgate does not know is not taken for a scoped one.
    let unknown = headers(&[
        ("anthropic-ratelimit-unified-status", "rejected".into()),
        (
            "anthropic-ratelimit-unified-representative-claim",
            "seven_day_something".into(),
        ),
        ("anthropic-ratelimit-unified-reset", at(DAY_S)),
    ]);
    assert_eq!(
        classify_429(&unknown, RATE_LIMITED).class,
        OutcomeClass::WindowExhausted
    );
}

/// Codex's named limit at 100 % while the account's windows are not, as the backend answers
/// it: `x-codex-active-limit` names the family, `-limit-name` its models.
fn codex_named_limit() -> HeaderMap {
    headers(&[
        ("x-codex-primary-used-percent", "20".into()),
        ("x-codex-primary-window-minutes", "300".into()),
        ("x-codex-primary-reset-at", at(2 * HOUR_S)),
        ("x-codex-secondary-used-percent", "35".into()),
        ("x-codex-secondary-window-minutes", "10080".into()),
        ("x-codex-secondary-reset-at", at(5 * DAY_S)),
        ("x-codex-bengalfox-primary-used-percent", "100".into()),
        ("x-codex-bengalfox-primary-window-minutes", "10080".into()),
        ("x-codex-bengalfox-primary-reset-at", at(3 * DAY_S)),
        ("x-codex-bengalfox-limit-name", "GPT-5.3-Codex-Spark".into()),
        ("x-codex-active-limit", "codex_bengalfox".into()),
    ])
}

#[test]
fn a_codex_named_limit_is_a_model_limit_scoped_to_its_limit_name() {
    let body = format!(
        r#"{{"error":{{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"pro","resets_at":{}}}}}"#,
        NOW_S + 3 * DAY_S + 60
    );
    let got = classify_429(&codex_named_limit(), &body);
    assert!(got.is_model_limit(), "{got:?}");
    // The family's own reset and the body's: the latest.
    assert_eq!(got.reset_at_ms, Some(ms(3 * DAY_S + 60)));
    // `resets_in_seconds` is read too.
    let body = r#"{"error":{"type":"usage_limit_reached","resets_in_seconds":600000}}"#;
    assert_eq!(
        classify_429(&codex_named_limit(), body).reset_at_ms,
        Some(NOW + 600_000_000)
    );
    let readings = read_windows(&codex_named_limit(), NOW);
    let named = readings
        .iter()
        .find(|r| r.scope != Scope::Account)
        .expect("the named limit's reading");
    assert_eq!(named.scope, Scope::Models("gpt-5.3-codex-spark".into()));
    assert_eq!(named.status, WindowStatus::Rejected);
    let assessment = assess(&readings, NOW, Thresholds::default());
    assert_eq!(
        assessment.blocked_for_model("gpt-5.3-codex-spark"),
        Some(ms(3 * DAY_S))
    );
    assert_eq!(assessment.blocked_for_model("gpt-5.3-codex"), None);
    assert_eq!(assessment.blocked_for_model("gpt-5.5"), None);
    assert_eq!(assessment.exhausted_until_ms, None);
    // Without a limit name its models are unknown: no reading is made up from `bengalfox`.
    let mut nameless = codex_named_limit();
    nameless.remove("x-codex-bengalfox-limit-name");
    assert!(
        read_windows(&nameless, NOW)
            .iter()
            .all(|r| r.scope == Scope::Account)
    );
}

#[test]
fn a_codex_account_window_at_100_percent_stays_an_exhausted_window() {
    let mut primary = codex_named_limit();
    primary.insert(
        "x-codex-primary-used-percent",
        HeaderValue::from_static("100"),
    );
    primary.insert("x-codex-active-limit", HeaderValue::from_static("codex"));
    let body = r#"{"error":{"type":"usage_limit_reached","plan_type":"plus"}}"#;
    let got = classify_429(&primary, body);
    assert_eq!(
        (got.class, got.reset_at_ms),
        (OutcomeClass::WindowExhausted, Some(ms(2 * HOUR_S))),
        "the account window's reset, read from reset-at (not the named limit's)"
    );
    // A `usage_limit_reached` body naming no other limit, with no headers: the account's.
    let got = classify_429(&HeaderMap::new(), body);
    assert_eq!(got.class, OutcomeClass::WindowExhausted);
}

#[test]
fn scopes_cover_the_real_model_ids_of_their_family() {
    let opus = Scope::Models("opus".into());
    let sonnet = Scope::Models("sonnet".into());
    let fable = Scope::Models("fable".into());
    for model in [
        "claude-opus-4-5-20251101",
        "claude-opus-4-1-20250805",
        "claude-opus-4-6",
    ] {
        assert!(opus.covers(model) && !sonnet.covers(model) && !fable.covers(model));
    }
    for model in ["claude-sonnet-4-5-20250929", "claude-sonnet-4-6"] {
        assert!(sonnet.covers(model) && !opus.covers(model) && !fable.covers(model));
    }
    for model in [
        "claude-fable-5",
        "claude-fable-5-1",
        "claude-fable-5[1m]",
        "Claude-Fable-5-20260601",
    ] {
        assert!(fable.covers(model) && !opus.covers(model), "{model}");
    }
    assert!(!opus.covers("claude-haiku-4-5-20251001"));
    let spark = Scope::Models("gpt-5.3-codex-spark".into());
    assert!(spark.covers("gpt-5.3-codex-spark"));
    assert!(!spark.covers("gpt-5.3-codex"));
    assert!(!Scope::Models("bengalfox".into()).covers("gpt-5.3-codex-spark"));
}
