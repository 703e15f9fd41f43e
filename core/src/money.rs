//! Money: spend is kept in micro-USD so Redis can add it with `HINCRBY` and no rounding drift.

/// Micro-USD per USD.
pub const MICROS_PER_USD: f64 = 1_000_000.0;

/// Largest spend accepted in one record (a sanity bound, not a business limit).
pub const MAX_SPEND_USD: f64 = 1_000_000.0;

/// Converts a USD amount to micro-USD, rejecting what cannot be spend.
pub fn usd_to_micros(usd: f64) -> Option<i64> {
    (usd.is_finite() && (0.0..=MAX_SPEND_USD).contains(&usd))
        .then(|| (usd * MICROS_PER_USD).round() as i64)
}

pub fn micros_to_usd(micros: i64) -> f64 {
    micros as f64 / MICROS_PER_USD
}

/// A sum of recorded spend in USD (a ledger's total) as micro-USD: never negative, and a sum past
/// what `i64` holds saturates rather than wrapping to a small one. For one spend or a limit read
/// from input, [`usd_to_micros`] (which refuses what is not an amount).
pub fn total_to_micros(usd: f64) -> i64 {
    if usd.is_nan() || usd <= 0.0 {
        return 0;
    }
    // `as` saturates at i64::MAX for an infinite or huge value.
    (usd * MICROS_PER_USD).round() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spend_must_be_finite_and_non_negative() {
        assert_eq!(usd_to_micros(1.5), Some(1_500_000));
        assert_eq!(usd_to_micros(-0.1), None);
        assert_eq!(usd_to_micros(f64::NAN), None);
        assert_eq!(usd_to_micros(f64::INFINITY), None);
        assert_eq!(usd_to_micros(MAX_SPEND_USD + 1.0), None);
    }

    #[test]
    fn a_total_is_never_negative_and_saturates() {
        assert_eq!(total_to_micros(1.25), 1_250_000);
        assert_eq!(total_to_micros(-1.0), 0);
        assert_eq!(total_to_micros(f64::NAN), 0);
        assert_eq!(total_to_micros(f64::INFINITY), i64::MAX);
        assert_eq!(total_to_micros(1e300), i64::MAX);
    }
}
