//! Plans: the group's active accounts that may serve the model, less the excluded, filtered
//! by their health (a fresh read when the cached one leaves no one), ordered by
//! `poolgate_core::select::order` with the request's binding first; and the half-open breaker
//! checks a plan starts instead of letting a client request through.

use std::collections::HashMap;
use std::sync::Arc;

use crate::confirmations::{keep_probe_windows, running_owner};
use crate::health::{AccountHealth, Breaker, BreakerChange, HardBlock, StateError};
use crate::load_cache::Reading;
use crate::probe::{breaker_closes, probe_under_lease};
use crate::windows_cache::Readings;
use poolgate_core::account::{Account, AccountStatus, Platform, Service, group_models};
use poolgate_core::plan::{Plan, PlannedAccount};
use poolgate_core::select::{CONFIRMING_RETRY_MS, Candidate, NoneReason, order_first};
use poolgate_core::windows::{Assessment, Shed, Thresholds, WindowKind, assess, left_by_window};

/// How often a group's window gauges are recomputed, at most.
const WINDOW_GAUGE_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);
/// Groups whose gauge times are remembered before the map starts over.
const WINDOW_GAUGE_GROUPS: usize = 1024;
use poolgate_core::{AccountId, millis};

use super::{Selector, SelectorError};

/// A select request, validated.
#[derive(Debug, Clone, Default)]
pub struct SelectQuery {
    pub group: String,
    pub platform: Option<Platform>,
    /// Only accounts that serve it are planned.
    pub service: Service,
    pub model: String,
    pub session_hash: Option<String>,
    pub previous_response_id: Option<String>,
    pub exclude: Vec<AccountId>,
    pub max_accounts: usize,
    /// The client key the request came with: `previous_response_id` is looked up among its
    /// response bindings. 0: unknown (an older relay), only unscoped bindings are found.
    pub api_key_id: i64,
}

/// An empty plan, and why.
fn no_plan(reason: NoneReason, retry_after_ms: u64) -> Plan {
    Plan {
        none_reason: Some(reason),
        retry_after_ms,
        ..Plan::default()
    }
}

impl Selector {
    /// A plan for a client request, as every transport answers it: refused before any account
    /// is planned when its `previous_response_id` belongs to another client key, else
    /// [`select`](Self::select), counted in `selector_selects_total` by how it ended.
    pub async fn plan(&self, query: &SelectQuery) -> Result<Plan, SelectorError> {
        if self.response_of_another_key(query).await? {
            self.count_select("previous_response_other_key");
            return Ok(Plan {
                previous_response_other_key: true,
                ..Plan::default()
            });
        }
        let mut plan = self.select(query).await?;
        self.count_select(plan.none_reason.map_or("planned", |reason| reason.as_str()));
        plan.rerank_passthrough = self
            .snapshot
            .get()
            .group_settings(&query.group)
            .rerank_passthrough;
        Ok(plan)
    }

    fn count_select(&self, label: &str) {
        self.metrics.selects.with_label_values(&[label]).inc();
    }

    /// The models the group's active accounts of `platform` serve (`/v1/models`).
    pub fn models(&self, group: &str, platform: Platform) -> Vec<String> {
        let snapshot = self.snapshot.get();
        group_models(snapshot.accounts().map(|a| a.as_ref()), group, platform)
    }

