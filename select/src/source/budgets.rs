//! The usage ledger as the ground truth of client keys' spend budgets (docs/DESIGN.md §4,
//! "Client key limits"): admission counts each budget in a counter of its own (Redis, or the
//! memory store), and a counter lost to a flush or a restart is rebuilt from the ledger, so
//! neither resets a budget. This module holds what the rebuild needs of the lease engine (the
//! [`BudgetCounters`] port each composition root wires to its `poolgate-lease` engine) and the
//! calendar arithmetic it shares; `Selector::rebuild_budgets` runs it.

use poolgate_core::keys::UsagePeriod;

pub use poolgate_core::keys::{MAX_STEPS, STEP_MS, period_start};
pub use poolgate_runtime::ports::{BudgetCalendar, BudgetCounters, BudgetPeriod, BudgetPeriods};

/// When `calendar`'s `period` containing `now_ms` began, ms since the epoch (`Total`: 0).
pub fn usage_period_start(calendar: &dyn BudgetCalendar, period: UsagePeriod, now_ms: i64) -> i64 {
    if period == UsagePeriod::Total {
        return 0;
    }
    let (_, ends_ms) = calendar.period_at(period, now_ms);
    period_start(ends_ms, |instant| calendar.period_at(period, instant))
}

/// The default calendar: UTC, weeks from Monday (`UsagePeriod::start_ms`'s).
#[derive(Debug, Clone, Copy, Default)]
pub struct UtcCalendar;

impl BudgetCalendar for UtcCalendar {
    fn period_at(&self, period: UsagePeriod, instant_ms: i64) -> (String, i64) {
        const DAY_MS: i64 = 86_400_000;
        let start = period.start_ms(instant_ms);
        let ends = match period {
            UsagePeriod::Day => start + DAY_MS,
            UsagePeriod::Week => start + 7 * DAY_MS,
            // 32 days on is always in the next month.
            UsagePeriod::Month => UsagePeriod::Month.start_ms(start + 32 * DAY_MS),
            UsagePeriod::Total => i64::MAX,
        };
        (start.to_string(), ends)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy calendar of days of `day_ms`, the `n`th named `d:n`, with one 23-hour day (day
    /// 10) to show a start is not an end minus a fixed length.
    fn days(instant: i64) -> (String, i64) {
        const H: i64 = STEP_MS;
        let ends = |n: i64| {
            if n < 10 {
                (n + 1) * 24 * H
            } else {
                (n + 1) * 24 * H - H
            }
        };
        let mut n = 0;
        while ends(n) <= instant {
            n += 1;
        }
        (format!("d:{n}"), ends(n))
    }

    #[test]
    fn a_periods_start_is_the_end_of_the_one_before_it() {
        const H: i64 = STEP_MS;
        // Day 3 spans [72h, 96h).
        assert_eq!(period_start(96 * H, days), 72 * H);
        // Day 11 follows the 23-hour day 10, which ended at 263h.
        assert_eq!(days(264 * H), ("d:11".to_owned(), 287 * H));
        assert_eq!(period_start(287 * H, days), 263 * H);
        assert_eq!(period_start(263 * H, days), 240 * H);
    }

    #[test]
    fn a_period_without_a_start_in_reach_counts_from_the_earliest_instant_looked_at() {
        let forever = |_: i64| ("t".to_owned(), i64::MAX);
        assert_eq!(
            period_start(1_000 * STEP_MS, forever),
            1_000 * STEP_MS - 1 - MAX_STEPS * STEP_MS
        );
    }

    #[test]
    fn the_utc_calendar_starts_its_periods_where_usage_period_does() {
        // Wednesday 2026-12-02 13:00 UTC.
        let now = 1_796_216_400_000;
        for period in UsagePeriod::ALL {
            assert_eq!(
                usage_period_start(&UtcCalendar, period, now),
                period.start_ms(now),
                "{period:?}"
            );
        }
    }
}
