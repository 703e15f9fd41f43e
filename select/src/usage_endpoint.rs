//! The usage endpoints the official CLIs read for their usage views (docs/SUBSCRIPTIONS.md,
//! "Probes and usage readings"): what confirms an OAuth account's credential, and what reads its
//! windows without sending the upstream any inference.
//!
//! - Claude subscriptions: `GET <origin of the base URL>/api/oauth/usage` with
//!   `Authorization: Bearer <token>` and `anthropic-beta: oauth-2025-04-20` (the path Claude
//!   Code 2.1.332 reads for `/usage`; docs/SUBSCRIPTIONS.md names who else reads it). Its
//!   buckets (`five_hour`, `seven_day`, `seven_day_opus`, `seven_day_sonnet`,
//!   `seven_day_overage_included`) are `{utilization, resets_at}` with the utilization a
//!   **percent** 0–100 (the headers' is a fraction) and `resets_at` RFC 3339, `null` while the
//!   window has not started; since mid-2026 a `limits[]` array carries the same windows
//!   (`kind`: `session`, `weekly_all`, `weekly_scoped` with `scope.model.display_name`,
//!   `percent`, `resets_at`): a model-scoped weekly window (the "Fable" limit) appears only
//!   there.
//! - ChatGPT subscriptions: `GET <base>/wham/usage` (default base
//!   `https://chatgpt.com/backend-api`, as Codex 0.171.0 calls it) with the bearer token and
//!   `chatgpt-account-id` from the token's claim. Its `rate_limit.{primary,secondary}_window`
//!   are `{used_percent, limit_window_seconds, reset_after_seconds, reset_at}` (percent 0–100,
//!   epoch seconds), and `additional_rate_limits[]` `{limit_name, rate_limit{…}}` the per-model
//!   limits.
//!
//! The readings are the same `WindowReading`s the answers' headers give (same kinds, same
//! scopes), stored under the same `supersedes` rule. What an answer means for the credential is
//! [`UsageAnswer`]; API-key accounts have no such endpoint and keep the inference probe.

use std::time::Duration;

use serde_json::Value;

use poolgate_core::account::{Account, CredentialKind, chatgpt_account_id};
use poolgate_core::classify::UpstreamError;
use poolgate_core::windows::{Scope, WindowKind, WindowReading, WindowStatus};

/// Claude's usage path, under the origin of the account's base URL.
pub const CLAUDE_USAGE_PATH: &str = "/api/oauth/usage";
/// ChatGPT's usage path, under the account's base URL.
pub const CHATGPT_USAGE_PATH: &str = "/wham/usage";

/// The furthest ahead a reset read here may lie (the longest window, a week, and a day of
/// slack), as the selector's window intake takes them.
const MAX_RESET_AHEAD_MS: i64 = 8 * 24 * 3_600_000;

/// The most of an answer read (the real ones are a few KB).
const MAX_BODY: usize = 256 * 1024;

/// The token fixing a model-scoped Claude window whose label is this (the family's name, in
/// lowercase: "Fable" → `fable`), as the headers' model-scoped windows are scoped.
fn claude_family(display_name: &str) -> Option<String> {
    let first = display_name.split_whitespace().next()?.to_ascii_lowercase();
    (!first.is_empty() && first.len() <= 64).then_some(first)
}

/// A Codex named limit's scope: its `limit_name` as the headers' `-limit-name` is read
/// (lowercase, `_` as `-`, so it covers the model of that name).
fn codex_family(limit_name: &str) -> Option<String> {
    let name = limit_name
        .trim()
        .to_ascii_lowercase()
        .replace(['_', ' '], "-");
    (!name.is_empty() && name.len() <= 64).then_some(name)
}

/// Where `account`'s usage endpoint is; `None`: the credential has none (API keys), and the
/// inference probe confirms it.
pub fn usage_url(account: &Account) -> Option<String> {
    match account.credential_kind {
        CredentialKind::ApiKey => None,
        CredentialKind::OAuth => {
            let url = reqwest::Url::parse(&account.base_url).ok()?;
            let origin = url.origin();
            origin
                .is_tuple()
                .then(|| format!("{}{CLAUDE_USAGE_PATH}", origin.ascii_serialization()))
        }
        CredentialKind::ChatGptOAuth => Some(format!(
            "{}{CHATGPT_USAGE_PATH}",
            account.base_url.trim_end_matches('/')
        )),
    }
}

