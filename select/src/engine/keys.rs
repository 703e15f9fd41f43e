//! A client key as its holder sees it (the self-service view, docs/DESIGN.md §6 "What a client
//! key reaches"): its own record and its usage per period of the deployment's budget calendar,
//! never another key's; the same usage by key id for operators. And the
//! rebuild of its budget counters from the usage ledger (docs/DESIGN.md §4, "Client key
//! limits").

use std::sync::{Arc, Weak};
use std::time::Duration;

use poolgate_core::keys::{KeyDescription, PeriodUsage, UsagePeriod};
use poolgate_core::lease::KeyLimits;

use crate::crypto::api_key_hash;
use crate::source::budgets::{BudgetCounters, usage_period_start};
use poolgate_core::money::total_to_micros;

use super::{Selector, SelectorError};

impl Selector {
    /// Describes the key `api_key` to its holder: its record (a disabled or expired key too, so
    /// its holder learns why it is refused) and its usage in each of `UsagePeriod::ALL`
    /// ([`Selector::key_usage`]). An unknown or revoked key is `Unauthenticated`, with the same
    /// words for both (what a key is not, nobody learns from this call).
    pub async fn describe_key(&self, api_key: &str) -> Result<KeyDescription, SelectorError> {
        let record = match self.snapshot.get().api_key(&api_key_hash(api_key)) {
            Some(record) if record.active => record.clone(),
            _ => return Err(SelectorError::Unauthenticated("invalid API key".into())),
        };
        let usage = self.key_usage(record.id).await?;
        // The month's usage per model and price source (docs/DESIGN.md §6, "Prices"): which
        // price applied, a fallback's included.
        let month_from = usage
            .iter()
            .find(|(period, _, _)| *period == UsagePeriod::Month)
            .map(|(_, from, _)| *from)
            .unwrap_or_default();
        let models = self
            .source
            .read_model_usage(record.id, month_from, self.clock.wall_ms() + 1)
            .await?;
        Ok(KeyDescription {
            record,
            usage,
            models,
        })
    }

    /// The usage of the key `api_key_id` in each of `UsagePeriod::ALL` with when the period
    /// began, summed from the usage ledger up to now: the periods of the deployment's budget
    /// calendar (`SelectorSettings::budget_calendar`), the ones admission counts the key's
    /// budgets in, so a period's cost is its budget's spend. By id, for operators (a key
    /// without records, or an unknown id, has zeros).
    pub async fn key_usage(
        &self,
        api_key_id: i64,
    ) -> Result<Vec<(UsagePeriod, i64, PeriodUsage)>, SelectorError> {
        let now = self.clock.wall_ms();
        let calendar = self.settings.budget_calendar.as_ref();
        let mut usage = Vec::with_capacity(UsagePeriod::ALL.len());
        for period in UsagePeriod::ALL {
            let from = usage_period_start(calendar, period, now);
            // `now + 1`: the ledger's range is half-open, and a record written this millisecond
            // belongs to the answer.
            let totals = self.source.read_usage(api_key_id, from, now + 1).await?;
            usage.push((
                period,
                from,
                PeriodUsage {
                    requests: totals.requests,
                    input_tokens: totals.input_tokens,
                    output_tokens: totals.output_tokens,
                    cost_usd: totals.cost_usd,
                },
            ));
        }
        Ok(usage)
    }
}

