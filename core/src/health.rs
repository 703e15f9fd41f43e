//! An account's live state as selection reads it (the health stores fill it in), and the one
//! status an operator sees it as (`LiveStatus`: the status page, `selector_accounts`, the alerts).

use crate::account::AccountStatus;

/// Breaker state as selection sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breaker {
    Closed,
    /// Open for this many more ms.
    Open(u64),
    /// The open period ended: one probe may go through.
    HalfOpen,
}

/// One account's live state, read in one pipelined batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccountHealth {
    /// Live leases; `None` when unknown (last known blocks kept through a Redis outage).
    pub inflight: Option<u32>,
    /// Remaining hard block, ms (0: none).
    pub hard_block_ms: u64,
    /// Remaining soft block, ms (0: none).
    pub soft_block_ms: u64,
    pub breaker: Breaker,
    /// Consecutive broken outcomes counted toward the breaker.
    pub failures: u32,
}

impl AccountHealth {
    pub const HEALTHY: AccountHealth = AccountHealth {
        inflight: Some(0),
        hard_block_ms: 0,
        soft_block_ms: 0,
        breaker: Breaker::Closed,
        failures: 0,
    };
}

/// The reason a "confirming" hard block carries starts with this word and a space (the
/// confirmation's lock owner follows): the selector's health stores write it, and the operator's
/// `blocks` shows it.
pub const CONFIRMING_REASON_PREFIX: &str = "confirming ";

/// Whether a hard block's reason names a running confirmation (see
/// [`CONFIRMING_REASON_PREFIX`]).
pub fn is_confirming_reason(reason: &str) -> bool {
    reason.starts_with(CONFIRMING_REASON_PREFIX)
}

/// What an operator sees an account as, most important first: one label for the status page,
/// the `selector_accounts{status}` gauge and the alerts, from what the engine already reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LiveStatus {
    Active,
    Disabled,
    SoftBlocked,
    HardBlocked,
    Confirming,
    BreakerOpen,
    Retired,
    Error,
}

impl LiveStatus {
    /// Every status, in label order (the gauge pre-initialises each for every group).
    pub const ALL: [LiveStatus; 8] = [
        LiveStatus::Active,
        LiveStatus::Disabled,
        LiveStatus::SoftBlocked,
        LiveStatus::HardBlocked,
        LiveStatus::Confirming,
        LiveStatus::BreakerOpen,
        LiveStatus::Retired,
        LiveStatus::Error,
    ];

    /// The status's label (metric label value and the status page's text).
    pub fn label(self) -> &'static str {
        match self {
            LiveStatus::Active => "active",
            LiveStatus::Disabled => "disabled",
            LiveStatus::SoftBlocked => "soft_blocked",
            LiveStatus::HardBlocked => "hard_blocked",
            LiveStatus::Confirming => "confirming",
            LiveStatus::BreakerOpen => "breaker_open",
            LiveStatus::Retired => "retired",
            LiveStatus::Error => "error",
        }
    }

    /// From the stored status, the live health, and whether a confirmation block is on it
    /// (a hard block whose reason [`is_confirming_reason`]). The stored status wins (`retired`,
    /// `error`, `disabled`: out of service whatever the live state), then `confirming`, a hard
    /// block, an open breaker (a half-open one lets a probe through: not open), a soft block,
    /// else `active`.
    pub fn of(status: AccountStatus, health: &AccountHealth, confirming: bool) -> LiveStatus {
        match status {
            AccountStatus::Retired => return LiveStatus::Retired,
            AccountStatus::Error => return LiveStatus::Error,
            AccountStatus::Disabled => return LiveStatus::Disabled,
            AccountStatus::Active => {}
        }
        if confirming {
            LiveStatus::Confirming
        } else if health.hard_block_ms > 0 {
            LiveStatus::HardBlocked
        } else if matches!(health.breaker, Breaker::Open(_)) {
            LiveStatus::BreakerOpen
        } else if health.soft_block_ms > 0 {
            LiveStatus::SoftBlocked
        } else {
            LiveStatus::Active
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(hard: u64, soft: u64, breaker: Breaker) -> AccountHealth {
        AccountHealth {
            hard_block_ms: hard,
            soft_block_ms: soft,
            breaker,
            ..AccountHealth::HEALTHY
        }
    }

    #[test]
    fn stored_status_wins_over_every_live_state() {
        let worst = health(5_000, 5_000, Breaker::Open(5_000));
        for (stored, live) in [
            (AccountStatus::Retired, LiveStatus::Retired),
            (AccountStatus::Error, LiveStatus::Error),
            (AccountStatus::Disabled, LiveStatus::Disabled),
        ] {
            assert_eq!(LiveStatus::of(stored, &worst, true), live);
            assert_eq!(LiveStatus::of(stored, &AccountHealth::HEALTHY, false), live);
        }
    }

    #[test]
    fn live_states_in_precedence_order() {
        let active = AccountStatus::Active;
        let all = health(5_000, 5_000, Breaker::Open(5_000));
        assert_eq!(LiveStatus::of(active, &all, true), LiveStatus::Confirming);
        assert_eq!(LiveStatus::of(active, &all, false), LiveStatus::HardBlocked);
        let no_hard = health(0, 5_000, Breaker::Open(5_000));
        assert_eq!(
            LiveStatus::of(active, &no_hard, false),
            LiveStatus::BreakerOpen
        );
        let soft = health(0, 5_000, Breaker::HalfOpen);
        assert_eq!(
            LiveStatus::of(active, &soft, false),
            LiveStatus::SoftBlocked
        );
        let half_open = health(0, 0, Breaker::HalfOpen);
        assert_eq!(
            LiveStatus::of(active, &half_open, false),
            LiveStatus::Active
        );
        assert_eq!(
            LiveStatus::of(active, &AccountHealth::HEALTHY, false),
            LiveStatus::Active
        );
    }

    #[test]
    fn labels_are_distinct_and_snake_case() {
        let labels: std::collections::HashSet<_> =
            LiveStatus::ALL.iter().map(|s| s.label()).collect();
        assert_eq!(labels.len(), LiveStatus::ALL.len());
        assert!(
            labels
                .iter()
                .all(|l| l.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        );
        assert!(is_confirming_reason("confirming run:00ff"));
        assert!(!is_confirming_reason("rate_limited"));
    }
}