    /// The plan of the group's eligible accounts in order, without the response-key check or
    /// the count (`plan` adds both); an unknown group is `NotFound`.
    pub async fn select(&self, query: &SelectQuery) -> Result<Plan, SelectorError> {
        let snapshot = self.snapshot.get();
        if !snapshot.has_group(&query.group) {
            return Err(SelectorError::NotFound(format!(
                "unknown group {:?}",
                query.group
            )));
        }
        let on_platform: Vec<&Arc<Account>> = snapshot
            .group_accounts(&query.group)
            .filter(|a| a.status == AccountStatus::Active)
            .filter(|a| query.platform.is_none_or(|p| a.platform == p))
            .filter(|a| a.serves(query.service))
            .collect();
        if on_platform.is_empty() {
            return Ok(no_plan(NoneReason::NoAccounts, 0));
        }
        let allowed: Vec<&Arc<Account>> = on_platform
            .into_iter()
            .filter(|a| a.allows(&query.model))
            .collect();
        if allowed.is_empty() {
            return Ok(no_plan(NoneReason::ModelNotAllowed, 0));
        }
        let included: Vec<&Arc<Account>> = allowed
            .into_iter()
            .filter(|a| !query.exclude.contains(&a.id))
            .collect();
        if included.is_empty() {
            return Ok(no_plan(NoneReason::AllExcluded, 0));
        }
        let ids: Vec<AccountId> = included.iter().map(|a| a.id).collect();
        let sticky = self.binding(query).await;

        let mut reading = self.load_cache.read(&ids, false).await;
        let mut candidates = self.eligible(&included, &reading).await;
        if candidates.is_empty() {
            // The cached reading filtered everyone: confirm with one fresh (coalesced) read.
            reading = self.load_cache.read(&ids, true).await;
            candidates = self.eligible(&included, &reading).await;
        }
        if candidates.is_empty() {
            if self.confirming_among(&included, &reading).await {
                return Ok(no_plan(NoneReason::Confirming, CONFIRMING_RETRY_MS));
            }
            let mut earliest = u64::MAX;
            let mut all_breakers = true;
            for account in &included {
                if let Some(health) = reading.get(account.id) {
                    if health.hard_block_ms > 0 {
                        earliest = earliest.min(health.hard_block_ms);
                        all_breakers = false;
                    }
                    if let Breaker::Open(ms) = health.breaker {
                        earliest = earliest.min(ms);
                    }
                }
            }
            let reason = if all_breakers {
                NoneReason::BreakerOpen
            } else {
                NoneReason::AllBlocked
            };
            return Ok(no_plan(
                reason,
                if earliest == u64::MAX { 0 } else { earliest },
            ));
        }
        // A relay's view carries the selector's own settings: it plans as the selector would.
        let deployment = snapshot.deployment();
        let thresholds = {
            let group = snapshot.group_settings(&query.group);
            deployment
                .map_or(self.settings.windows, |d| d.windows)
                .overridden(group.window_shed_at, group.window_move_at)
        };
        let unpriced = deployment.map_or(self.settings.unpriced, |d| d.unpriced);
        self.assess_windows(&query.group, thresholds, &mut candidates)
            .await;
        // A model-scoped weekly limit that ran out keeps the account from the models it covers
        // until its reset; the account still serves every other model. A plan window the
        // upstream reported used up, with no overage paying for more, keeps it from every model
        // until that reset: it cannot serve, so asking it only earns a 429 (docs/DESIGN.md §5).
        let now = self.clock.wall_ms();
        let mut model_blocked_until: Option<i64> = None;
        candidates.retain(|candidate| {
            let mapped = candidate.account.mapped_model(&query.model);
            match candidate
                .windows
                .as_ref()
                .and_then(|windows| windows_block_until(windows, Some(&mapped), now))
            {
                Some(until) => {
                    model_blocked_until =
                        Some(model_blocked_until.map_or(until, |earliest| earliest.min(until)));
                    false
                }
                _ => true,
            }
        });
        if candidates.is_empty() {
            if self.confirming_among(&included, &reading).await {
                return Ok(no_plan(NoneReason::Confirming, CONFIRMING_RETRY_MS));
            }
            let retry_after_ms =
                model_blocked_until.map_or(0, |until| u64::try_from(until - now).unwrap_or(0));
            return Ok(no_plan(NoneReason::AllBlocked, retry_after_ms));
        }
        if let Some(bound) = sticky
            && candidates.iter().any(|candidate| {
                candidate.account.id == bound && candidate.shed() == Shed::AllSessions
            })
        {
            // The session's account is past the move threshold: it moves (its prompt cache
            // with it), and operators see how often shedding costs a session that.
            self.metrics
                .window_sessions_moved
                .with_label_values(&[&query.group])
                .inc();
        }
        let limit = if query.max_accounts == 0 {
            deployment
                .and_then(|d| usize::try_from(d.plan_size).ok())
                .filter(|size| *size > 0)
                .unwrap_or(self.settings.plan_size)
        } else {
            query.max_accounts
        };
        let (ordered, is_sticky) =
            order_first(candidates, sticky, &mut fastrand::Rng::new(), limit.max(1));
        let group = snapshot.group_settings(&query.group);
        let usage_headers_to_clients = group.usage_headers_to_clients;
        let accounts = ordered
            .into_iter()
            .take(limit.max(1))
            .map(|candidate| {
                let account = &candidate.account;
                let mapped_model = account.mapped_model(&query.model);
                PlannedAccount {
                    id: account.id,
                    name: account.name.clone(),
                    platform: account.platform,
                    base_url: account.base_url.clone(),
                    credential: account.credential.clone(),
                    credential_kind: account.credential_kind,
                    price: snapshot.price(&mapped_model, account.platform, unpriced),
                    mapped_model,
                    concurrency_limit: account.concurrency_limit,
                    rpm_limit: account.rpm_limit,
                    session_window_limit_usd: account.session_window_limit_usd,
                    proxy_url: account.proxy_url.clone(),
                    stream_usage: account.stream_usage,
                    soft_blocked: candidate.soft_blocked(),
                    inflight: candidate.health.and_then(|h| h.inflight),
                    usage_headers_to_clients,
                }
            })
            .collect();
        Ok(Plan {
            accounts,
            sticky: is_sticky,
            subscriptions_cli_only: group.subscriptions_cli_only,
            ..Plan::default()
        })
    }

