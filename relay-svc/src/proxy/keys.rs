//! What a client key may reach, checked on every request before any account is asked, and the
//! key as its holder may see it (`GET /v1/poolgate/key`). docs/DESIGN.md §6, "What a client key
//! reaches".

use poolgate_core::keys::{Endpoint, KeyDescription, KeyRefusal, UsagePeriod, rfc3339_utc};
use std::time::Duration;

use poolgate_core::money::micros_to_usd;
use serde_json::{Value, json};

use super::Relay;
use super::auth::{invalid_key, unavailable, valid_key};
use crate::client_api::{Api, RelayError};
use crate::ports::{Caller, KeyCheck, KeyRefused};

/// How long a key's self-service description is reused: its usage sums cost the selector four
/// ledger reads, so a holder polling the view reads Postgres at most once per this per relay.
pub const DESCRIPTION_TTL: Duration = Duration::from_secs(2);
/// Descriptions kept at once (past it, expired ones go; then all).
pub(super) const MAX_CACHED_DESCRIPTIONS: usize = 10_000;

impl Relay {
    /// Checks a request of `caller` on `endpoint` for `model` (the model the client asked for,
    /// before any mapping; `None` before the body is read, or on an endpoint that names none)
    /// with the relay's clock: the key (disabled, expired), the endpoint, the model. A refusal
    /// is the client's answer, and nothing reaches an account.
    pub fn check_access(
        &self,
        api: Api,
        caller: &Caller,
        endpoint: Endpoint,
        model: Option<&str>,
    ) -> Result<(), RelayError> {
        caller
            .access
            .check(self.clock.wall_ms(), endpoint, model)
            .map_err(|refusal| self.key_refused(api, refusal.into()))
    }

    /// The answer to a refused key's request, counted by reason (never by key).
    pub(super) fn key_refused(&self, api: Api, refused: KeyRefused) -> RelayError {
        self.metrics.key_refused(&refused.reason);
        tracing::debug!(reason = refused.reason.as_str(), "client key refused");
        RelayError::key_refused(api, &refused)
    }

    /// The key `key` as its holder may see it: its record and usage, nothing of another key.
    /// A disabled or expired key is described too (so its holder learns why it is refused);
    /// an unknown or revoked one is 401, as on every other route. A key the cache already
    /// knows as unknown costs no selector call.
    pub async fn describe_key(
        &self,
        api: Api,
        key: Option<&str>,
    ) -> Result<KeyDescription, RelayError> {
        let key = valid_key(api, key)?;
        if self.check_key(api, Some(key)).await? == KeyCheck::Unknown {
            return Err(invalid_key(api));
        }
        if let Some(description) = self.descriptions.get(key) {
            return Ok(description);
        }
        let _permit = self.key_lookup_permit(api).await?;
        match self.selection.describe_key(key).await {
            Ok(Some(description)) => {
                self.descriptions.insert(key, description.clone());
                Ok(description)
            }
            Ok(None) => Err(invalid_key(api)),
            Err(error) => {
                tracing::warn!(%error, "client key description unavailable");
                Err(unavailable(
                    api,
                    "the key's description is unavailable; try again",
                ))
            }
        }
    }
}

