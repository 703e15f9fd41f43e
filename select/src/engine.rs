//! The selector engine: plans (select), outcomes ("busy is not broken"), bindings, and
//! authentication, over a config snapshot from an account source (Postgres, or the standalone
//! relay's file) and a health store (Redis shared by every replica, or memory in one process).
//! Transport-free: `grpc.rs` calls it, and the standalone relay calls it directly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use poolgate_runtime::ports::ProbeLeases;
use tokio::time::Instant;

use crate::confirmations::{Confirmations, LockState, running_owner};
use crate::crypto::api_key_hash;
use crate::health::{BackendError, BlockInfo, Breaker, BreakerChange, HealthStore};
use crate::load_cache::{LoadCache, LoadCacheSettings};
use crate::metrics::Metrics;
use crate::probe::{ProbeSettings, Suspicion, breaker_closes, probe_under_lease};
use crate::snapshot::SnapshotCell;
use crate::source::{AccountSource, StoreError};
use poolgate_core::account::{Account, AccountStatus, ApiKeyRecord, Platform, Price, Secret};
use poolgate_core::outcome::{Decision, decide};
use poolgate_core::outcome::{Outcome, RuntimeBlockSettings};
use poolgate_core::select::{Candidate, NoneReason, order};
use poolgate_core::short_hash;
use poolgate_core::{AccountId, millis, now_ms};

#[derive(Debug, Clone, thiserror::Error)]
pub enum SelectorError {
    #[error("invalid {field}: {message}")]
    InvalidArgument { field: String, message: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Conflict(String),
    #[error("backend unavailable: {0}")]
    Unavailable(String),
}

impl SelectorError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        SelectorError::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<StoreError> for SelectorError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound(what) => SelectorError::NotFound(what),
            StoreError::Conflict(what) => SelectorError::Conflict(what),
            other => SelectorError::Unavailable(other.to_string()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SelectorSettings {
    pub blocks: RuntimeBlockSettings,
    pub load_cache: LoadCacheSettings,
    /// Plan length when the request does not say.
    pub plan_size: usize,
    pub sticky_ttl: Duration,
    pub response_ttl: Duration,
    /// The confirmation probe (billing-class answers, half-open breakers).
    pub probe: ProbeSettings,
}

impl Default for SelectorSettings {
    fn default() -> Self {
        SelectorSettings {
            blocks: RuntimeBlockSettings::default(),
            load_cache: LoadCacheSettings::default(),
            plan_size: 4,
            sticky_ttl: Duration::from_secs(3600),
            response_ttl: Duration::from_secs(3600),
            probe: ProbeSettings::default(),
        }
    }
}

/// A select request, validated.
#[derive(Debug, Clone, Default)]
pub struct SelectQuery {
    pub group: String,
    pub platform: Option<Platform>,
    pub model: String,
    pub session_hash: Option<String>,
    pub previous_response_id: Option<String>,
    pub exclude: Vec<AccountId>,
    pub max_accounts: usize,
    /// The client key the request came with: `previous_response_id` is looked up among its
    /// response bindings. 0: unknown (an older relay), only unscoped bindings are found.
    pub api_key_id: i64,
}

/// One planned account.
#[derive(Debug, Clone)]
pub struct PlanEntry {
    pub account: Arc<Account>,
    pub mapped_model: String,
    pub price: Price,
    pub soft_blocked: bool,
    /// `None`: unknown.
    pub inflight: Option<u32>,
}

#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub entries: Vec<PlanEntry>,
    pub sticky: bool,
    pub none_reason: Option<NoneReason>,
    pub retry_after_ms: u64,
    /// The group passes its accounts' usage-window headers to clients
    /// ([`GroupSettings::usage_headers_to_clients`](crate::domain::GroupSettings)).
    pub usage_headers_to_clients: bool,
}

/// What an outcome report changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub what: &'static str,
    pub block_ms: u64,
}

