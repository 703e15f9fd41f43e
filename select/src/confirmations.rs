//! Confirmations: the one place an answer a client's request may have shaped turns into a write
//! that takes an account out of service (docs/SECURITY.md, "Health writes"). A suspicious
//! outcome (a 5xx, no answer after the request started, a billing-class answer, a credential
//! refusal) takes the account's cluster-wide confirmation lock, hard-blocks it "confirming" (at
//! most `probe.block`, lifted on any verdict) and sends the selector's own probe
//! (`probe.rs`) with the credential read from the account source. The probe's answer then
//! applies **by its own class**, whatever was suspected: a 5xx confirmation whose probe gets a
//! 401 is a credential refusal.
//!
//! The lock's value says what state the account is in, for reports that arrive meanwhile:
//! - `run:<owner>`: a probe (or its retries, or the refresh after it) is running;
//! - `quiet:<owner>`: the probe found the account fine; suspicious answers start nothing
//!   until the lock lapses (`probe.quiet_after_unconfirmed`);
//! - `fresh:<fingerprint>:<owner>`: the token was just refreshed (to the one with that
//!   fingerprint); a refusal of *that* token is probed, and a refused probe then blocks and
//!   counts instead of refreshing again (`probe.refresh_floor`).
//!
//! A credential refusal of an OAuth account is confirmed by the usage endpoint its CLI reads
//! (`usage_endpoint.rs`), not by inference: a 200 proves the credential (and its windows are
//! kept), a refusal is the credential's (refreshed once per floor as below), a 429, 5xx or no
//! answer changes nothing (the account stays, quiet). An account whose credential cannot read a
//! usage endpoint (an API key; a 404 at its base) keeps the inference probe, as do the other
//! suspicions (5xx, billing), which only inference can bear out.

use poolgate_core::plan::Effect;
use std::sync::{Arc, OnceLock};

use poolgate_core::outcome::{Decision, decide};
use poolgate_core::short_hash;
use poolgate_runtime::ports::ProbeLeases;
use tokio::sync::Notify;

use crate::engine::{Applied, apply_broken};
use crate::health::{Health, HealthStore, StateError};
use crate::metrics::Metrics;
use crate::probe::{ProbeSettings, Probed, Suspicion, probe_under_lease};
use crate::refresh::{RefreshError, RefreshResult, TokenRefresher};
use crate::source::AccountSource;
use crate::usage_endpoint::{UsageAnswer, read_usage};
use poolgate_core::account::{Account, AccountStatus};
use poolgate_core::outcome::{Outcome, OutcomeClass, RuntimeBlockSettings};
use poolgate_core::{AccountId, Clock, millis};

const RUNNING: &str = "run:";
const QUIET: &str = "quiet:";
const FRESH: &str = "fresh:";

/// The state a confirmation lock's value names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockState {
    Running,
    Quiet,
    /// Refreshed just now, to the token with this fingerprint.
    Fresh {
        fingerprint: String,
    },
}

impl LockState {
    pub fn parse(value: &str) -> LockState {
        if value.starts_with(QUIET) {
            LockState::Quiet
        } else if let Some(rest) = value.strip_prefix(FRESH) {
            let fingerprint = rest.split(':').next().unwrap_or_default().to_owned();
            LockState::Fresh { fingerprint }
        } else {
            LockState::Running
        }
    }
}

/// A fresh lock owner for a running confirmation or check.
pub fn running_owner() -> String {
    format!("{RUNNING}{:016x}", fastrand::u64(..))
}

/// How a confirmation ends, and so what its lock becomes.
enum Ending {
    /// Something applied (or nothing to hold): the lock goes.
    Done,
    /// The account is fine (or the probe could not tell): quiet for a while.
    Quiet,
    /// The token was refreshed to the one with this fingerprint.
    Fresh(String),
}

