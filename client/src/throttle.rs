//! A repeated warning let through once per period, with a count of what it held back.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Lets a repeated warning through at most once per `every` and counts what it held back, so an
/// outage behind the selector does not write one log line per request.
pub(super) struct Throttle {
    every: Duration,
    last: Mutex<Option<tokio::time::Instant>>,
    held_back: AtomicU64,
}

impl Throttle {
    pub(super) fn new(every: Duration) -> Self {
        Throttle {
            every,
            last: Mutex::new(None),
            held_back: AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last one)` when this occurrence may be logged.
    pub(super) fn allow(&self) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = tokio::time::Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < self.every) {
            self.held_back.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.held_back.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_throttled_warning_passes_once_per_period_and_counts_the_rest() {
        let throttle = Throttle::new(Duration::from_millis(50));
        assert_eq!(throttle.allow(), Some(0));
        assert_eq!(throttle.allow(), None);
        assert_eq!(throttle.allow(), None);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(throttle.allow(), Some(2), "the two held back are reported");
        assert_eq!(throttle.allow(), None);
    }
}
