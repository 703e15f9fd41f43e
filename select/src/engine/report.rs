//! Outcomes (docs/DESIGN.md §1 and §5): what a report applies at once, what goes to a
//! confirmation first (`confirmations.rs`), and the bounded wait of an OAuth refusal for the
//! probe and the refresh of the refused token.

use poolgate_core::plan::Effect;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::confirmations::LockState;
use crate::health::{Breaker, BreakerChange, Health, StateError};
use crate::metrics::Metrics;
use crate::probe::Suspicion;
use poolgate_core::account::{Account, Secret};
use poolgate_core::outcome::{Decision, Outcome, RuntimeBlockSettings, decide};
use poolgate_core::short_hash;
use poolgate_core::{AccountId, millis};

use super::{Selector, SelectorError};

/// What an outcome report changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub what: Effect,
    pub block_ms: u64,
}

impl Applied {
    pub const NONE: Applied = Applied {
        what: Effect::None,
        block_ms: 0,
    };
}

/// The answer to an outcome report.
#[derive(Debug, Clone, PartialEq)]
pub enum Reported {
    Applied(Applied),
    /// A refused OAuth token that is not the stored one (any more): retry on the same account
    /// with this one. Nothing counted against the account.
    Refreshed(Secret),
}

/// How fresh a reading must be for a success to skip the breaker reset (nothing to reset).
const SUCCESS_SKIP_AGE: Duration = Duration::from_secs(1);

impl Selector {
    /// Applies an upstream outcome (docs/DESIGN.md §1 and §5); a refused OAuth token's new
    /// token shows as `refreshed` (use [`Selector::report_outcome`] to get it).
    pub async fn report(&self, outcome: &Outcome) -> Result<Applied, SelectorError> {
        Ok(match self.report_outcome(outcome).await? {
            Reported::Applied(applied) => applied,
            Reported::Refreshed(_) => Applied {
                what: Effect::Refreshed,
                block_ms: 0,
            },
        })
    }

    /// Applies an upstream outcome (docs/DESIGN.md §1 and §5). Every write that can take the
    /// account out of service needs evidence the client cannot shape (docs/SECURITY.md,
    /// "Health writes"): answers that may depend on the request go to the probe first.
    pub async fn report_outcome(&self, outcome: &Outcome) -> Result<Reported, SelectorError> {
        let snapshot = self.snapshot.get();
        let account = snapshot
            .account(outcome.account_id)
            .ok_or_else(|| {
                SelectorError::NotFound(format!("unknown account {}", outcome.account_id))
            })?
            .clone();
        let blocks = &self.settings.blocks;
        let class = outcome.class.as_str();
        let unavailable = |e: StateError| SelectorError::Unavailable(e.to_string());
        let applied = match decide(outcome, blocks, self.clock.wall_ms()) {
            Decision::Success
                if self
                    .load_cache
                    .latest(account.id, SUCCESS_SKIP_AGE)
                    .is_some_and(|h| h.failures == 0 && h.breaker == Breaker::Closed) =>
            {
                // Nothing to reset: a closed breaker with no failures counted. Saves a round trip
                // on the hot path (most outcomes are successes).
                Applied::NONE
            }
            Decision::Success => {
                self.load_cache.note(account.id, |h| {
                    h.failures = 0;
                    h.breaker = Breaker::Closed;
                });
                let was_open = self
                    .health
                    .breaker_success(account.id)
                    .await
                    .map_err(unavailable)?;
                if was_open {
                    self.metrics
                        .breaker_changes
                        .with_label_values(&["closed"])
                        .inc();
                    Applied {
                        what: Effect::BreakerClosed,
                        block_ms: 0,
                    }
                } else {
                    Applied::NONE
                }
            }
            Decision::Nothing => Applied::NONE,
            Decision::SoftBlock { ms } => {
                let left = self
                    .health
                    .soft_block(account.id, ms, class, outcome.status, &outcome.reason)
                    .await
                    .map_err(unavailable)?;
                Applied {
                    what: Effect::SoftBlock,
                    block_ms: left,
                }
            }
            Decision::HardBlock { ms } => {
                // The upstream's rate-limit headers assert an exhausted window.
                let left = self
                    .health
                    .hard_block(account.id, ms, class, outcome.status, &outcome.reason)
                    .await
                    .map_err(unavailable)?;
                Applied {
                    what: Effect::HardBlock,
                    block_ms: left,
                }
            }
            Decision::Broken { ms } if outcome.status == 0 && outcome.before_send => {
                // The connection failed before any byte of the request left: nothing the
                // client sent shaped that.
                self.load_cache.note(account.id, |h| h.failures += 1);
                apply_broken(
                    self.health.as_ref(),
                    &self.metrics,
                    blocks,
                    account.id,
                    ms,
                    outcome.status,
                    &outcome.reason,
                )
                .await
                .map_err(unavailable)?
            }
            Decision::Broken { .. } => {
                // An answer, or none after the request started: either may depend on the
                // request (a crafted one can make an upstream fail or time out), so the probe
                // confirms it first.
                self.confirm(account, outcome.status, Suspicion::Broken)
                    .await
                    .map_err(unavailable)?
            }
            Decision::Unauthorized { .. } => {
                let reported = self.refused(account, outcome).await?;
                let what = match &reported {
                    Reported::Applied(applied) => applied.what,
                    Reported::Refreshed(_) => Effect::Refreshed,
                };
                self.metrics
                    .outcomes
                    .with_label_values(&[class, what.as_str()])
                    .inc();
                if !matches!(what, Effect::None | Effect::Refreshed) {
                    self.view_changed();
                }
                return Ok(reported);
            }
            Decision::Confirm => self
                .confirm(account, outcome.status, Suspicion::QuotaGone)
                .await
                .map_err(unavailable)?,
        };
        if matches!(
            applied.what,
            Effect::SoftBlock | Effect::HardBlock | Effect::BreakerOpen
        ) {
            // Not served from a stale reading on this replica (load_cache.rs).
            self.load_cache.wrote(outcome.account_id);
        }
        if applied.what != Effect::None {
            // The relays selecting at the edge hear it now (`view.rs`).
            self.view_changed();
        }
        self.metrics
            .outcomes
            .with_label_values(&[class, applied.what.as_str()])
            .inc();
        Ok(Reported::Applied(applied))
    }