/// What confirmations need, shared with their background tasks.
#[derive(Clone)]
pub struct Confirmations {
    pub(crate) admission: Arc<dyn ProbeLeases>,
    pub(crate) http: reqwest::Client,
    pub(crate) health: Arc<dyn HealthStore>,
    pub(crate) source: Arc<dyn AccountSource>,
    pub(crate) metrics: Metrics,
    pub(crate) probe: ProbeSettings,
    pub(crate) blocks: RuntimeBlockSettings,
    /// Set once the engine's builder has made it (it needs the engine's health and source).
    pub(crate) refresher: Arc<OnceLock<TokenRefresher>>,
    /// Woken whenever a confirmation ends, for the reports waiting on one.
    pub(crate) ended: Arc<Notify>,
    /// Upstream resets in the probe's answer are read against it.
    pub(crate) clock: Clock,
}

/// Stores what a probe's answer said about the account's usage windows (docs/DESIGN.md §5),
/// best effort: a failed write leaves the windows as they were and changes no verdict.
pub(crate) async fn keep_probe_windows(
    health: &Arc<dyn HealthStore>,
    account_id: AccountId,
    probed: &Probed,
) {
    if probed.windows.is_empty() {
        return;
    }
    if let Err(error) = health.store_windows(account_id, &probed.windows).await {
        tracing::debug!(account_id, %error, "the probe's usage windows were not stored");
    }
}

impl Confirmations {
    /// Starts a confirmation under the account's lock: `false` when one is running, the account
    /// is quiet, or its token was just refreshed (here or on another replica).
    pub async fn start(
        &self,
        account: Arc<Account>,
        status: u16,
        suspicion: Suspicion,
    ) -> Result<bool, StateError> {
        let owner = running_owner();
        if !self
            .health
            .lock_confirm(account.id, &owner, millis(self.probe.block))
            .await?
        {
            self.metrics
                .confirmations
                .with_label_values(&[suspicion.as_str(), "already_running"])
                .inc();
            return Ok(false);
        }
        self.begin(account, status, suspicion, owner, true).await?;
        Ok(true)
    }

    /// Probes a token refreshed just now that the upstream refused too (the lock holds
    /// `fresh_value`): a refused probe blocks and counts, no second refresh. `false`: another
    /// report took it first.
    pub async fn start_after_refresh(
        &self,
        account: Arc<Account>,
        status: u16,
        fresh_value: &str,
    ) -> Result<bool, StateError> {
        let owner = running_owner();
        if !self
            .health
            .swap_confirm(account.id, fresh_value, &owner, millis(self.probe.block))
            .await?
        {
            return Ok(false);
        }
        self.begin(account, status, Suspicion::Unauthorized, owner, false)
            .await?;
        Ok(true)
    }

    async fn begin(
        &self,
        account: Arc<Account>,
        status: u16,
        suspicion: Suspicion,
        owner: String,
        may_refresh: bool,
    ) -> Result<(), StateError> {
        let block = match self
            .health
            .block_confirming(
                account.id,
                millis(self.probe.block),
                suspicion.as_str(),
                status,
                &owner,
            )
            .await
        {
            Ok(block) => block,
            Err(error) => {
                let _ = self.health.unlock_confirm(account.id, &owner).await;
                return Err(error);
            }
        };
        self.metrics
            .confirmations
            .with_label_values(&[suspicion.as_str(), "started"])
            .inc();
        tracing::info!(
            account_id = account.id,
            status,
            suspect = suspicion.as_str(),
            "confirming with a probe before the outcome applies"
        );
        let this = self.clone();
        tokio::spawn(async move {
            this.run(account, suspicion, owner, block, may_refresh)
                .await;
            this.ended.notify_waiters();
        });
        Ok(())
    }