    /// Whether an account an empty plan left out for its hard block is out only while a
    /// confirmation runs (the block is the "confirming" one, `confirmations.rs`), or was let
    /// back since the reading (its block lifted: most often the verdict of one): it may serve
    /// at any moment, so the plan says `Confirming` with a short retry hint and the relay plans
    /// again (docs/DESIGN.md §6) instead of refusing the request for the block's length. Asked
    /// only when a plan is empty; blocks unreadable: no (the reading's blocks answer as before).
    async fn confirming_among(&self, accounts: &[&Arc<Account>], reading: &Reading) -> bool {
        let hard: Vec<AccountId> = accounts
            .iter()
            .filter(|account| {
                reading
                    .get(account.id)
                    .is_some_and(|health| health.hard_block_ms > 0)
            })
            .map(|account| account.id)
            .collect();
        if hard.is_empty() {
            return false;
        }
        match self.health.hard_blocks(&hard).await {
            Ok(blocks) => blocks
                .iter()
                .any(|block| matches!(block, HardBlock::Confirming | HardBlock::None)),
            Err(error) => {
                tracing::debug!(%error, "blocks not read; an empty plan names no confirmation");
                false
            }
        }
    }

    /// Drops hard-blocked and breaker-open accounts; a half-open one stays only if this select
    /// takes its probe token (one request through at a time).
    async fn eligible(&self, accounts: &[&Arc<Account>], reading: &Reading) -> Vec<Candidate> {
        let mut candidates = Vec::with_capacity(accounts.len());
        for account in accounts {
            let health = reading.get(account.id);
            match health_gate(health.as_ref()) {
                Gate::Open => {}
                Gate::Shut => continue,
                Gate::HalfOpen => {
                    // The selector's own probe decides; no client request goes through as the
                    // probe. Excluded until then.
                    if let Err(error) = self.start_half_open_check((*account).clone()).await {
                        tracing::debug!(%error, account_id = account.id, "half-open check not started");
                    }
                    continue;
                }
            }
            candidates.push(Candidate {
                account: (*account).clone(),
                health,
                // Read for every candidate at once, after the health filter (`assess_windows`).
                windows: None,
            });
        }
        candidates
    }

    /// Where each candidate stands in its usage windows (docs/DESIGN.md §5), from one read of
    /// the health store. A read that fails leaves every candidate unknown: ordered as before
    /// windows were read, never a failed select.
    async fn assess_windows(
        &self,
        group: &str,
        thresholds: Thresholds,
        candidates: &mut [Candidate],
    ) {
        let ids: Vec<AccountId> = candidates.iter().map(|c| c.account.id).collect();
        let Some(known) = self.windows_cache.read(&ids).await else {
            return;
        };
        let now = self.clock.wall_ms();
        for candidate in candidates.iter_mut() {
            if let Some(readings) = known.get(&candidate.account.id) {
                candidate.windows = Some(assess(readings, now, thresholds));
            }
        }
        self.update_window_gauges(group, candidates, &known, now);
    }

    /// The group's window gauges from this select's candidates, at most once per gauge period
    /// per group (a select over a thousand accounts does not sum their readings every time).
    fn update_window_gauges(
        &self,
        group: &str,
        candidates: &[Candidate],
        known: &HashMap<AccountId, Readings>,
        now: i64,
    ) {
        {
            let mut updated = self
                .window_gauges_at
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let at_now = self.clock.now();
            let due = updated
                .get(group)
                .is_none_or(|at| at_now.saturating_duration_since(*at) >= WINDOW_GAUGE_PERIOD);
            if !due {
                return;
            }
            if updated.len() > WINDOW_GAUGE_GROUPS {
                updated.clear();
            }
            updated.insert(group.to_owned(), at_now);
        }
        let shed = candidates
            .iter()
            .filter(|candidate| candidate.shed() > Shed::None)
            .count();
        self.metrics
            .window_shed_accounts
            .with_label_values(&[group])
            .set(i64::try_from(shed).unwrap_or(i64::MAX));
        let mut left: HashMap<WindowKind, f64> = HashMap::new();
        for candidate in candidates {
            if let Some(readings) = known.get(&candidate.account.id) {
                for (kind, share) in left_by_window(readings, now) {
                    *left.entry(kind).or_default() += share;
                }
            }
        }
        for (kind, share) in left {
            self.metrics
                .window_headroom
                .with_label_values(&[group, kind.label()])
                .set(share);
        }
    }

