//! What an upstream outcome does to its account (DESIGN §1), as a pure decision that every
//! health store applies the same way ("busy is not broken").

use crate::domain::{Outcome, OutcomeClass, RuntimeBlockSettings, millis};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Not the account's fault (conflict, client error): nothing changes.
    Nothing,
    /// Success: close the breaker, reset its count.
    Success,
    /// Busy: reorder only, for this long. Never a hard block, never the breaker.
    SoftBlock { ms: u64 },
    /// Window exhausted: exclude until the reset (capped).
    HardBlock { ms: u64 },
    /// Broken: hard block, and one more count toward the breaker.
    Broken { ms: u64 },
    /// Unauthorized: hard block, count it (too many: `error`), refresh the token.
    Unauthorized { ms: u64 },
    /// Billing-class answer: confirm it with the selector's own probe; retire only if the
    /// probe gets the same class of answer (`confirm.rs`). Never a retirement by itself.
    Confirm,
}

/// Decides; `now_ms` is the clock upstream reset times are compared with.
pub fn decide(outcome: &Outcome, blocks: &RuntimeBlockSettings, now_ms: i64) -> Decision {
    let reset_in = outcome
        .reset_at_ms
        .map(|at| at.saturating_sub(now_ms).max(0) as u64)
        .filter(|ms| *ms > 0);
    match outcome.class {
        OutcomeClass::Success => Decision::Success,
        OutcomeClass::Conflict | OutcomeClass::ClientError => Decision::Nothing,
        OutcomeClass::Busy => {
            let default = if outcome.status == 529 {
                blocks.busy_529
            } else {
                blocks.busy_429
            };
            Decision::SoftBlock {
                ms: reset_in
                    .unwrap_or(millis(default))
                    .min(millis(blocks.hard_block_threshold)),
            }
        }
        OutcomeClass::WindowExhausted => Decision::HardBlock {
            ms: reset_in
                .unwrap_or(millis(blocks.hard_block_threshold))
                .min(millis(blocks.max_hard_block)),
        },
        OutcomeClass::Broken => Decision::Broken {
            ms: millis(blocks.broken_block),
        },
        OutcomeClass::Unauthorized => Decision::Unauthorized {
            ms: millis(blocks.unauthorized_block),
        },
        OutcomeClass::QuotaGone => Decision::Confirm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(class: OutcomeClass, status: u16, reset_at_ms: Option<i64>) -> Outcome {
        Outcome {
            account_id: 1,
            class,
            status,
            reset_at_ms,
            reason: String::new(),
        }
    }

    #[test]
    fn busy_is_a_short_soft_block_whatever_the_reset() {
        let blocks = RuntimeBlockSettings::default();
        assert_eq!(
            decide(&outcome(OutcomeClass::Busy, 429, None), &blocks, 0),
            Decision::SoftBlock { ms: 5_000 }
        );
        assert_eq!(
            decide(&outcome(OutcomeClass::Busy, 529, None), &blocks, 0),
            Decision::SoftBlock { ms: 30_000 }
        );
        assert_eq!(
            decide(
                &outcome(OutcomeClass::Busy, 429, Some(12_000)),
                &blocks,
                2_000
            ),
            Decision::SoftBlock { ms: 10_000 }
        );
        assert_eq!(
            decide(
                &outcome(OutcomeClass::Busy, 429, Some(10_000_000)),
                &blocks,
                0
            ),
            Decision::SoftBlock { ms: 60_000 },
            "a busy outcome never becomes a hard block"
        );
    }

    #[test]
    fn window_exhausted_blocks_until_the_reset_capped() {
        let blocks = RuntimeBlockSettings::default();
        let two_hours = 2 * 3600 * 1000;
        assert_eq!(
            decide(
                &outcome(OutcomeClass::WindowExhausted, 429, Some(two_hours)),
                &blocks,
                0
            ),
            Decision::HardBlock {
                ms: two_hours as u64
            }
        );
        assert_eq!(
            decide(
                &outcome(OutcomeClass::WindowExhausted, 429, Some(i64::MAX / 2)),
                &blocks,
                0
            ),
            Decision::HardBlock {
                ms: 7 * 24 * 3600 * 1000
            }
        );
    }
}