    async fn run(
        &self,
        account: Arc<Account>,
        suspicion: Suspicion,
        owner: String,
        block: String,
        may_refresh: bool,
    ) {
        let id = account.id;
        // The credential as stored now, not as the snapshot had it: a refresh may have landed.
        let account = match self.source.load_account(id).await {
            Ok(stored) => Arc::new(stored),
            Err(error) => {
                tracing::warn!(account_id = id, %error, "account unreadable; probing with the snapshot's credential");
                account
            }
        };
        if account.status != AccountStatus::Active {
            // Already out of service (retired, error, disabled): nothing left to confirm. A
            // refusal reported after an earlier confirmation retired the account (the request
            // went out before the retirement reached every snapshot) sends no second probe.
            tracing::info!(
                account_id = id,
                status = account.status.as_str(),
                "confirmation skipped: the account is not active"
            );
            let _ = self.health.unblock_confirming(id, &block).await;
            let _ = self.health.unlock_confirm(id, &owner).await;
            return;
        }
        if suspicion == Suspicion::Unauthorized && account.credential_kind.is_oauth() {
            let clock = self.clock.clone();
            let answer =
                read_usage(&self.http, &account, self.probe.timeout, || clock.wall_ms()).await;
            if !matches!(answer, UsageAnswer::NoEndpoint { .. }) {
                // Before the verdict writes: a block it sets must not be lifted with this one.
                let _ = self.health.unblock_confirming(id, &block).await;
                let ending = self.apply_usage(&account, answer, may_refresh).await;
                self.finish(id, &owner, ending).await;
                return;
            }
            tracing::debug!(
                account_id = id,
                "no usage endpoint for this credential; confirming with the inference probe"
            );
        }
        let threshold = millis(self.blocks.hard_block_threshold);
        let mut probed = probe_under_lease(
            &self.admission,
            &self.http,
            &account,
            &self.probe,
            threshold,
            &self.clock,
        )
        .await;
        let mut lifted = false;
        for delay in &self.probe.inconclusive_retries {
            if probed.is_ok() {
                break;
            }
            // No slot for the probe: the account stays selectable while it waits to retry.
            if !lifted {
                let _ = self.health.unblock_confirming(id, &block).await;
                lifted = true;
            }
            tokio::time::sleep(*delay).await;
            let hold = millis(self.probe.block) + millis(*delay);
            if !matches!(
                self.health.swap_confirm(id, &owner, &owner, hold).await,
                Ok(true)
            ) {
                break;
            }
            probed = probe_under_lease(
                &self.admission,
                &self.http,
                &account,
                &self.probe,
                threshold,
                &self.clock,
            )
            .await;
        }
        if !lifted {
            // Before the verdict writes: a block it sets must not be lifted with this one.
            let _ = self.health.unblock_confirming(id, &block).await;
        }
        let ending = match probed {
            Ok(probed) => {
                keep_probe_windows(&self.health, id, &probed).await;
                self.apply(&account, suspicion, &probed, may_refresh).await
            }
            Err(why) => {
                self.metrics
                    .confirmations
                    .with_label_values(&[suspicion.as_str(), "inconclusive"])
                    .inc();
                tracing::info!(
                    account_id = id,
                    why,
                    "confirmation probe not sent; the account stays"
                );
                Ending::Quiet
            }
        };
        self.finish(id, &owner, ending).await;
    }

    /// Ends a confirmation: its lock goes, or says what the account's state now is.
    async fn finish(&self, id: AccountId, owner: &str, ending: Ending) {
        let tail = owner.strip_prefix(RUNNING).unwrap_or(owner);
        let _ = match ending {
            Ending::Done => self.health.unlock_confirm(id, owner).await,
            Ending::Quiet => self
                .health
                .swap_confirm(
                    id,
                    owner,
                    &format!("{QUIET}{tail}"),
                    millis(self.probe.quiet_after_unconfirmed),
                )
                .await
                .map(drop),
            Ending::Fresh(fingerprint) => self
                .health
                .swap_confirm(
                    id,
                    owner,
                    &format!("{FRESH}{fingerprint}:{tail}"),
                    millis(self.probe.refresh_floor),
                )
                .await
                .map(drop),
        };
    }