    /// Checks a half-open breaker with the probe, in the background, under the account's
    /// confirmation lock (so one check runs cluster-wide): closes the breaker unless the
    /// upstream itself failed, in which case it reopens for twice as long.
    pub(super) async fn start_half_open_check(
        &self,
        account: Arc<Account>,
    ) -> Result<(), StateError> {
        let owner = running_owner();
        let lock_ms = millis(self.settings.probe.block);
        if !self
            .health
            .lock_confirm(account.id, &owner, lock_ms)
            .await?
        {
            return Ok(());
        }
        let (admission, http, health, metrics) = (
            self.admission.clone(),
            self.probe_http.clone(),
            self.health.clone(),
            self.metrics.clone(),
        );
        let (probe, blocks) = (self.settings.probe.clone(), self.settings.blocks.clone());
        let linger = millis(self.settings.load_cache.cache_ttl * 3).max(1000);
        let clock = self.clock.clone();
        tokio::spawn(async move {
            let threshold = millis(blocks.hard_block_threshold);
            let probed =
                probe_under_lease(&admission, &http, &account, &probe, threshold, &clock).await;
            if let Ok(probed) = &probed {
                keep_probe_windows(&health, account.id, probed).await;
            }
            match probed {
                Ok(probed) if breaker_closes(&probed) => {
                    if health.breaker_success(account.id).await.is_ok() {
                        metrics.breaker_changes.with_label_values(&["closed"]).inc();
                        tracing::info!(
                            account_id = account.id,
                            status = probed.status,
                            "half-open probe answered; breaker closed"
                        );
                    }
                }
                Ok(probed) => {
                    let change = health
                        .breaker_failure(
                            account.id,
                            blocks.breaker_threshold,
                            millis(blocks.breaker_open),
                            millis(blocks.breaker_max_open),
                        )
                        .await;
                    if let Ok(BreakerChange::Reopened(ms)) = change {
                        metrics
                            .breaker_changes
                            .with_label_values(&["reopened"])
                            .inc();
                        tracing::warn!(
                            account_id = account.id,
                            status = probed.status,
                            open_ms = ms,
                            "half-open probe failed; breaker reopened"
                        );
                    }
                }
                Err(why) => {
                    tracing::info!(account_id = account.id, why, "half-open probe not sent")
                }
            }
            let _ = health.linger_confirm(account.id, &owner, linger).await;
        });
        Ok(())
    }
}

/// What an account's live health lets a select do with it: the one rule plans and the
/// `selector_group_eligible` gauge share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Plannable (unknown health included: a Redis outage does not empty every plan).
    Open,
    /// Hard-blocked, or its breaker open.
    Shut,
    /// The breaker's open period ended: the selector's probe checks it; no client request.
    HalfOpen,
}

/// The gate of an account's health reading (`None`: unreadable).
pub(crate) fn health_gate(health: Option<&AccountHealth>) -> Gate {
    let Some(health) = health else {
        return Gate::Open;
    };
    if health.hard_block_ms > 0 {
        return Gate::Shut;
    }
    match health.breaker {
        Breaker::Open(_) => Gate::Shut,
        Breaker::HalfOpen => Gate::HalfOpen,
        Breaker::Closed => Gate::Open,
    }
}

/// Until when an account's usage windows keep it out of plans (docs/DESIGN.md §5): a plan
/// window used up with no overage paying for more (every model), or a model-scoped limit that
/// ran out for `upstream_model` (the gauges, asking about no model, pass `None`). `None`: not
/// kept out now.
pub(crate) fn windows_block_until(
    windows: &Assessment,
    upstream_model: Option<&str>,
    now: i64,
) -> Option<i64> {
    let exhausted = windows.exhausted_until_ms;
    let for_model = upstream_model.and_then(|model| windows.blocked_for_model(model));
    exhausted.max(for_model).filter(|until| *until > now)
}
