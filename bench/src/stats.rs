//! Latency samples and their summary (rate, nearest-rank percentiles), and the pace of an open
//! loop, written once for every bench binary.

use std::time::{Duration, Instant};

/// The latencies of one phase in microseconds, how long it ran, and the calls that failed.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub micros: Vec<u64>,
    pub elapsed: Duration,
    pub errors: u64,
}

impl Sample {
    pub fn new(micros: Vec<u64>, errors: u64, elapsed: Duration) -> Self {
        Sample {
            micros,
            elapsed,
            errors,
        }
    }

    /// Adds one worker's latencies and failures.
    pub fn add(&mut self, micros: Vec<u64>, errors: u64) {
        self.micros.extend(micros);
        self.errors += errors;
    }

    /// Successful calls per second.
    pub fn rate(&self) -> f64 {
        self.micros.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `p` quantile (0..=1) in milliseconds, nearest rank; NaN when nothing succeeded.
    pub fn percentile(&mut self, p: f64) -> f64 {
        if self.micros.is_empty() {
            return f64::NAN;
        }
        self.micros.sort_unstable();
        let index = ((self.micros.len() as f64 - 1.0) * p.clamp(0.0, 1.0)).round() as usize;
        self.micros[index] as f64 / 1000.0
    }

    /// One line of output: name, rate, p50, p99, errors.
    pub fn line(&mut self, name: &str) -> String {
        let (p50, p99) = (self.percentile(0.50), self.percentile(0.99));
        format!(
            "{name:<44} {:>10.0}/s  p50 {p50:>7.3} ms  p99 {p99:>7.3} ms  errors {}",
            self.rate(),
            self.errors
        )
    }
}

/// Sleeps until call `n` of an open loop that started at `started` and makes one call every
/// `interval` is due (at once when the loop is behind).
pub async fn pace(started: Instant, interval: Duration, n: u64) {
    let due = started + interval.mul_f64(n as f64);
    let now = Instant::now();
    if due > now {
        tokio::time::sleep(due - now).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_in_milliseconds() {
        // 1..=100 ms, shuffled.
        let micros: Vec<u64> = (1..=100).rev().map(|ms| ms * 1000).collect();
        let mut sample = Sample::new(micros, 3, Duration::from_secs(2));
        assert_eq!(sample.percentile(0.0), 1.0);
        assert_eq!(sample.percentile(0.5), 51.0);
        assert_eq!(sample.percentile(0.99), 99.0);
        assert_eq!(sample.percentile(1.0), 100.0);
        assert_eq!(sample.rate(), 50.0);
        let line = sample.line("phase");
        assert!(
            line.contains("p50  51.000 ms") && line.contains("errors 3"),
            "{line}"
        );
    }

    #[test]
    fn an_empty_sample_has_no_percentiles_and_no_rate() {
        let mut sample = Sample::default();
        assert!(sample.percentile(0.5).is_nan());
        assert_eq!(sample.rate(), 0.0);
        sample.add(vec![2_000], 1);
        assert_eq!((sample.percentile(0.99), sample.errors), (2.0, 1));
    }
}