/// The usage request for `account`, or `None` when it has no usage endpoint.
pub fn usage_request(
    client: &reqwest::Client,
    account: &Account,
) -> Option<reqwest::RequestBuilder> {
    let url = usage_url(account)?;
    let credential = account.credential.expose();
    let request = client
        .get(url)
        .bearer_auth(credential)
        .header(http::header::ACCEPT, "application/json")
        // poolgate's own name: no client is presented as another (and the ChatGPT backend's
        // bot gate refuses a request with none).
        .header(
            http::header::USER_AGENT,
            concat!("poolgate/", env!("CARGO_PKG_VERSION")),
        );
    Some(match account.credential_kind {
        CredentialKind::OAuth => request.header("anthropic-beta", "oauth-2025-04-20"),
        _ => match chatgpt_account_id(credential) {
            Some(id) => request.header("chatgpt-account-id", id),
            None => request,
        },
    })
}

/// What the windows in one usage answer say.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Usage {
    /// The readings to store (windows running now; a window not started has no reset to
    /// store).
    pub readings: Vec<WindowReading>,
    /// How many account-wide plan windows the answer showed (started or not).
    pub account_windows: usize,
    /// One of them is used up and resets after now: a window block stands.
    pub exhausted: bool,
}

impl Usage {
    /// The answer shows the account's windows and none of them used up: a hard block written
    /// for an exhausted window is past its reason.
    pub fn windows_open(&self) -> bool {
        self.account_windows > 0 && !self.exhausted
    }

    fn add(
        &mut self,
        kind: WindowKind,
        scope: Scope,
        percent: Option<f64>,
        reset_at_ms: Option<i64>,
        length_ms: Option<i64>,
        now_ms: i64,
    ) {
        let Some(percent) = percent.filter(|p| p.is_finite() && *p >= 0.0) else {
            return;
        };
        let used = (percent / 100.0).min(1.0);
        let running = reset_at_ms.filter(|reset| *reset > now_ms);
        if scope == Scope::Account && kind.is_plan() {
            self.account_windows += 1;
            self.exhausted |= used >= 1.0 && running.is_some();
        }
        let Some(reset_at_ms) = running.filter(|reset| *reset <= now_ms + MAX_RESET_AHEAD_MS)
        else {
            return;
        };
        if self
            .readings
            .iter()
            .any(|r| r.kind == kind && r.scope == scope)
        {
            return;
        }
        self.readings.push(WindowReading {
            kind,
            scope,
            utilization: Some(used),
            reset_at_ms,
            length_ms: length_ms.or_else(|| default_length_ms(kind)),
            // The endpoint states no status; at 100 % the next request is refused.
            status: if used >= 1.0 {
                WindowStatus::Rejected
            } else {
                WindowStatus::Unknown
            },
            observed_at_ms: now_ms,
        });
    }
}

fn default_length_ms(kind: WindowKind) -> Option<i64> {
    const HOUR: i64 = 3_600_000;
    match kind {
        WindowKind::FiveHour => Some(5 * HOUR),
        WindowKind::SevenDay | WindowKind::SevenDayOverageIncluded | WindowKind::SevenDayModel => {
            Some(7 * 24 * HOUR)
        }
        _ => None,
    }
}

fn rfc3339_ms(value: Option<&Value>) -> Option<i64> {
    let text = value?.as_str()?;
    let at: jiff::Timestamp = text.parse().ok()?;
    Some(at.as_millisecond())
}