/// The self-service view of a key at `now_ms` (the relay's clock decides whether it has
/// expired): `{"key": {...}, "usage": {"day": ..., "week": ..., "month": ..., "total": ...}}`.
/// Empty model and endpoint lists allow everything; a limit that is not set is `null`. Each
/// usage period with a budget carries `budget_usd` and `remaining_usd` (the budget less the
/// period's cost, never below 0). The usage periods are the deployment's budget calendar, the
/// one admission counts budgets in (`--budget-time-zone`, `--budget-week-start`; UTC and Monday
/// by default), so a period's cost is its budget's spend; each `from` is the period's local
/// start as a UTC instant, and `usage_calendar` says so (`deployment`).
pub fn key_view(description: &KeyDescription, now_ms: i64) -> Value {
    let record = &description.record;
    let access = &record.access;
    let limits = &record.limits;
    let budget_micros = |period: UsagePeriod| match period {
        UsagePeriod::Day => limits.budget_day_micros,
        UsagePeriod::Week => limits.budget_week_micros,
        UsagePeriod::Month => limits.budget_month_micros,
        UsagePeriod::Total => limits.budget_total_micros,
    };
    let budget_usd = |period: UsagePeriod| {
        let micros = budget_micros(period);
        (micros > 0).then(|| micros_to_usd(micros))
    };
    let status = match access.check_key(now_ms) {
        Ok(()) => "active",
        Err(KeyRefusal::Disabled) => "disabled",
        Err(_) => "expired",
    };
    let endpoints: Vec<&str> = access
        .allowed_endpoints
        .iter()
        .map(|endpoint| endpoint.as_str())
        .collect();
    let mut usage = serde_json::Map::new();
    for (period, from_ms, totals) in &description.usage {
        let mut entry = json!({
            "from": rfc3339_utc(*from_ms),
            "requests": totals.requests,
            "input_tokens": totals.input_tokens,
            "output_tokens": totals.output_tokens,
            "cost_usd": totals.cost_usd,
        });
        if let Some(budget) = budget_usd(*period) {
            entry["budget_usd"] = json!(budget);
            entry["remaining_usd"] = json!((budget - totals.cost_usd).max(0.0));
        }
        if *period == UsagePeriod::Month {
            // Which price each model was charged at: `fallback` when it had none of its own
            // and its family's highest catalogue price applied (docs/DESIGN.md §6, "Prices").
            entry["models"] = description
                .models
                .iter()
                .map(|model| {
                    json!({
                        "model": model.model,
                        "price_source": model
                            .price_source
                            .map_or("unknown", |source| source.as_str()),
                        "requests": model.usage.requests,
                        "input_tokens": model.usage.input_tokens,
                        "output_tokens": model.usage.output_tokens,
                        "cost_usd": model.usage.cost_usd,
                    })
                })
                .collect();
        }
        usage.insert(period.as_str().to_owned(), entry);
    }
    json!({
        "key": {
            "id": record.id,
            "name": record.name,
            "prefix": record.prefix,
            "user": record.user,
            "group": record.group,
            "status": status,
            "expires_at": access.expires_at_ms.map(rfc3339_utc),
            "allowed_models": access.allowed_models,
            "allowed_endpoints": endpoints,
            "limits": {
                "user_rpm": (record.user_rpm_limit > 0).then_some(record.user_rpm_limit),
                "concurrency": (limits.concurrency_limit > 0).then_some(limits.concurrency_limit),
                "tpm": (limits.tpm_limit > 0).then_some(limits.tpm_limit),
                "budget_usd": {
                    "total": budget_usd(UsagePeriod::Total),
                    "day": budget_usd(UsagePeriod::Day),
                    "week": budget_usd(UsagePeriod::Week),
                    "month": budget_usd(UsagePeriod::Month),
                },
            },
        },
        "usage_calendar": "deployment",
        "usage": usage,
    })
}

#[cfg(test)]
mod tests {
    use poolgate_core::account::ApiKeyRecord;
    use poolgate_core::keys::{KeyAccess, PeriodUsage};
    use poolgate_core::lease::KeyLimits;

    use super::*;

    fn description(access: KeyAccess) -> KeyDescription {
        let now = 1_796_227_745_000;
        KeyDescription {
            record: ApiKeyRecord {
                id: 7,
                name: "ci".into(),
                prefix: "pgk-abcd".into(),
                user: "alice".into(),
                group: "default".into(),
                user_rpm_limit: 0,
                limits: Default::default(),
                active: true,
                access,
            },
            usage: UsagePeriod::ALL
                .into_iter()
                .map(|period| {
                    let usage = PeriodUsage {
                        requests: 2,
                        input_tokens: 30,
                        output_tokens: 40,
                        cost_usd: 0.5,
                    };
                    (period, period.start_ms(now), usage)
                })
                .collect(),
            models: Vec::new(),
        }
    }

