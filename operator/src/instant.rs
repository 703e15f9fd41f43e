//! Instants as operators write them (a key's expiry, in the admin CLI's flags and the standalone
//! YAML): an RFC 3339 date-time (`2026-12-31T23:59:59Z`, `2026-12-31T18:00:00-05:00`, fractions
//! of a second allowed), a full date (`2026-12-31`: its midnight UTC) or seconds since the epoch
//! (`1798761599`). Checked strictly: a month 13 or a 31 April is an error, never rolled over.

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

/// A fixed-width decimal field of `bytes` at `at`.
fn number(bytes: &[u8], at: usize, width: usize) -> Option<i64> {
    let digits = bytes.get(at..at + width)?;
    digits.iter().try_fold(0i64, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + i64::from(b - b'0'))
    })
}

fn rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let (year, month, day) = (number(b, 0, 4)?, number(b, 5, 2)?, number(b, 8, 2)?);
    if b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') {
        return None;
    }
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    if b.len() == 10 {
        return Some(days * 86_400_000);
    }
    if !matches!(b.get(10), Some(b'T' | b't' | b' ')) {
        return None;
    }
    let (hour, minute, second) = (number(b, 11, 2)?, number(b, 14, 2)?, number(b, 17, 2)?);
    if b.get(13) != Some(&b':') || b.get(16) != Some(&b':') {
        return None;
    }
    // 60: a leap second, counted as the last second of its minute.
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut at = 19;
    let mut millis = 0;
    if b.get(at) == Some(&b'.') {
        let digits = b[at + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        // Milliseconds: the first three digits, the rest truncated.
        for i in 0..3 {
            let digit = if i < digits { b[at + 1 + i] - b'0' } else { 0 };
            millis = millis * 10 + i64::from(digit);
        }
        at += 1 + digits;
    }
    let offset_minutes = match b.get(at..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), ..] if b.len() == at + 6 && b[at + 3] == b':' => {
            let (hours, minutes) = (number(b, at + 1, 2)?, number(b, at + 4, 2)?);
            if hours > 23 || minutes > 59 {
                return None;
            }
            let offset = hours * 60 + minutes;
            if *sign == b'-' { -offset } else { offset }
        }
        _ => return None,
    };
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset_minutes * 60;
    Some(seconds * 1000 + millis)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a civil date, proleptic Gregorian (H. Hinnant's days_from_civil).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
            "2026-12-02T16:09:05+0100",
            "2026-12-02T16:09:05.Z",
            "2026-12-02T16:09Z",
            "-5",
            "99999999999999999999",
        ] {
            assert!(parse_instant(text).is_err(), "{text:?} is refused");
        }
    }
}
