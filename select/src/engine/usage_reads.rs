//! Usage readings (docs/SUBSCRIPTIONS.md, "Probes and usage readings"): every OAuth account's
//! windows read from the usage endpoint its CLI reads (`usage_endpoint.rs`), at start (an
//! account no request has touched is read, not guessed from a peer) and then once per cadence
//! (`UsageReadSettings::every`) under a cluster-wide lock (`Locks::lock_usage_read`: the
//! replicas read each account once per cadence between them). The readings are stored as the
//! answers' headers are (newest per window, `supersedes`); a hard block written for an
//! exhausted window is lifted at once when the endpoint shows the account's windows open again
//! (reset passed). A refusal or a 429/5xx here changes nothing: credentials are confirmed only
//! when a request's refusal asks (`confirmations.rs`).

use std::collections::HashMap;
use std::sync::Weak;
use std::time::Duration;

use poolgate_core::account::AccountStatus;
use poolgate_core::outcome::OutcomeClass;
use poolgate_core::{AccountId, millis};
use tokio::time::Instant;

use super::Selector;
use crate::health::block_value;
use crate::usage_endpoint::{Usage, UsageAnswer, read_usage};

/// How often the usage endpoints are read.
#[derive(Debug, Clone)]
pub struct UsageReadSettings {
    /// Each OAuth account's usage endpoint is read once per this, cluster-wide (and at start);
    /// zero: never (windows are then known only from the answers' headers).
    pub every: Duration,
    /// Bound on one read.
    pub timeout: Duration,
}

impl Default for UsageReadSettings {
    fn default() -> Self {
        UsageReadSettings {
            every: Duration::from_secs(300),
            timeout: Duration::from_secs(10),
        }
    }
}

/// How often the loop looks for accounts due (new ones are read within this of appearing).
const LOOK_EVERY: Duration = Duration::from_secs(5);

impl Selector {
    /// Reads every OAuth account's usage endpoint at once and then once per
    /// `settings.usage_reads.every`, until the engine is gone (nothing when that is zero).
    pub async fn read_usage_every(selector: Weak<Selector>) {
        let Some(every) = selector
            .upgrade()
            .map(|s| s.settings.usage_reads.every)
            .filter(|every| !every.is_zero())
        else {
            return;
        };
        let mut tick = tokio::time::interval(every.min(LOOK_EVERY));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: HashMap<AccountId, Instant> = HashMap::new();
        loop {
            tick.tick().await;
            let Some(selector) = selector.upgrade() else {
                return;
            };
            selector.read_usage_due(&mut last, every).await;
        }
    }

    /// Reads the accounts this replica has not tried within `every` (whose lock it takes).
    async fn read_usage_due(&self, last: &mut HashMap<AccountId, Instant>, every: Duration) {
        let snapshot = self.snapshot.get();
        // The task's own schedule, on Tokio's timer like its interval (core/src/clock.rs).
        let now = Instant::now();
        let due: Vec<_> = snapshot
            .accounts()
            .filter(|a| a.credential_kind.is_oauth() && a.status == AccountStatus::Active)
            .filter(|a| last.get(&a.id).is_none_or(|at| now >= *at + every))
            .cloned()
            .collect();
        last.retain(|id, _| snapshot.account(*id).is_some());
        let owner = format!("usage:{:016x}", fastrand::u64(..));
        for account in due {
            last.insert(account.id, now);
            match self
                .health
                .lock_usage_read(account.id, &owner, millis(every))
                .await
            {
                Ok(true) => self.read_usage_of(account.id).await,
                Ok(false) => {}
                Err(error) => {
                    tracing::debug!(account_id = account.id, %error, "usage read lock unavailable");
                }
            }
        }
    }

    /// Reads one account's usage endpoint (with the credential as stored now) and applies what
    /// it shows: its windows, and the lifting of a window block whose reset passed.
    pub async fn read_usage_of(&self, id: AccountId) {
        let account = match self.source.load_account(id).await {
            Ok(account) => account,
            Err(error) => {
                tracing::debug!(account_id = id, %error, "usage read: account unreadable");
                return;
            }
        };
        let answer = read_usage(
            &self.probe_http,
            &account,
            self.settings.usage_reads.timeout,
            || self.clock.wall_ms(),
        )
        .await;
        self.metrics
            .usage_reads
            .with_label_values(&[answer_label(&answer)])
            .inc();
        match answer {
            UsageAnswer::Read(usage) => self.apply_usage(id, &usage).await,
            UsageAnswer::Refused { status, .. } => {
                tracing::info!(
                    account_id = id,
                    status,
                    "usage endpoint refused the stored token; nothing changes until a request's refusal is confirmed"
                );
            }
            UsageAnswer::NoEndpoint { status } => {
                tracing::debug!(
                    account_id = id,
                    status,
                    "no usage endpoint for this account"
                );
            }
            UsageAnswer::Inconclusive { status, why } => {
                tracing::debug!(account_id = id, status, why, "usage read inconclusive");
            }
        }
    }

    async fn apply_usage(&self, id: AccountId, usage: &Usage) {
        if !usage.readings.is_empty() {
            if let Err(error) = self.health.store_windows(id, &usage.readings).await {
                tracing::debug!(account_id = id, %error, "usage readings not stored");
            }
            self.windows_cache.forget(id);
        }
        if !usage.windows_open() {
            return;
        }
        let blocks = match self.health.list_blocks(&[id]).await {
            Ok(blocks) => blocks,
            Err(error) => {
                tracing::debug!(account_id = id, %error, "usage read: blocks unreadable");
                return;
            }
        };
        let window = OutcomeClass::WindowExhausted.as_str();
        for block in blocks
            .iter()
            .filter(|b| b.kind == "hard" && b.class == window)
        {
            // Lifted only if it is still that block (a newer one is kept).
            let value = block_value(&block.class, block.status, &block.reason);
            match self.health.unblock_confirming(id, &value).await {
                Ok(()) => {
                    self.load_cache.wrote(id);
                    self.load_cache.invalidate();
                    tracing::info!(
                        account_id = id,
                        "window block lifted: the usage endpoint shows the window reset"
                    );
                }
                Err(error) => {
                    tracing::debug!(account_id = id, %error, "window block not lifted");
                }
            }
        }
    }
}

fn answer_label(answer: &UsageAnswer) -> &'static str {
    match answer {
        UsageAnswer::Read(_) => "read",
        UsageAnswer::Refused { .. } => "refused",
        UsageAnswer::NoEndpoint { .. } => "no_endpoint",
        UsageAnswer::Inconclusive { .. } => "inconclusive",
    }
}