impl Applied {
    const NONE: Applied = Applied {
        what: "none",
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

struct StickyEntry {
    account: AccountId,
    fetched: Instant,
    touched: Instant,
}

/// How fresh a reading must be for a success to skip the breaker reset (nothing to reset).
const SUCCESS_SKIP_AGE: Duration = Duration::from_secs(1);

/// How long a binding read from Redis is trusted locally, and how often its TTL is refreshed.
const STICKY_LOCAL: Duration = Duration::from_secs(5);
const STICKY_TOUCH: Duration = Duration::from_secs(60);

/// The response binding of `response_id` for one client key (0: an older relay's, unscoped).
/// The key's digits end at the first `:`, so no two (key, id) pairs share a name. Bindings of
/// the plain `<id>` form (before response bindings were scoped) are no longer read: they were
/// dropped once on upgrade (docs/SECURITY.md).
fn scoped_response(api_key_id: i64, response_id: &str) -> String {
    format!("k{api_key_id}:{response_id}")
}

/// Marks `response_id` as bound by poolgate for some client key (whichever: the mark does not
/// say), so another key's request naming it is refused instead of passed as unknown.
fn marked_response(response_id: &str) -> String {
    format!("any:{response_id}")
}

/// What an engine is built from.
pub struct SelectorParts {
    /// The snapshot served from; whoever builds the engine keeps it current (a reload loop).
    pub snapshot: Arc<SnapshotCell>,
    pub source: Arc<dyn AccountSource>,
    pub health: Arc<dyn HealthStore>,
    /// Where the confirmation probe takes its lease: the lease engine the relays' leases use
    /// (wired by the composition root), so the probe counts against the account like any
    /// request.
    pub leases: Arc<dyn ProbeLeases>,
    pub settings: SelectorSettings,
    pub metrics: Metrics,
}

pub struct Selector {
    snapshot: Arc<SnapshotCell>,
    source: Arc<dyn AccountSource>,
    health: Arc<dyn HealthStore>,
    load_cache: LoadCache,
    settings: SelectorSettings,
    sticky_cache: Mutex<HashMap<(String, String), StickyEntry>>,
    metrics: Metrics,
    /// The confirmation probe holds a lease from it like any request.
    admission: Arc<dyn ProbeLeases>,
    probe_http: reqwest::Client,
    /// Suspicious outcomes become writes only through these (`confirmations.rs`).
    confirmations: Confirmations,
}

impl Selector {
    pub fn new(parts: SelectorParts) -> Self {
        let SelectorParts {
            snapshot,
            source,
            health,
            leases: admission,
            settings,
            metrics,
        } = parts;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let probe_http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        let confirmations = Confirmations {
            admission: admission.clone(),
            http: probe_http.clone(),
            health: health.clone(),
            source: source.clone(),
            metrics: metrics.clone(),
            probe: settings.probe.clone(),
            blocks: settings.blocks.clone(),
            refresher: Arc::new(std::sync::OnceLock::new()),
            ended: Arc::new(tokio::sync::Notify::new()),
        };
        Selector {
            admission,
            probe_http,
            confirmations,
            load_cache: LoadCache::new(health.clone(), settings.load_cache.clone())
                .with_active_blocks_gauge(metrics.active_blocks.clone()),
            snapshot,
            source,
            health,
            settings,
            sticky_cache: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    pub fn snapshot(&self) -> &Arc<SnapshotCell> {
        &self.snapshot
    }

    pub fn source(&self) -> &Arc<dyn AccountSource> {
        &self.source
    }

    pub fn health(&self) -> &Arc<dyn HealthStore> {
        &self.health
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The account bound to this request: the previous response's account (a binding of the
    /// request's own client key), else the session's. A Redis failure means "no binding", never
    /// an error.
    async fn binding(&self, query: &SelectQuery) -> Option<AccountId> {
        if let Some(response_id) = &query.previous_response_id {
            let scoped = scoped_response(query.api_key_id, response_id);
            match self.health.response_get(&scoped).await {
                Ok(Some(id)) => return Some(id),
                Ok(None) => {}
                Err(error) => tracing::debug!(%error, "response binding unreadable"),
            }
        }
        let session = query.session_hash.as_ref()?;
        let key = (query.group.clone(), session.clone());
        {
            let mut cache = self.sticky_cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(entry) = cache.get_mut(&key)
                && entry.fetched.elapsed() < STICKY_LOCAL
            {
                if entry.touched.elapsed() >= STICKY_TOUCH {
                    entry.touched = Instant::now();
                    let (health, ttl) = (self.health.clone(), millis(self.settings.sticky_ttl));
                    let (group, session) = key.clone();
                    tokio::spawn(async move {
                        let _ = health.sticky_touch(&group, &session, ttl).await;
                    });
                }
                return Some(entry.account);
            }
        }
        match self.health.sticky_get(&query.group, session).await {
            Ok(Some(account)) => {
                let mut cache = self.sticky_cache.lock().unwrap_or_else(|p| p.into_inner());
                let touched = cache
                    .get(&key)
                    .map(|e| e.touched)
                    .unwrap_or_else(Instant::now);
                if cache.len() > 100_000 {
                    cache.retain(|_, e| e.fetched.elapsed() < STICKY_LOCAL);
                }
                cache.insert(
                    key,
                    StickyEntry {
                        account,
                        fetched: Instant::now(),
                        touched,
                    },
                );
                Some(account)
            }
            Ok(None) => None,
            Err(error) => {
                tracing::debug!(%error, "sticky binding unreadable; selecting without it");
                None
            }
        }
    }

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
            .collect();
        if on_platform.is_empty() {
            return Ok(Plan::none(NoneReason::NoAccounts, 0));
        }
        let allowed: Vec<&Arc<Account>> = on_platform
            .into_iter()
            .filter(|a| a.allows(&query.model))
            .collect();
        if allowed.is_empty() {
            return Ok(Plan::none(NoneReason::ModelNotAllowed, 0));
        }
        let included: Vec<&Arc<Account>> = allowed
            .into_iter()
            .filter(|a| !query.exclude.contains(&a.id))
            .collect();
        if included.is_empty() {
            return Ok(Plan::none(NoneReason::AllExcluded, 0));
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
            return Ok(Plan::none(
                reason,
                if earliest == u64::MAX { 0 } else { earliest },
            ));
        }
        let (ordered, is_sticky) = order(candidates, sticky, &mut fastrand::Rng::new());
        let limit = if query.max_accounts == 0 {
            self.settings.plan_size
        } else {
            query.max_accounts
        };
        let entries = ordered
            .into_iter()
            .take(limit.max(1))
            .map(|candidate| {
                let mapped_model = candidate.account.mapped_model(&query.model);
                PlanEntry {
                    price: snapshot.price(&mapped_model),
                    soft_blocked: candidate.soft_blocked(),
                    inflight: candidate.health.and_then(|h| h.inflight),
                    mapped_model,
                    account: candidate.account,
                }
            })
            .collect();
        Ok(Plan {
            entries,
            sticky: is_sticky,
            none_reason: None,
            retry_after_ms: 0,
            usage_headers_to_clients: snapshot
                .group_settings(&query.group)
                .usage_headers_to_clients,
        })
    }

    /// Drops hard-blocked and breaker-open accounts; a half-open one stays only if this select
    /// takes its probe token (one request through at a time).
    async fn eligible(
        &self,
        accounts: &[&Arc<Account>],
        reading: &crate::load_cache::Reading,
    ) -> Vec<Candidate> {
        let mut candidates = Vec::with_capacity(accounts.len());
        for account in accounts {
            let health = reading.get(account.id);
            if let Some(health) = health {
                if health.hard_block_ms > 0 {
                    continue;
                }
                match health.breaker {
                    Breaker::Open(_) => continue,
                    Breaker::HalfOpen => {
                        // The selector's own probe decides; no client request goes through
                        // as the probe. Excluded until then.
                        if let Err(error) = self.start_half_open_check((*account).clone()).await {
                            tracing::debug!(%error, account_id = account.id, "half-open check not started");
                        }
                        continue;
                    }
                    Breaker::Closed => {}
                }
            }
            candidates.push(Candidate {
                account: (*account).clone(),
                health,
            });
        }
        candidates
    }

    /// Applies an upstream outcome (docs/DESIGN.md §1 and §5); a refused OAuth token's new
    /// token shows as `refreshed` (use [`Selector::report_outcome`] to get it).
    pub async fn report(&self, outcome: &Outcome) -> Result<Applied, SelectorError> {
        Ok(match self.report_outcome(outcome).await? {
            Reported::Applied(applied) => applied,
            Reported::Refreshed(_) => Applied {
                what: "refreshed",
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
        let unavailable = |e: BackendError| SelectorError::Unavailable(e.to_string());
        let applied = match decide(outcome, blocks, now_ms()) {
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
                        what: "breaker_closed",
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
                    what: "soft_block",
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
                    what: "hard_block",
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
                    Reported::Refreshed(_) => "refreshed",
                };
                self.metrics
                    .outcomes
                    .with_label_values(&[class, what])
                    .inc();
                return Ok(reported);
            }
            Decision::Confirm => self
                .confirm(account, outcome.status, Suspicion::QuotaGone)
                .await
                .map_err(unavailable)?,
        };
        self.metrics
            .outcomes
            .with_label_values(&[class, applied.what])
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
    ) -> Result<Applied, BackendError> {
        if !self.confirmations.start(account, status, suspicion).await? {
            return Ok(Applied::NONE);
        }
        self.load_cache.invalidate();
        Ok(Applied {
            what: "confirming",
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
        let unavailable = |e: BackendError| SelectorError::Unavailable(e.to_string());
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
            .is_some_and(|oauth| oauth.expires_at_ms <= now_ms())
            && short_hash(stored.credential.expose()) == refused
            && let Some(fresh) = self.refresh_expired(&stored).await
        {
            return Ok(Reported::Refreshed(fresh));
        }
        let deadline = Instant::now() + self.settings.probe.refusal_wait;
        let mut stored = stored;
        loop {
            // Registered before the state is read, so an ending in between is not missed.
            let ended = self.confirmations.ended.notified();
            if short_hash(stored.credential.expose()) != refused && !stored.credential.is_empty() {
                // Refreshed away (before this report, or by the confirmation it waited for).
                return Ok(Reported::Refreshed(stored.credential.clone()));
            }
            match self
                .health
                .confirm_state(id)
                .await
                .map_err(unavailable)?
                .map(|value| (LockState::parse(&value), value))
            {
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
                            what: "hard_block",
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
                    what: "confirming",
                    block_ms: 0,
                }));
            }
            let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), ended).await;
            stored = Arc::new(self.source.load_account(id).await?);
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

    /// Checks a half-open breaker with the probe, in the background, under the account's
    /// confirmation lock (so one check runs cluster-wide): closes the breaker unless the
    /// upstream itself failed, in which case it reopens for twice as long.
    async fn start_half_open_check(&self, account: Arc<Account>) -> Result<(), BackendError> {
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
        tokio::spawn(async move {
            let threshold = millis(blocks.hard_block_threshold);
            match probe_under_lease(&admission, &http, &account, &probe, threshold).await {
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

    /// Hands the engine the token refresher (once).
    pub fn set_refresher(&self, refresher: crate::refresh::TokenRefresher) {
        let _ = self.confirmations.refresher.set(refresher);
    }

    /// Binds a session to the account that served it; returns `hit`, `bound` or `rebind`.
    pub async fn bind_session(
        &self,
        group: &str,
        session: &str,
        account: AccountId,
    ) -> Result<&'static str, SelectorError> {
        // Bound here already and refreshed within a minute: a hit, no write (the binding's TTL is
        // refreshed at most once a minute).
        let cached_hit = {
            let cache = self.sticky_cache.lock().unwrap_or_else(|p| p.into_inner());
            cache
                .get(&(group.to_owned(), session.to_owned()))
                .is_some_and(|entry| {
                    entry.account == account && entry.touched.elapsed() < STICKY_TOUCH
                })
        };
        if cached_hit {
            let platform = self
                .snapshot
                .get()
                .account(account)
                .map(|a| a.platform.as_str())
                .unwrap_or("unknown");
            self.metrics
                .sticky
                .with_label_values(&["hit", platform])
                .inc();
            return Ok("hit");
        }
        let previous = self
            .health
            .sticky_set(group, session, account, millis(self.settings.sticky_ttl))
            .await
            .map_err(|e| SelectorError::Unavailable(e.to_string()))?;
        let result = match previous {
            Some(id) if id == account => "hit",
            Some(_) => "rebind",
            None => "bound",
        };
        {
            let mut cache = self.sticky_cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.insert(
                (group.to_owned(), session.to_owned()),
                StickyEntry {
                    account,
                    fetched: Instant::now(),
                    touched: Instant::now(),
                },
            );
        }
        let platform = self
            .snapshot
            .get()
            .account(account)
            .map(|a| a.platform.as_str())
            .unwrap_or("unknown");
        self.metrics
            .sticky
            .with_label_values(&[result, platform])
            .inc();
        Ok(result)
    }

    /// Binds a response id to its account without a client key (an older relay's binding):
    /// found only by requests without a key, refused to none.
    pub async fn bind_response(
        &self,
        response_id: &str,
        account: AccountId,
    ) -> Result<(), SelectorError> {
        self.bind_response_for_key(0, response_id, account).await
    }

    /// Binds a response id to the account that produced it, for the client key it was made for
    /// (`api_key_id`; 0: none): only that key's requests continue it on the account, another
    /// key's are refused (`response_of_another_key`).
    pub async fn bind_response_for_key(
        &self,
        api_key_id: i64,
        response_id: &str,
        account: AccountId,
    ) -> Result<(), SelectorError> {
        let ttl = millis(self.settings.response_ttl);
        let unavailable = |e: BackendError| SelectorError::Unavailable(e.to_string());
        // The key's own binding first: a mark without it would refuse the key its own response.
        self.health
            .response_set(&scoped_response(api_key_id, response_id), account, ttl)
            .await
            .map_err(unavailable)?;
        if api_key_id != 0 {
            self.health
                .response_set(&marked_response(response_id), account, ttl)
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    /// Whether the query's `previous_response_id` was bound by poolgate for another client key:
    /// such a request is refused and never reaches an account (the upstream serves any response
    /// id of its organisation to whoever holds the credential). An id poolgate never bound
    /// passes, as does a query without a key (an older relay). A binding that cannot be read is
    /// an error: the request is not sent on a guess.
    pub async fn response_of_another_key(
        &self,
        query: &SelectQuery,
    ) -> Result<bool, SelectorError> {
        let Some(response_id) = query
            .previous_response_id
            .as_deref()
            .filter(|_| query.api_key_id != 0)
        else {
            return Ok(false);
        };
        let unavailable = |e: BackendError| SelectorError::Unavailable(e.to_string());
        let own = self
            .health
            .response_get(&scoped_response(query.api_key_id, response_id))
            .await
            .map_err(unavailable)?;
        if own.is_some() {
            return Ok(false);
        }
        let bound = self
            .health
            .response_get(&marked_response(response_id))
            .await
            .map_err(unavailable)?;
        Ok(bound.is_some())
    }

    /// Checks a client key against the snapshot (a revoked key is refused once the snapshot has
    /// reloaded, within a second of the change).
    pub fn authenticate(&self, api_key: &str) -> Result<ApiKeyRecord, SelectorError> {
        let snapshot = self.snapshot.get();
        match snapshot.api_key(&api_key_hash(api_key)) {
            Some(record) if record.active => Ok(record.clone()),
            Some(_) => Err(SelectorError::Unauthenticated("api key revoked".into())),
            None => Err(SelectorError::Unauthenticated("unknown api key".into())),
        }
    }

    /// Clears an account's blocks and breaker (operator action), and this replica's cached
    /// readings so the change shows at once.
    pub async fn clear_blocks(&self, id: AccountId) -> Result<(), SelectorError> {
        self.health
            .clear(id)
            .await
            .map_err(|e| SelectorError::Unavailable(e.to_string()))?;
        self.load_cache.invalidate();
        Ok(())
    }

    /// Reads the config anew and serves from it (after an operator's change, so the answer
    /// shows it).
    pub async fn reload(&self) -> Result<(), SelectorError> {
        let ticket = self.snapshot.ticket();
        let snapshot = self.source.load_snapshot().await?;
        self.snapshot.set(ticket, snapshot);
        Ok(())
    }

    /// Puts an account back to active (operator action): its status, its blocks and breaker.
    pub async fn restore(&self, id: AccountId) -> Result<Arc<Account>, SelectorError> {
        self.source
            .set_status(id, AccountStatus::Active, "restored by operator")
            .await?;
        self.clear_blocks(id).await?;
        self.reload().await?;
        self.snapshot
            .get()
            .account(id)
            .cloned()
            .ok_or_else(|| SelectorError::NotFound(format!("no account {id}")))
    }

    /// Every block of every account, ascending by account.
    pub async fn blocks(&self) -> Result<Vec<BlockInfo>, SelectorError> {
        let mut ids: Vec<AccountId> = self.snapshot.get().accounts().map(|a| a.id).collect();
        ids.sort_unstable();
        self.health
            .list_blocks(&ids)
            .await
            .map_err(|e| SelectorError::Unavailable(e.to_string()))
    }

    /// Live lease counts of accounts (`None`: unknown), fresh.
    pub async fn load(&self, ids: &[AccountId]) -> Vec<Option<u32>> {
        let reading = self.load_cache.read(ids, true).await;
        ids.iter()
            .map(|id| reading.get(*id).and_then(|h| h.inflight))
            .collect()
    }
}

/// A broken outcome: a hard block, and one more count toward the breaker.
pub(crate) async fn apply_broken(
    health: &dyn HealthStore,
    metrics: &Metrics,
    blocks: &RuntimeBlockSettings,
    id: AccountId,
    block_ms: u64,
    status: u16,
    reason: &str,
) -> Result<Applied, BackendError> {
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
                what: "breaker_open",
                block_ms: ms,
            }
        }
        _ => Applied {
            what: "hard_block",
            block_ms: left,
        },
    })
}

impl Plan {
    fn none(reason: NoneReason, retry_after_ms: u64) -> Self {
        Plan {
            entries: Vec::new(),
            sticky: false,
            none_reason: Some(reason),
            retry_after_ms,
            usage_headers_to_clients: false,
        }
    }
}