    /// Applies what the usage endpoint answered a refused OAuth credential.
    async fn apply_usage(
        &self,
        account: &Arc<Account>,
        answer: UsageAnswer,
        may_refresh: bool,
    ) -> Ending {
        let suspicion = Suspicion::Unauthorized.as_str();
        match answer {
            UsageAnswer::Read(usage) => {
                self.metrics
                    .confirmations
                    .with_label_values(&[suspicion, "not_confirmed"])
                    .inc();
                if !usage.readings.is_empty()
                    && let Err(error) = self.health.store_windows(account.id, &usage.readings).await
                {
                    tracing::debug!(account_id = account.id, %error, "the usage endpoint's windows were not stored");
                }
                tracing::info!(
                    account_id = account.id,
                    "the usage endpoint accepts the stored token; the account stays"
                );
                Ending::Quiet
            }
            UsageAnswer::Refused { status, summary } => {
                self.metrics
                    .confirmations
                    .with_label_values(&[suspicion, "confirmed"])
                    .inc();
                self.credential_refused(account, status, &summary, may_refresh)
                    .await
            }
            UsageAnswer::Inconclusive { status, why } => {
                // A 429 or 5xx from the usage endpoint says nothing of the credential: the
                // account stays as it was.
                self.metrics
                    .confirmations
                    .with_label_values(&[suspicion, "inconclusive"])
                    .inc();
                tracing::info!(
                    account_id = account.id,
                    status,
                    why,
                    "the usage endpoint could not tell; the account stays"
                );
                Ending::Quiet
            }
            // Handled by the caller (the inference probe confirms instead).
            UsageAnswer::NoEndpoint { .. } => Ending::Quiet,
        }
    }

    /// Applies the probe's answer by its own class.
    async fn apply(
        &self,
        account: &Arc<Account>,
        suspicion: Suspicion,
        probed: &Probed,
        may_refresh: bool,
    ) -> Ending {
        let class = probed.classified.class;
        let result = if class == suspicion.class() {
            "confirmed"
        } else {
            "not_confirmed"
        };
        self.metrics
            .confirmations
            .with_label_values(&[suspicion.as_str(), result])
            .inc();
        let outcome = Outcome {
            reset_at_ms: probed.classified.reset_at_ms,
            reason: probed.summary.clone(),
            ..Outcome::new(account.id, class, probed.status)
        };
        let (health, id) = (self.health.as_ref(), account.id);
        match (class, decide(&outcome, &self.blocks, self.clock.wall_ms())) {
            (OutcomeClass::Unauthorized, _) => {
                self.credential_refused(account, probed.status, &probed.summary, may_refresh)
                    .await
            }
            (OutcomeClass::QuotaGone, _) => {
                self.retire(account, probed).await;
                Ending::Done
            }
            (_, Decision::Broken { ms }) => {
                if let Ok(applied) = apply_broken(
                    health,
                    &self.metrics,
                    &self.blocks,
                    id,
                    ms,
                    probed.status,
                    &probed.summary,
                )
                .await
                {
                    self.count("broken", applied);
                }
                Ending::Done
            }
            (_, Decision::HardBlock { ms }) => {
                let _ = health
                    .hard_block(id, ms, class.as_str(), probed.status, &probed.summary)
                    .await;
                Ending::Done
            }
            (_, Decision::SoftBlock { ms }) => {
                // Busy, but it answered: nothing was wrong with the account.
                let _ = health
                    .soft_block(id, ms, class.as_str(), probed.status, &probed.summary)
                    .await;
                Ending::Quiet
            }
            _ => {
                tracing::info!(
                    account_id = id,
                    status = probed.status,
                    class = class.as_str(),
                    suspect = suspicion.as_str(),
                    "not confirmed by the probe; the account stays"
                );
                Ending::Quiet
            }
        }
    }

