//! Instants as operators write them (a key's expiry, in the admin CLI's flags and the standalone
//! YAML): an RFC 3339 date-time (`2026-12-31T23:59:59Z`, `2026-12-31T18:00:00-05:00`, fractions
//! of a second allowed), a full date (`2026-12-31`: its midnight UTC) or seconds since the epoch
//! (`1798761599`). Read by jiff, as the selector reads the upstreams' resets, so both agree on
//! which days exist: a month 13 or a 31 April is an error, never rolled over.

/// `text` as ms since the epoch; the error says what is wrong (never echoing more than `text`).
pub fn parse_instant(text: &str) -> Result<i64, String> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<i64>()
            .ok()
            .and_then(|seconds| seconds.checked_mul(1000))
            .ok_or_else(|| format!("{text:?}: seconds since the epoch out of range"));
    }
    rfc3339(text).ok_or_else(|| {
        format!(
            "{text:?} is not an instant: write an RFC 3339 time (2026-12-31T23:59:59Z), a date \
             (2026-12-31, midnight UTC) or seconds since the epoch"
        )
    })
}

/// An RFC 3339 date-time with its offset, or a date alone (its midnight UTC), read by jiff (the
/// parser the selector reads the upstreams' resets with, so both agree on which days exist).
fn rfc3339(text: &str) -> Option<i64> {
    if let Ok(at) = text.parse::<jiff::Timestamp>() {
        return Some(at.as_millisecond());
    }
    // A date alone, exactly: a date-time without an offset names no instant.
    if text.len() != 10 {
        return None;
    }
    let date: jiff::civil::Date = text.parse().ok()?;
    let midnight = date.to_zoned_datetime(jiff::tz::TimeZone::UTC).ok()?;
    Some(midnight.timestamp().as_millisecond())
}

#[cfg(test)]
mod tests {
    use super::*;
    use poolgate_core::keys::rfc3339_utc;

    #[test]
    fn rfc3339_times_dates_and_epoch_seconds_are_read_and_round_trip_with_the_printed_form() {
        for (text, ms) in [
            ("1970-01-01T00:00:00Z", 0),
            ("2026-12-02T16:09:05Z", 1_796_227_745_000),
            ("2026-12-02t16:09:05z", 1_796_227_745_000),
            ("2026-12-02 16:09:05Z", 1_796_227_745_000),
            ("2026-12-02T11:09:05-05:00", 1_796_227_745_000),
            ("2026-12-02T17:39:05+01:30", 1_796_227_745_000),
            ("2026-12-02T16:09:05.25Z", 1_796_227_745_250),
            ("2026-12-02T16:09:05.123456Z", 1_796_227_745_123),
            ("2000-02-29T00:00:00Z", 951_782_400_000),
            ("2000-02-29", 951_782_400_000),
            ("1796227745", 1_796_227_745_000),
            (" 2026-12-02T16:09:05Z\n", 1_796_227_745_000),
            // What ISO 8601 (and jiff) also read: an offset without its colon, a time without
            // its seconds.
            ("2026-12-02T17:09:05+0100", 1_796_227_745_000),
            ("2026-12-02T16:09Z", 1_796_227_740_000),
        ] {
            assert_eq!(parse_instant(text), Ok(ms), "{text:?}");
        }
        for ms in [0, 951_782_400_000, 1_796_227_745_000, 4_102_444_800_000] {
            assert_eq!(parse_instant(&rfc3339_utc(ms)), Ok(ms));
        }
    }

    #[test]
    fn an_instant_that_does_not_exist_or_is_not_one_is_refused() {
        for text in [
            "",
            "tomorrow",
            "2026-13-01",
            "2026-04-31",
            "2026-02-29",
            "2026-12-02T24:00:00Z",
            "2026-12-02T16:60:00Z",
            "2026-12-02T16:09:05",
            "2026-12-02T16:09:05.Z",
            "-5",
            "99999999999999999999",
        ] {
            assert!(parse_instant(text).is_err(), "{text:?} is refused");
        }
    }
}
