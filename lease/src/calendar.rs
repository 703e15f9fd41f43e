//! The calendar periods of client keys' spend budgets (docs/DESIGN.md §4): the day, week and
//! month that contain an instant, in the deployment's time zone and with its week start. Computed
//! here, in the engine, from Redis-derived time (never in Lua, which has no time zone database);
//! the scripts only see the period ids.
//!
//! A day is the local calendar day, so it lasts 23 or 25 hours across a DST change; a week starts
//! at local midnight of its first day; a month at local midnight of its 1st.

use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan, civil};
use poolgate_core::lease::Weekday;

/// One budget period: its id (the counter's name) and when it ends (ms since the epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Period {
    /// `d:2026-12-02`, `w:2026-11-30` (the week's first day) or `m:2026-12`.
    pub id: String,
    pub ends_ms: i64,
}

/// The day, week and month containing one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Periods {
    pub day: Period,
    pub week: Period,
    pub month: Period,
}

/// The id of the total budget's counter (it never resets).
pub const TOTAL_PERIOD: &str = "t";

/// The deployment's budget calendar.
#[derive(Debug, Clone)]
pub struct Calendar {
    zone: TimeZone,
    /// Days from Monday to the week's first day.
    week_start: i8,
}

impl Default for Calendar {
    fn default() -> Self {
        Calendar {
            zone: TimeZone::UTC,
            week_start: 0,
        }
    }
}

impl Calendar {
    /// `time_zone` is an IANA name (`Europe/Berlin`, `UTC`), read from the system's zoneinfo or
    /// the bundled database.
    pub fn new(time_zone: &str, week_start: Weekday) -> Result<Self, String> {
        let zone = TimeZone::get(time_zone)
            .map_err(|error| format!("unknown time zone {time_zone:?}: {error}"))?;
        Ok(Calendar {
            zone,
            week_start: week_start.days_from_monday() as i8,
        })
    }

    /// The periods containing `now_ms`. An instant outside the representable range (never the
    /// case for a clock reading) falls back to the epoch rather than failing a request.
    pub fn periods(&self, now_ms: i64) -> Periods {
        let now = Timestamp::from_millisecond(now_ms).unwrap_or(Timestamp::UNIX_EPOCH);
        let today = now.to_zoned_datetime(self.zone.clone()).date();
        let back = (today.weekday().to_monday_zero_offset() - self.week_start).rem_euclid(7);
        let week_start = today.checked_sub((back as i64).days()).unwrap_or(today);
        let month_start = today.first_of_month();
        Periods {
            day: Period {
                id: format!("d:{today}"),
                ends_ms: self.start_ms(today.checked_add(1.day()).unwrap_or(today)),
            },
            week: Period {
                id: format!("w:{week_start}"),
                ends_ms: self.start_ms(week_start.checked_add(1.week()).unwrap_or(week_start)),
            },
            month: Period {
                id: format!("m:{}", today.strftime("%Y-%m")),
                ends_ms: self.start_ms(month_start.checked_add(1.month()).unwrap_or(month_start)),
            },
        }
    }

    /// Local midnight of `date` (the first instant of the day: a DST gap at midnight moves it
    /// later, never skips the day).
    fn start_ms(&self, date: civil::Date) -> i64 {
        date.to_zoned_datetime(self.zone.clone())
            .map(|zoned| zoned.timestamp().as_millisecond())
            .unwrap_or(i64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> i64 {
        text.parse::<Timestamp>()
            .expect("timestamp")
            .as_millisecond()
    }

    #[test]
    fn periods_follow_the_local_calendar_and_the_week_start() {
        let berlin = Calendar::new("Europe/Berlin", Weekday::Monday).expect("zone");
        // 23:30 UTC on Tuesday 1 December is already Wednesday the 2nd in Berlin.
        let periods = berlin.periods(ms("2026-12-01T23:30:00Z"));
        assert_eq!(periods.day.id, "d:2026-12-02");
        assert_eq!(periods.day.ends_ms, ms("2026-12-02T23:00:00Z"));
        assert_eq!(periods.week.id, "w:2026-11-30");
        assert_eq!(periods.week.ends_ms, ms("2026-12-06T23:00:00Z"));
        assert_eq!(periods.month.id, "m:2026-12");
        assert_eq!(periods.month.ends_ms, ms("2026-12-31T23:00:00Z"));
        let sunday = Calendar::new("Europe/Berlin", Weekday::Sunday).expect("zone");
        assert_eq!(
            sunday.periods(ms("2026-12-01T23:30:00Z")).week.id,
            "w:2026-11-29"
        );
        let utc = Calendar::default();
        assert_eq!(
            utc.periods(ms("2026-12-01T23:30:00Z")).day.id,
            "d:2026-12-01"
        );
    }

    #[test]
    fn a_day_across_a_dst_change_is_the_local_calendar_day() {
        let berlin = Calendar::new("Europe/Berlin", Weekday::Monday).expect("zone");
        // Sunday 29 March 2026: clocks go from 02:00 to 03:00, the day has 23 hours.
        let spring = berlin.periods(ms("2026-03-29T12:00:00Z")).day;
        assert_eq!(spring.id, "d:2026-03-29");
        assert_eq!(spring.ends_ms - ms("2026-03-28T23:00:00Z"), 23 * 3_600_000);
        // Sunday 25 October 2026: 03:00 back to 02:00, 25 hours.
        let autumn = berlin.periods(ms("2026-10-25T12:00:00Z")).day;
        assert_eq!(autumn.ends_ms - ms("2026-10-24T22:00:00Z"), 25 * 3_600_000);
        assert_eq!(
            berlin.periods(ms("2026-10-25T22:59:59Z")).day.id,
            "d:2026-10-25"
        );
        assert_eq!(
            berlin.periods(ms("2026-10-25T23:00:00Z")).day.id,
            "d:2026-10-26"
        );
    }

    #[test]
    fn an_unknown_time_zone_is_refused() {
        assert!(Calendar::new("Mars/Olympus", Weekday::Monday).is_err());
    }
}