/// Claude's `/api/oauth/usage` answer as readings at `now_ms`.
pub fn read_claude(body: &Value, now_ms: i64) -> Usage {
    let mut usage = Usage::default();
    let buckets: [(&str, WindowKind, Option<&str>); 5] = [
        ("five_hour", WindowKind::FiveHour, None),
        ("seven_day", WindowKind::SevenDay, None),
        ("seven_day_opus", WindowKind::SevenDayModel, Some("opus")),
        (
            "seven_day_sonnet",
            WindowKind::SevenDayModel,
            Some("sonnet"),
        ),
        (
            "seven_day_overage_included",
            WindowKind::SevenDayOverageIncluded,
            Some("fable"),
        ),
    ];
    for (name, kind, family) in buckets {
        let Some(bucket) = body.get(name).filter(|b| b.is_object()) else {
            continue;
        };
        let scope = family.map_or(Scope::Account, |f| Scope::Models(f.to_owned()));
        usage.add(
            kind,
            scope,
            bucket.get("utilization").and_then(Value::as_f64),
            rfc3339_ms(bucket.get("resets_at")),
            None,
            now_ms,
        );
    }
    for limit in body
        .get("limits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (kind, scope) = match limit.get("kind").and_then(Value::as_str) {
            Some("session") => (WindowKind::FiveHour, Scope::Account),
            Some("weekly_all") => (WindowKind::SevenDay, Scope::Account),
            Some("weekly_scoped") => {
                let Some(family) = limit
                    .pointer("/scope/model/display_name")
                    .and_then(Value::as_str)
                    .and_then(claude_family)
                else {
                    continue;
                };
                (WindowKind::SevenDayOverageIncluded, Scope::Models(family))
            }
            _ => continue,
        };
        // The same window as a top-level bucket counts once.
        if scope == Scope::Account
            && body
                .get(match kind {
                    WindowKind::FiveHour => "five_hour",
                    _ => "seven_day",
                })
                .is_some_and(Value::is_object)
        {
            continue;
        }
        usage.add(
            kind,
            scope,
            limit.get("percent").and_then(Value::as_f64),
            rfc3339_ms(limit.get("resets_at")),
            None,
            now_ms,
        );
    }
    usage
}

/// One ChatGPT `RateLimitStatusDetails` (`{primary_window, secondary_window}`) into `usage`.
fn read_codex_limit(usage: &mut Usage, details: &Value, scope: &Scope, now_ms: i64) {
    for (field, kind) in [
        ("primary_window", WindowKind::CodexPrimary),
        ("secondary_window", WindowKind::CodexSecondary),
    ] {
        let Some(window) = details.get(field).filter(|w| w.is_object()) else {
            continue;
        };
        let number = |name: &str| window.get(name).and_then(Value::as_f64);
        let reset_at_ms = number("reset_at")
            .filter(|s| (1e9..=1.7e10).contains(s))
            .map(|s| (s * 1000.0) as i64)
            .or_else(|| {
                number("reset_after_seconds")
                    .filter(|s| (0.0..=3.2e7).contains(s))
                    .map(|s| now_ms + (s * 1000.0) as i64)
            });
        let length_ms = number("limit_window_seconds")
            .filter(|s| *s > 0.0 && *s <= 366.0 * 86_400.0)
            .map(|s| (s * 1000.0) as i64);
        usage.add(
            kind,
            scope.clone(),
            number("used_percent"),
            reset_at_ms,
            length_ms,
            now_ms,
        );
    }
}

/// ChatGPT's `/wham/usage` answer as readings at `now_ms`.
pub fn read_chatgpt(body: &Value, now_ms: i64) -> Usage {
    let mut usage = Usage::default();
    if let Some(limit) = body.get("rate_limit").filter(|l| l.is_object()) {
        read_codex_limit(&mut usage, limit, &Scope::Account, now_ms);
    }
    for extra in body
        .get("additional_rate_limits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(family), Some(limit)) = (
            extra
                .get("limit_name")
                .and_then(Value::as_str)
                .and_then(codex_family),
            extra.get("rate_limit").filter(|l| l.is_object()),
        ) else {
            continue;
        };
        read_codex_limit(&mut usage, limit, &Scope::Models(family), now_ms);
    }
    usage
}

