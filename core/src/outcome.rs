//! What an upstream outcome does to its account (docs/DESIGN.md §1), as a pure decision that every
//! health store applies the same way ("busy is not broken").

use std::time::Duration;

use crate::{AccountId, millis};

/// The class of an upstream outcome (docs/DESIGN.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeClass {
    Success,
    Conflict,
    Busy,
    WindowExhausted,
    Broken,
    Unauthorized,
    QuotaGone,
    ClientError,
}

impl OutcomeClass {
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeClass::Success => "success",
            OutcomeClass::Conflict => "conflict",
            OutcomeClass::Busy => "busy",
            OutcomeClass::WindowExhausted => "window_exhausted",
            OutcomeClass::Broken => "broken",
            OutcomeClass::Unauthorized => "unauthorized",
            OutcomeClass::QuotaGone => "quota_gone",
            OutcomeClass::ClientError => "client_error",
        }
    }
}

/// One upstream outcome reported by the relay.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub account_id: AccountId,
    pub class: OutcomeClass,
    pub status: u16,
    /// Reset time announced by the upstream, ms since the epoch.
    pub reset_at_ms: Option<i64>,
    pub reason: String,
    /// `short_hash` of the credential the upstream refused (unauthorized outcomes), never the
    /// credential. `None`: not said (an older relay); the probe decides with the stored one.
    pub refused_fingerprint: Option<String>,
    /// No answer, and nothing of the request left the relay (DNS, TCP connect, TLS handshake):
    /// the one no-answer outcome that applies without a probe.
    pub before_send: bool,
}

impl Outcome {
    /// An outcome with nothing more than its class and status.
    pub fn new(account_id: AccountId, class: OutcomeClass, status: u16) -> Self {
        Outcome {
            account_id,
            class,
            status,
            reset_at_ms: None,
            reason: String::new(),
            refused_fingerprint: None,
            before_send: false,
        }
    }

    /// The report of an upstream answer as the relay classified it (never a local refusal):
    /// the class and reset time of `classified`, the status (0: no answer), the reason, and the
    /// fingerprint of the credential the upstream refused (`short_hash`, never the credential).
    /// `before_send` only for a connect failure without an answer (DNS, TCP, TLS): nothing of
    /// the request left the relay. Built here once, for every implementation of the selection
    /// API (the engine applies it, the gRPC client sends it).
    pub fn observed(
        account_id: AccountId,
        classified: &crate::classify::Classified,
        status: u16,
        reason: &str,
        refused: Option<&crate::account::Secret>,
    ) -> Self {
        Outcome {
            reset_at_ms: classified.reset_at_ms,
            reason: bounded_reason(reason).to_owned(),
            refused_fingerprint: refused.map(|credential| crate::short_hash(credential.expose())),
            before_send: status == 0 && classified.is_connect_failure(),
            ..Outcome::new(account_id, classified.class, status)
        }
    }
}

/// The longest reason a report carries, in bytes (the selector refuses a longer one).
pub const MAX_REASON_BYTES: usize = 512;

/// `reason` cut to [`MAX_REASON_BYTES`] at a character boundary.
pub fn bounded_reason(reason: &str) -> &str {
    if reason.len() <= MAX_REASON_BYTES {
        return reason;
    }
    let mut end = MAX_REASON_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// Durations of runtime blocks and the breaker (docs/DESIGN.md §1 and §5). All configurable.
#[derive(Debug, Clone)]
pub struct RuntimeBlockSettings {
    /// A 429 without a reset time soft-blocks for this long.
    pub busy_429: Duration,
    /// A 529 without a reset time soft-blocks for this long.
    pub busy_529: Duration,
    /// A reset further ahead than this is "window exhausted" (hard block), not "busy".
    pub hard_block_threshold: Duration,
    /// Longest hard block.
    pub max_hard_block: Duration,
    /// Hard block after a broken outcome.
    pub broken_block: Duration,
    /// Hard block after an unauthorized outcome.
    pub unauthorized_block: Duration,
    /// Unauthorized outcomes within `unauthorized_window` that mark the account `error`.
    pub unauthorized_error_count: u32,
    pub unauthorized_window: Duration,
    /// Consecutive broken outcomes that open the breaker.
    pub breaker_threshold: u32,
    /// First open period; doubled after each failed probe up to `breaker_max_open`.
    pub breaker_open: Duration,
    pub breaker_max_open: Duration,
}

impl Default for RuntimeBlockSettings {
    fn default() -> Self {
        RuntimeBlockSettings {
            busy_429: Duration::from_secs(5),
            busy_529: Duration::from_secs(30),
            hard_block_threshold: Duration::from_secs(60),
            max_hard_block: Duration::from_secs(7 * 24 * 3600),
            broken_block: Duration::from_secs(120),
            unauthorized_block: Duration::from_secs(120),
            unauthorized_error_count: 3,
            unauthorized_window: Duration::from_secs(3600),
            breaker_threshold: 5,
            breaker_open: Duration::from_secs(300),
            breaker_max_open: Duration::from_secs(3600),
        }
    }
}

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
            reset_at_ms,
            ..Outcome::new(1, class, status)
        }
    }

    #[test]
    fn an_observed_outcome_carries_a_fingerprint_and_a_reason_the_selector_accepts() {
        let refused = crate::account::Secret::new("sk-ant-oat01-secret".to_owned());
        let classified = crate::classify::Classified {
            class: OutcomeClass::Unauthorized,
            reset_at_ms: Some(5),
            label: "401",
        };
        let long = "é".repeat(MAX_REASON_BYTES);
        let outcome = Outcome::observed(7, &classified, 401, &long, Some(&refused));
        assert_eq!(outcome.account_id, 7);
        assert_eq!(outcome.reset_at_ms, Some(5));
        assert!(
            outcome.reason.len() <= MAX_REASON_BYTES,
            "{}",
            outcome.reason.len()
        );
        assert!(outcome.reason.starts_with('é'));
        let fingerprint = outcome.refused_fingerprint.expect("a fingerprint");
        assert_eq!(fingerprint, crate::short_hash("sk-ant-oat01-secret"));
        assert!(!outcome.before_send, "an answer was received");
        let connect = crate::classify::Classified {
            class: OutcomeClass::Broken,
            reset_at_ms: None,
            label: "connect",
        };
        assert!(Outcome::observed(7, &connect, 0, "", None).before_send);
        assert!(!Outcome::observed(7, &connect, 502, "", None).before_send);
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
