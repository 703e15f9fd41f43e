//! Model-scoped limits (docs/DESIGN.md §5, "Model-scoped limits"): which models each one covers,
//! taken from what the upstream says, and, for a 429, whether the limit that refused it is one
//! of them or one of the account's, and when that limit resets.
//!
//! Scoped or account-wide is decided from the upstream's own words: Anthropic's representative
//! claim and per-bucket statuses; for Codex which header family is at 100 % (and the
//! `x-codex-active-limit` it names) while the account's primary and secondary are not. A scoped
//! limit's reset is the latest of the resets that belong to it, never an account-wide one.

use http::HeaderMap;
use serde_json::Value;

use super::headers::{after_seconds_ms, codex_families, epoch_seconds_ms, header, number};
use super::{Scope, WindowKind};

/// Anthropic's model-scoped weekly limits: the representative claim, the header family's tag,
/// the window kind, and the token of the models it covers (the table in docs/DESIGN.md §5).
pub(super) const ANTHROPIC_SCOPED: [(&str, &str, WindowKind, &str); 3] = [
    (
        "seven_day_opus",
        "7d_opus",
        WindowKind::SevenDayModel,
        "opus",
    ),
    (
        "seven_day_sonnet",
        "7d_sonnet",
        WindowKind::SevenDayModel,
        "sonnet",
    ),
    // The bucket Claude Code labels "Fable limit"; it appears only on Fable answers.
    (
        "seven_day_overage_included",
        "7d_oi",
        WindowKind::SevenDayOverageIncluded,
        "fable",
    ),
];

/// Anthropic's account-wide plan windows: claim and header tag.
const ANTHROPIC_ACCOUNT: [(&str, &str); 2] = [("five_hour", "5h"), ("seven_day", "7d")];

/// Which limit refused a 429, as the upstream states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedBy {
    /// An account-wide window is used up: the account serves nothing until `reset_at_ms`.
    Account { reset_at_ms: Option<i64> },
    /// A model-scoped limit: only the models it covers wait, until `reset_at_ms`.
    Models { reset_at_ms: Option<i64> },
}

/// The limit a 429 with these headers and this body was refused by; `None` when the upstream
/// names no used-up limit (a busy 429).
pub fn refused_by(headers: &HeaderMap, body: &[u8], now_ms: i64) -> Option<RefusedBy> {
    anthropic(headers).or_else(|| codex(headers, body, now_ms))
}

/// The scope of a Codex named limit (`x-codex-<name>-*`): the models its `-limit-name` names.
/// The header's `<name>` (`bengalfox`) is the metered feature's code name and matches no model;
/// without a limit name the family's models are unknown (`None`), never guessed.
pub(super) fn codex_scope(headers: &HeaderMap, name: &str) -> Option<Scope> {
    let value = header(headers, &format!("x-codex-{name}-limit-name"))?;
    let token = value.to_ascii_lowercase().replace(['_', ' '], "-");
    let valid = !token.is_empty()
        && token.len() <= 64
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    valid.then_some(Scope::Models(token))
}

fn anthropic(headers: &HeaderMap) -> Option<RefusedBy> {
    let reset = |name: &str| number(headers, name).and_then(epoch_seconds_ms);
    let family = |tag: &str, field: &str| format!("anthropic-ratelimit-unified-{tag}-{field}");
    let overall_rejected =
        header(headers, "anthropic-ratelimit-unified-status") == Some("rejected");
    let claim = header(headers, "anthropic-ratelimit-unified-representative-claim");
    let scoped_claim = claim.is_some_and(|c| ANTHROPIC_SCOPED.iter().any(|s| s.0 == c));
    let account_rejected: Vec<&str> = ANTHROPIC_ACCOUNT
        .iter()
        .map(|(_, tag)| *tag)
        .filter(|tag| header(headers, &family(tag, "status")) == Some("rejected"))
        .collect();
    // An account-wide window said rejected, or the overall status about a claim that is not
    // model-scoped (an unknown claim included: scoped only when the upstream says so).
    if !account_rejected.is_empty() || (overall_rejected && !scoped_claim) {
        let claimed = claim
            .and_then(|c| ANTHROPIC_ACCOUNT.iter().find(|(name, _)| *name == c))
            .and_then(|(_, tag)| reset(&family(tag, "reset")));
        // The overall reset is the representative claim's: not the account's when that claim
        // is a scoped one.
        let overall = (!scoped_claim)
            .then(|| reset("anthropic-ratelimit-unified-reset"))
            .flatten();
        let reset_at_ms = claimed.or(overall).or_else(|| {
            account_rejected
                .iter()
                .filter_map(|tag| reset(&family(tag, "reset")))
                .max()
        });
        return Some(RefusedBy::Account { reset_at_ms });
    }
    let mut refused = false;
    let mut resets = Vec::new();
    for (claim_name, tag, _, _) in ANTHROPIC_SCOPED {
        let representative = claim == Some(claim_name);
        // A bucket's exhaustion shows as `rejected` or as a utilization of 1 or more (the
        // `7d_oi` family has been seen with both, and with no overall status at all).
        let rejected = (representative && overall_rejected)
            || header(headers, &family(tag, "status")) == Some("rejected")
            || number(headers, &family(tag, "utilization")).is_some_and(|u| u >= 1.0);
        if !rejected {
            continue;
        }
        refused = true;
        resets.extend(reset(&family(tag, "reset")));
        if representative {
            resets.extend(reset("anthropic-ratelimit-unified-reset"));
        }
    }
    refused.then(|| RefusedBy::Models {
        reset_at_ms: resets.into_iter().max(),
    })
}

