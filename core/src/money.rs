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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spend_must_be_finite_and_non_negative() {
        assert_eq!(usd_to_micros(1.5), Some(1_500_000));
        assert_eq!(usd_to_micros(-0.1), None);
        assert_eq!(usd_to_micros(f64::NAN), None);
        assert_eq!(usd_to_micros(f64::INFINITY), None);
    }
}