impl Selector {
    /// Rebuilds admission's budget counters from the usage ledger (docs/DESIGN.md §4, "Client
    /// key limits"): for every key with a budget (a disabled one too: its holder may be enabled
    /// again within the period), the ledger's spend in each budgeted period of `counters`'
    /// calendar, set where the counter is absent (a flush, a restart). A counter admission still
    /// has is never touched, so a run counts nothing twice. Returns how many counters were set.
    pub async fn rebuild_budgets(
        &self,
        counters: &dyn BudgetCounters,
    ) -> Result<usize, SelectorError> {
        let keys: Vec<KeyLimits> = self
            .snapshot
            .get()
            .api_keys()
            .filter(|key| key.active)
            .map(|key| KeyLimits {
                api_key_id: key.id,
                ..key.limits.clone()
            })
            .filter(|limits| budgets(limits).any(|(_, micros)| micros > 0))
            .collect();
        if keys.is_empty() {
            return Ok(0);
        }
        let periods = counters
            .budget_periods()
            .await
            .map_err(|error| SelectorError::Unavailable(error.to_string()))?;
        let ids: Vec<i64> = keys.iter().map(|key| key.api_key_id).collect();
        // Everything recorded up to now: no record is later than the day's end.
        let to_ms = periods.day.ends_ms;
        let since = [
            0,
            periods.day.start_ms,
            periods.week.start_ms,
            periods.month.start_ms,
        ];
        let spend = self.source.spend_since(&ids, &since, to_ms).await?;
        let period_ids = [
            periods.total_id.as_str(),
            periods.day.id.as_str(),
            periods.week.id.as_str(),
            periods.month.id.as_str(),
        ];
        let mut seeded = 0;
        for key in &keys {
            let Some(spent) = spend.get(&key.api_key_id) else {
                continue;
            };
            for (index, (_, budget)) in budgets(key).enumerate() {
                if budget <= 0 {
                    continue;
                }
                let micros = total_to_micros(spent.get(index).copied().unwrap_or(0.0));
                let set = counters
                    .seed_budget(key.api_key_id, period_ids[index], micros)
                    .await
                    .map_err(|error| SelectorError::Unavailable(error.to_string()))?;
                if set {
                    seeded += 1;
                    tracing::info!(
                        api_key_id = key.api_key_id,
                        period = period_ids[index],
                        micros,
                        "budget counter rebuilt from the usage ledger"
                    );
                }
            }
        }
        Ok(seeded)
    }

    /// Runs [`Selector::rebuild_budgets`] at once and then every `interval`, until the engine is
    /// gone; and at once when Redis lost its state: every second it reads the bindings' epoch
    /// (`Bindings::kept_since_ms`, set again when missing), and a new one means a wipe
    /// (docs/DESIGN.md §3, "When Redis is wiped"), so the counters the wipe took are back within
    /// about a second, not the period. A failed run is logged and retried at the next tick.
    pub async fn rebuild_budgets_every(
        selector: Weak<Selector>,
        counters: Arc<dyn BudgetCounters>,
        interval: Duration,
    ) {
        let mut tick = tokio::time::interval(WIPE_CHECK_EVERY.min(interval));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // When the next rebuild is due: at once, then every `interval`; a failed one again after
        // `RETRY_FAILED` (not every wipe check: a Postgres that is down is not asked each second).
        let mut due_at = std::time::Instant::now();
        let mut epoch: Option<i64> = None;
        loop {
            tick.tick().await;
            let Some(selector) = selector.upgrade() else {
                return;
            };
            let read = selector
                .health
                .kept_since_ms(selector.clock.wall_ms())
                .await
                .ok();
            let wiped = matches!((epoch, read), (Some(before), Some(now)) if now != before);
            if read.is_some() {
                epoch = read;
            }
            let due = std::time::Instant::now() >= due_at;
            if !(due || wiped) {
                continue;
            }
            if wiped {
                tracing::warn!("Redis lost its state: budget counters rebuilt from the ledger now");
            }
            match selector.rebuild_budgets(counters.as_ref()).await {
                Ok(_) => due_at = std::time::Instant::now() + interval,
                Err(error) => {
                    due_at = std::time::Instant::now() + RETRY_FAILED.min(interval);
                    tracing::warn!(%error, "budget rebuild from the usage ledger failed; retrying")
                }
            }
        }
    }
}

/// How often the rebuild task looks for a wipe.
const WIPE_CHECK_EVERY: Duration = Duration::from_secs(1);
/// When a failed rebuild is tried again.
const RETRY_FAILED: Duration = Duration::from_secs(5);

/// A key's budgets in the rebuild's order: total, day, week, month.
fn budgets(limits: &KeyLimits) -> impl Iterator<Item = (&'static str, i64)> {
    [
        ("total", limits.budget_total_micros),
        ("day", limits.budget_day_micros),
        ("week", limits.budget_week_micros),
        ("month", limits.budget_month_micros),
    ]
    .into_iter()
}