    #[test]
    fn the_months_usage_says_which_price_each_model_was_charged_at() {
        use poolgate_core::keys::ModelPeriodUsage;
        use poolgate_core::price::PriceSource;
        let mut described = description(KeyAccess::default());
        let usage = PeriodUsage {
            requests: 1,
            input_tokens: 10,
            output_tokens: 7,
            cost_usd: 0.25,
        };
        described.models = vec![
            ModelPeriodUsage {
                model: "claude-opus-6".into(),
                price_source: Some(PriceSource::Fallback),
                usage,
            },
            ModelPeriodUsage {
                model: "claude-x".into(),
                price_source: None,
                usage,
            },
        ];
        let view = key_view(&described, 1_796_227_745_000);
        let models = &view["usage"]["month"]["models"];
        assert_eq!(models[0]["model"], "claude-opus-6", "{view}");
        assert_eq!(models[0]["price_source"], "fallback");
        assert_eq!(models[0]["cost_usd"], 0.25);
        assert_eq!(
            models[1]["price_source"], "unknown",
            "not said is not guessed"
        );
        assert_eq!(view["usage"]["day"].get("models"), None, "the month's only");
    }

    #[test]
    fn the_view_names_the_keys_status_expiry_lists_and_usage_per_period() {
        let now = 1_796_227_745_000;
        let access = KeyAccess {
            expires_at_ms: Some(now + 1000),
            disabled: false,
            allowed_models: vec!["claude-*".into()],
            allowed_endpoints: vec![Endpoint::Messages, Endpoint::Models],
        };
        let view = key_view(&description(access.clone()), now);
        let key = &view["key"];
        assert_eq!(key["status"], "active", "{view}");
        assert_eq!(key["expires_at"], "2026-12-02T16:09:06Z");
        assert_eq!(key["allowed_models"], json!(["claude-*"]));
        assert_eq!(key["allowed_endpoints"], json!(["messages", "models"]));
        assert_eq!(key["limits"]["user_rpm"], Value::Null);
        assert_eq!(
            (key["id"].as_i64(), &key["prefix"]),
            (Some(7), &json!("pgk-abcd"))
        );
        assert_eq!(view["usage"]["week"]["from"], "2026-11-30T00:00:00Z");
        assert_eq!(view["usage"]["total"]["from"], "1970-01-01T00:00:00Z");
        assert_eq!(view["usage"]["day"]["requests"], 2);
        assert_eq!(view["usage"]["month"]["cost_usd"], 0.5);

        let expired = key_view(&description(access.clone()), now + 1000);
        assert_eq!(expired["key"]["status"], "expired");
        let disabled = KeyAccess {
            disabled: true,
            ..access
        };
        let view = key_view(&description(disabled), now + 1000);
        assert_eq!(view["key"]["status"], "disabled", "disabled says more");
        let open = key_view(&description(KeyAccess::default()), now);
        assert_eq!(open["key"]["expires_at"], Value::Null);
        assert_eq!(open["key"]["allowed_models"], json!([]));
        assert_eq!(open["key"]["limits"]["concurrency"], Value::Null);
        assert_eq!(open["key"]["limits"]["budget_usd"]["day"], Value::Null);
        assert_eq!(open["usage"]["day"].get("remaining_usd"), None);
    }

    #[test]
    fn the_view_shows_the_keys_limits_and_what_is_left_of_each_budget() {
        let now = 1_796_227_745_000;
        let mut limited = description(KeyAccess::default());
        limited.record.limits = KeyLimits {
            api_key_id: 7,
            concurrency_limit: 2,
            tpm_limit: 10_000,
            budget_total_micros: 10_000_000,
            budget_day_micros: 400_000,
            budget_week_micros: 0,
            budget_month_micros: 3_000_000,
        };
        let view = key_view(&limited, now);
        let limits = &view["key"]["limits"];
        assert_eq!(limits["concurrency"], 2, "{view}");
        assert_eq!(limits["tpm"], 10_000);
        assert_eq!(
            limits["budget_usd"],
            json!({"total": 10.0, "day": 0.4, "week": null, "month": 3.0})
        );
        // Each period spent $0.50: the day's $0.40 is gone (never below 0).
        assert_eq!(view["usage"]["day"]["remaining_usd"], 0.0);
        assert_eq!(view["usage"]["month"]["remaining_usd"], 2.5);
        assert_eq!(view["usage"]["total"]["remaining_usd"], 9.5);
        assert_eq!(view["usage"]["week"].get("remaining_usd"), None);
        assert_eq!(view["usage_calendar"], "deployment");
    }
}