/// The resets of a Codex family's sides at 100 % (`prefix`: `x-codex` or `x-codex-<name>`);
/// `None` when no side is.
fn codex_exhausted(headers: &HeaderMap, prefix: &str, now_ms: i64) -> Option<Vec<i64>> {
    let mut exhausted = false;
    let mut resets = Vec::new();
    for side in ["primary", "secondary"] {
        let field = |suffix: &str| number(headers, &format!("{prefix}-{side}-{suffix}"));
        if !field("used-percent").is_some_and(|used| used >= 100.0) {
            continue;
        }
        exhausted = true;
        resets.extend(
            field("reset-at")
                .and_then(epoch_seconds_ms)
                .or_else(|| field("reset-after-seconds").and_then(|s| after_seconds_ms(s, now_ms))),
        );
    }
    exhausted.then_some(resets)
}

/// Codex's `usage_limit_reached` 429 body (`error.type`, or `error.code` on some answers) and
/// its reset: `resets_at` (epoch s) or `resets_in_seconds`.
fn usage_limit_reached(body: &[u8], now_ms: i64) -> Option<Option<i64>> {
    let json: Value = serde_json::from_slice(body).ok()?;
    let error = json.get("error")?;
    let named =
        |field: &str| error.get(field).and_then(Value::as_str) == Some("usage_limit_reached");
    if !named("type") && !named("code") {
        return None;
    }
    let at = error
        .get("resets_at")
        .and_then(Value::as_f64)
        .and_then(epoch_seconds_ms);
    let after = || {
        error
            .get("resets_in_seconds")
            .and_then(Value::as_f64)
            .and_then(|s| after_seconds_ms(s, now_ms))
    };
    Some(at.or_else(after))
}

fn codex(headers: &HeaderMap, body: &[u8], now_ms: i64) -> Option<RefusedBy> {
    let usage_limit = usage_limit_reached(body, now_ms);
    let body_reset = usage_limit.flatten();
    // `x-codex-active-limit` names the limit that refused (`codex` the account's own,
    // `codex_bengalfox` the family `x-codex-bengalfox-*`), as the Codex CLI reads it.
    let active = header(headers, "x-codex-active-limit")
        .map(|id| format!("x-{}", id.to_ascii_lowercase().replace('_', "-")))
        .filter(|prefix| prefix != "x-codex");
    if let Some(resets) = codex_exhausted(headers, "x-codex", now_ms) {
        let body_reset = body_reset.filter(|_| active.is_none());
        return Some(RefusedBy::Account {
            reset_at_ms: resets.into_iter().chain(body_reset).max(),
        });
    }
    let mut prefixes: Vec<String> = codex_families(headers)
        .into_iter()
        .filter_map(|(name, _)| name)
        .map(|name| format!("x-codex-{name}"))
        .collect();
    prefixes.sort();
    prefixes.dedup();
    let named: Vec<(String, Vec<i64>)> = prefixes
        .into_iter()
        .filter_map(|prefix| codex_exhausted(headers, &prefix, now_ms).map(|r| (prefix, r)))
        .collect();
    if let Some(active) = active
        && (usage_limit.is_some() || named.iter().any(|(prefix, _)| *prefix == active))
    {
        let own = named
            .iter()
            .filter(|(prefix, _)| *prefix == active)
            .flat_map(|(_, resets)| resets.iter().copied());
        return Some(RefusedBy::Models {
            reset_at_ms: own.chain(body_reset).max(),
        });
    }
    if !named.is_empty() {
        let resets = named.iter().flat_map(|(_, resets)| resets.iter().copied());
        return Some(RefusedBy::Models {
            reset_at_ms: resets.chain(body_reset).max(),
        });
    }
    usage_limit.map(|reset_at_ms| RefusedBy::Account { reset_at_ms })
}