    /// Starts a confirmation (`confirmations.rs`): `confirming` with the block it set, or
    /// `none` when one is running or the account is quiet.
    async fn confirm(
        &self,
        account: Arc<Account>,
        status: u16,
        suspicion: Suspicion,
    ) -> Result<Applied, StateError> {
        if !self.confirmations.start(account, status, suspicion).await? {
            return Ok(Applied::NONE);
        }
        self.load_cache.invalidate();
        Ok(Applied {
            what: Effect::Confirming,
            block_ms: millis(self.settings.probe.block),
        })
    }

    /// An upstream refused the account's credential (or a 401/403 said neither request nor
    /// credential). Nothing counts until the probe bears it out with the stored credential.
    /// For an OAuth account, a refusal of a token that is no longer the stored one gets the
    /// stored one; a token past its recorded expiry is refreshed at once (the clock is
    /// evidence); any other refusal waits (bounded) for the probe, and for the refresh a
    /// refused probe leads to, so concurrent refusals of one token spend one refresh.
    async fn refused(
        &self,
        account: Arc<Account>,
        outcome: &Outcome,
    ) -> Result<Reported, SelectorError> {
        let unavailable = |e: StateError| SelectorError::Unavailable(e.to_string());
        let id = account.id;
        if !account.credential_kind.is_oauth() {
            let applied = self
                .confirm(account, outcome.status, Suspicion::Unauthorized)
                .await
                .map_err(unavailable)?;
            return Ok(Reported::Applied(applied));
        }
        let stored = Arc::new(self.source.load_account(id).await?);
        let refused = outcome
            .refused_fingerprint
            .clone()
            .unwrap_or_else(|| short_hash(stored.credential.expose()));
        if stored
            .oauth
            .as_ref()
            .is_some_and(|oauth| oauth.expires_at_ms <= self.clock.wall_ms())
            && short_hash(stored.credential.expose()) == refused
            && let Some(fresh) = self.refresh_expired(&stored).await
        {
            return Ok(Reported::Refreshed(fresh));
        }
        // A wait, on Tokio's timer (core/src/clock.rs: the clock does not sleep).
        let deadline = Instant::now() + self.settings.probe.refusal_wait;
        loop {
            // Registered before the state is read, so an ending in between is not missed.
            let ended = self.confirmations.ended.notified();
            let state = self
                .health
                .confirm_state(id)
                .await
                .map_err(unavailable)?
                .map(|value| (LockState::parse(&value), value));
            // The account is read after the lock: a confirmation that ended before the read has
            // stored its refresh by then (read before it, a refresh landing in between looked
            // like no confirmation at all, and a second one was started with the old token).
            let stored = Arc::new(self.source.load_account(id).await?);
            if short_hash(stored.credential.expose()) != refused && !stored.credential.is_empty() {
                // Refreshed away (before this report, or by the confirmation it waited for).
                return Ok(Reported::Refreshed(stored.credential.clone()));
            }
            match state {
                None => {
                    let health = self.health.read_one(id).await.map_err(unavailable)?;
                    if health.hard_block_ms == 0 {
                        self.confirm(stored.clone(), outcome.status, Suspicion::Unauthorized)
                            .await
                            .map_err(unavailable)?;
                    } else if self
                        .health
                        .confirm_state(id)
                        .await
                        .map_err(unavailable)?
                        .is_none()
                    {
                        // A verdict blocked it (or something else did): fail over. (A block
                        // seen while the lock is held again is that confirmation's own: wait.)
                        return Ok(Reported::Applied(Applied {
                            what: Effect::HardBlock,
                            block_ms: health.hard_block_ms,
                        }));
                    }
                }
                // The probe found the stored token good: this refusal was the request's.
                Some((LockState::Quiet, _)) => return Ok(Reported::Applied(Applied::NONE)),
                Some((LockState::Fresh { fingerprint }, value)) if fingerprint == refused => {
                    // The token refreshed moments ago is refused too: probe it; no second
                    // refresh.
                    if self
                        .confirmations
                        .start_after_refresh(stored.clone(), outcome.status, &value)
                        .await
                        .map_err(unavailable)?
                    {
                        self.load_cache.invalidate();
                    }
                }
                Some((LockState::Fresh { .. } | LockState::Running, _)) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Still confirming: the request fails over; the verdict applies when it comes.
                return Ok(Reported::Applied(Applied {
                    what: Effect::Confirming,
                    block_ms: 0,
                }));
            }
            let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), ended).await;
        }
    }

    /// Refreshes a token past its recorded expiry, once cluster-wide: the new token, or `None`
    /// when there is none to be had (the refusal then goes to the probe).
    async fn refresh_expired(&self, stored: &Account) -> Option<Secret> {
        let refresher = self.confirmations.refresher.get()?;
        match refresher
            .refresh_refused(stored.id, &stored.credential)
            .await
        {
            Ok(
                crate::refresh::RefreshResult::Refreshed | crate::refresh::RefreshResult::Waited,
            ) => {
                let fresh = self.source.load_account(stored.id).await.ok()?.credential;
                (fresh != stored.credential && !fresh.is_empty()).then_some(fresh)
            }
            Ok(crate::refresh::RefreshResult::NotNeeded) => None,
            Err(error) => {
                tracing::warn!(account_id = stored.id, %error, "refresh of an expired token failed");
                None
            }
        }
    }
}

/// A broken outcome: a hard block, and one more count toward the breaker.
pub(crate) async fn apply_broken(
    health: &dyn Health,
    metrics: &Metrics,
    blocks: &RuntimeBlockSettings,
    id: AccountId,
    block_ms: u64,
    status: u16,
    reason: &str,
) -> Result<Applied, StateError> {
    let left = health
        .hard_block(id, block_ms, "broken", status, reason)
        .await?;
    let change = health
        .breaker_failure(
            id,
            blocks.breaker_threshold,
            millis(blocks.breaker_open),
            millis(blocks.breaker_max_open),
        )
        .await?;
    Ok(match change {
        BreakerChange::Opened(ms) | BreakerChange::Reopened(ms) => {
            let label = if matches!(change, BreakerChange::Opened(_)) {
                "opened"
            } else {
                "reopened"
            };
            metrics.breaker_changes.with_label_values(&[label]).inc();
            tracing::warn!(account_id = id, open_ms = ms, "circuit breaker opened");
            Applied {
                what: Effect::BreakerOpen,
                block_ms: ms,
            }
        }
        _ => Applied {
            what: Effect::HardBlock,
            block_ms: left,
        },
    })
}
