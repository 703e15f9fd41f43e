//! What a wrong admin token costs its sender: a fixed delay before the refusal, and a cap on
//! refusals waiting at once, beyond which the same refusal comes at once (a flood holds no more
//! than the cap of timers). Never a lockout: the right token passes whatever else is going on —
//! on loopback every source is 127.0.0.1, so nothing here is keyed by address.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

/// The delay of a refused attempt.
pub const REFUSAL_DELAY: Duration = Duration::from_millis(250);

/// Refused attempts that may wait out their delay at once.
pub const MAX_DELAYED_REFUSALS: usize = 8;

#[derive(Debug, Clone)]
pub struct FailedAttempts {
    delay: Duration,
    waiting: Arc<Semaphore>,
}

impl Default for FailedAttempts {
    fn default() -> Self {
        FailedAttempts::new(REFUSAL_DELAY, MAX_DELAYED_REFUSALS)
    }
}

impl FailedAttempts {
    pub fn new(delay: Duration, max_delayed: usize) -> Self {
        FailedAttempts {
            delay,
            waiting: Arc::new(Semaphore::new(max_delayed)),
        }
    }

    /// Awaited before answering a refused attempt: the delay, or nothing when the cap of
    /// delayed refusals is reached.
    pub async fn refused(&self) {
        if let Ok(_slot) = self.waiting.try_acquire() {
            tokio::time::sleep(self.delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const DELAY: Duration = Duration::from_millis(200);

    async fn timed(failed: &FailedAttempts) -> Duration {
        let started = Instant::now();
        failed.refused().await;
        started.elapsed()
    }

    #[tokio::test]
    async fn a_refusal_waits_the_delay_and_past_the_cap_answers_at_once() {
        let failed = FailedAttempts::new(DELAY, 2);
        assert!(timed(&failed).await >= DELAY);
        let (a, b, c) = tokio::join!(timed(&failed), timed(&failed), timed(&failed));
        let mut waited = [a, b, c];
        waited.sort();
        assert!(waited[0] < DELAY / 2, "past the cap: at once ({waited:?})");
        assert!(waited[1] >= DELAY && waited[2] >= DELAY, "{waited:?}");
        // The slots come back: the next refusal waits again.
        assert!(timed(&failed).await >= DELAY);
    }
}