/// What a usage endpoint's answer means for the credential that read it.
#[derive(Debug, Clone, PartialEq)]
pub enum UsageAnswer {
    /// A 200: the credential is good; what it showed.
    Read(Usage),
    /// A 401, or a 403 with the upstream's error body (what Claude Code itself reads as "auth
    /// rejected"): the credential is refused. The error's `type/code`, never its message.
    Refused { status: u16, summary: String },
    /// This credential cannot read a usage endpoint here (a 404 or 405: a base URL that is not
    /// the upstream's; a 403 naming a missing scope: a token signed in for inference only): its
    /// confirmations keep the inference probe.
    NoEndpoint { status: u16 },
    /// A 429, a 5xx, a 403 without the upstream's error body (a bot gate), an unreadable 200, or
    /// no answer: it proves nothing, and changes nothing.
    Inconclusive { status: u16, why: &'static str },
}

/// Reads `account`'s usage endpoint (bounded by `timeout`); API-key accounts have none.
pub async fn read_usage(
    client: &reqwest::Client,
    account: &Account,
    timeout: Duration,
    now_ms: impl Fn() -> i64,
) -> UsageAnswer {
    let Some(request) = usage_request(client, account) else {
        return UsageAnswer::NoEndpoint { status: 0 };
    };
    let response = match request.timeout(timeout).send().await {
        Ok(response) => response,
        Err(error) => {
            tracing::info!(account_id = account.id, error = %error.without_url(), "usage endpoint gave no answer");
            return UsageAnswer::Inconclusive {
                status: 0,
                why: "network",
            };
        }
    };
    let status = response.status().as_u16();
    let body = match response.bytes().await {
        Ok(body) => body,
        Err(_) => {
            return UsageAnswer::Inconclusive {
                status,
                why: "body",
            };
        }
    };
    judge(
        account.credential_kind,
        status,
        &body[..body.len().min(MAX_BODY)],
        now_ms(),
    )
}

/// What an answer of `status` with `body` means (`read_usage`'s verdict, without the network).
pub fn judge(kind: CredentialKind, status: u16, body: &[u8], now_ms: i64) -> UsageAnswer {
    let error = UpstreamError::parse(body);
    let json_error = serde_json::from_slice::<Value>(body)
        .ok()
        .filter(|v| v.get("error").is_some() || v.get("detail").is_some());
    match status {
        200 => {
            let Ok(json) = serde_json::from_slice::<Value>(body) else {
                return UsageAnswer::Inconclusive {
                    status,
                    why: "unreadable",
                };
            };
            UsageAnswer::Read(match kind {
                CredentialKind::ChatGptOAuth => read_chatgpt(&json, now_ms),
                _ => read_claude(&json, now_ms),
            })
        }
        404 | 405 => UsageAnswer::NoEndpoint { status },
        403 if json_error
            .as_ref()
            .is_some_and(|v| v.to_string().to_ascii_lowercase().contains("scope")) =>
        {
            UsageAnswer::NoEndpoint { status }
        }
        401 => UsageAnswer::Refused {
            status,
            summary: error.map(|e| e.summary()).unwrap_or_default(),
        },
        403 if json_error.is_some() => UsageAnswer::Refused {
            status,
            summary: error.map(|e| e.summary()).unwrap_or_default(),
        },
        _ => UsageAnswer::Inconclusive {
            status,
            why: "upstream",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::tests::test_account;
    use poolgate_core::account::Platform;
    use serde_json::json;

    const NOW: i64 = 1_790_000_000_000;

    fn at(ms: i64) -> String {
        jiff::Timestamp::from_millisecond(ms)
            .map(|t| t.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn the_urls_are_the_clis_own() {
        let claude = test_account(
            Platform::Anthropic,
            CredentialKind::OAuth,
            "t",
            "https://api.anthropic.com/v1/",
        );
        assert_eq!(
            usage_url(&claude).as_deref(),
            Some("https://api.anthropic.com/api/oauth/usage")
        );
        let chatgpt = test_account(
            Platform::OpenAi,
            CredentialKind::ChatGptOAuth,
            "t",
            "https://chatgpt.com/backend-api/",
        );
        assert_eq!(
            usage_url(&chatgpt).as_deref(),
            Some("https://chatgpt.com/backend-api/wham/usage")
        );
        let key = test_account(Platform::Anthropic, CredentialKind::ApiKey, "k", "http://x");
        assert_eq!(usage_url(&key), None);
    }

    #[test]
    fn claude_percentages_and_rfc3339_resets_are_read_as_the_headers_windows() {
        let body = json!({
            "five_hour": {"utilization": 19.0, "resets_at": at(NOW + 3_600_000)},
            "seven_day": {"utilization": 100, "resets_at": at(NOW + 86_400_000)},
            "seven_day_opus": null,
            "seven_day_sonnet": {"utilization": 0, "resets_at": null},
            "limits": [
                {"kind": "session", "percent": 19, "resets_at": at(NOW + 3_600_000), "scope": null},
                {"kind": "weekly_scoped", "percent": 43, "resets_at": at(NOW + 2 * 86_400_000),
                 "scope": {"model": {"id": null, "display_name": "Fable"}}, "is_active": true}
            ],
            "extra_usage": {"is_enabled": false}
        });
        let usage = read_claude(&body, NOW);
        assert_eq!(usage.readings.len(), 3, "{usage:?}");
        let five = &usage.readings[0];
        assert_eq!(
            (five.kind, &five.scope),
            (WindowKind::FiveHour, &Scope::Account)
        );
        assert_eq!(five.utilization, Some(0.19));
        assert_eq!(five.reset_at_ms, NOW + 3_600_000);
        let week = &usage.readings[1];
        assert_eq!(week.status, WindowStatus::Rejected);
        let fable = &usage.readings[2];
        assert_eq!(fable.kind, WindowKind::SevenDayOverageIncluded);
        assert_eq!(fable.scope, Scope::Models("fable".into()));
        assert_eq!(fable.utilization, Some(0.43));
        assert!(usage.exhausted);
        assert!(!usage.windows_open());
    }

    #[test]
    fn a_window_not_started_or_past_its_reset_is_open_and_stores_nothing() {
        let body = json!({
            "five_hour": {"utilization": 0, "resets_at": null},
            "seven_day": {"utilization": 100, "resets_at": at(NOW - 1_000)},
        });
        let usage = read_claude(&body, NOW);
        assert!(usage.readings.is_empty(), "{usage:?}");
        assert_eq!(usage.account_windows, 2);
        assert!(usage.windows_open());
        assert!(!read_claude(&json!({}), NOW).windows_open());
    }

    #[test]
    fn chatgpt_windows_and_named_limits_are_read() {
        let body = json!({
            "plan_type": "pro",
            "rate_limit": {"allowed": true, "limit_reached": false,
                "primary_window": {"used_percent": 50, "limit_window_seconds": 18000,
                    "reset_after_seconds": 9000, "reset_at": NOW / 1000 + 9000},
                "secondary_window": {"used_percent": 20, "limit_window_seconds": 604800,
                    "reset_after_seconds": 500000, "reset_at": null}},
            "additional_rate_limits": [{"limit_name": "GPT-5.3-Codex-Spark",
                "metered_feature": "codex_bengalfox",
                "rate_limit": {"allowed": false, "limit_reached": true,
                    "primary_window": {"used_percent": 100, "limit_window_seconds": 18000,
                        "reset_after_seconds": 60, "reset_at": NOW / 1000 + 60}}}]
        });
        let usage = read_chatgpt(&body, NOW);
        assert_eq!(usage.readings.len(), 3, "{usage:?}");
        assert_eq!(usage.readings[0].kind, WindowKind::CodexPrimary);
        assert_eq!(usage.readings[0].utilization, Some(0.5));
        assert_eq!(usage.readings[0].length_ms, Some(18_000_000));
        assert_eq!(usage.readings[1].reset_at_ms, NOW + 500_000_000);
        let spark = &usage.readings[2];
        assert_eq!(spark.scope, Scope::Models("gpt-5.3-codex-spark".into()));
        assert!(spark.scope.covers("gpt-5.3-codex-spark"));
        assert_eq!(spark.status, WindowStatus::Rejected);
        // The named limit is one model's: the account's own windows are open.
        assert!(usage.windows_open());
    }

    #[test]
    fn answers_are_judged_as_the_cli_judges_them() {
        let kind = CredentialKind::OAuth;
        let refused = br#"{"type":"error","error":{"type":"authentication_error","message":"x"}}"#;
        assert!(matches!(
            judge(kind, 401, refused, NOW),
            UsageAnswer::Refused { status: 401, .. }
        ));
        let revoked = br#"{"type":"error","error":{"type":"permission_error","message":"OAuth token has been revoked."}}"#;
        assert!(matches!(
            judge(kind, 403, revoked, NOW),
            UsageAnswer::Refused { status: 403, .. }
        ));
        let scope = br#"{"type":"error","error":{"type":"permission_error","message":"OAuth token does not meet scope requirement user:profile"}}"#;
        assert_eq!(
            judge(kind, 403, scope, NOW),
            UsageAnswer::NoEndpoint { status: 403 }
        );
        assert!(matches!(
            judge(kind, 403, b"<html>challenge</html>", NOW),
            UsageAnswer::Inconclusive { .. }
        ));
        for status in [429, 500, 502, 529] {
            assert!(matches!(
                judge(kind, status, refused, NOW),
                UsageAnswer::Inconclusive { .. }
            ));
        }
        assert_eq!(
            judge(kind, 404, b"", NOW),
            UsageAnswer::NoEndpoint { status: 404 }
        );
        assert!(matches!(
            judge(
                CredentialKind::ChatGptOAuth,
                401,
                br#"{"detail":"Unauthorized"}"#,
                NOW
            ),
            UsageAnswer::Refused { status: 401, .. }
        ));
    }
}