    /// The credential was refused (by the probe, or by the usage endpoint): an OAuth token is
    /// refreshed (once per floor), any other refusal blocks and counts.
    async fn credential_refused(
        &self,
        account: &Arc<Account>,
        status: u16,
        summary: &str,
        may_refresh: bool,
    ) -> Ending {
        let id = account.id;
        if account.credential_kind.is_oauth() {
            if !may_refresh {
                // Refused with the token refreshed moments ago: refreshing again would spend
                // the refresh token on an account whose sign-in is what is wrong.
                self.metrics
                    .token_refreshes
                    .with_label_values(&["floored"])
                    .inc();
            } else if let Some(refresher) = self.refresher.get() {
                match refresher.refresh_refused(id, &account.credential).await {
                    Ok(RefreshResult::Refreshed | RefreshResult::Waited) => {
                        return match self.source.load_account(id).await {
                            Ok(stored) => Ending::Fresh(short_hash(stored.credential.expose())),
                            Err(_) => Ending::Done,
                        };
                    }
                    // No refresh token to use, or the token endpoint refused it: counts.
                    Ok(RefreshResult::NotNeeded)
                    | Err(RefreshError::Refused(_) | RefreshError::BadAnswer) => {}
                    Err(error) => {
                        // The token endpoint could not be asked: proves nothing.
                        tracing::warn!(account_id = id, %error, "token refresh after a refused probe failed");
                        return Ending::Quiet;
                    }
                }
            }
        }
        match block_unauthorized(
            self.health.as_ref(),
            self.source.as_ref(),
            &self.blocks,
            id,
            status,
            summary,
        )
        .await
        {
            Ok(applied) => self.count("unauthorized", applied),
            Err(error) => {
                tracing::warn!(account_id = id, %error, "unauthorized outcome not written")
            }
        }
        Ending::Done
    }

    async fn retire(&self, account: &Account, probed: &Probed) {
        let reason = format!(
            "quota gone: confirmed by probe ({} {})",
            probed.status, probed.summary
        );
        match self
            .source
            .set_status(account.id, AccountStatus::Retired, &reason)
            .await
        {
            Ok(()) => {
                self.metrics.retirements.inc();
                tracing::warn!(account_id = account.id, %reason, "account retired");
                // Until every snapshot has the new status, admission refuses it too.
                let _ = self
                    .health
                    .hard_block(
                        account.id,
                        millis(self.blocks.max_hard_block),
                        "quota_gone",
                        probed.status,
                        "retired",
                    )
                    .await;
            }
            Err(error) => {
                tracing::warn!(account_id = account.id, %error, "retirement not written; the confirming block lapses");
            }
        }
    }

    fn count(&self, class: &str, applied: Applied) {
        self.metrics
            .outcomes
            .with_label_values(&[class, applied.what.as_str()])
            .inc();
    }
}

/// A credential refusal the probe bore out: a hard block, one more count, and past
/// `unauthorized_error_count` within the window, status `error`.
pub(crate) async fn block_unauthorized(
    health: &dyn Health,
    source: &dyn AccountSource,
    blocks: &RuntimeBlockSettings,
    id: AccountId,
    status: u16,
    reason: &str,
) -> Result<Applied, String> {
    let left = health
        .hard_block(
            id,
            millis(blocks.unauthorized_block),
            "unauthorized",
            status,
            reason,
        )
        .await
        .map_err(|e| e.to_string())?;
    let count = health
        .count_unauthorized(id, millis(blocks.unauthorized_window))
        .await
        .map_err(|e| e.to_string())?;
    if count < blocks.unauthorized_error_count {
        return Ok(Applied {
            what: Effect::HardBlock,
            block_ms: left,
        });
    }
    let reason = format!(
        "{count} unauthorized outcomes confirmed by probe within {:?}",
        blocks.unauthorized_window
    );
    source
        .set_status(id, AccountStatus::Error, &reason)
        .await
        .map_err(|e| e.to_string())?;
    tracing::warn!(account_id = id, %reason, "account marked error");
    Ok(Applied {
        what: Effect::Error,
        block_ms: left,
    })
}
