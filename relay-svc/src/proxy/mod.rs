//! One client request, end to end (docs/DESIGN.md §6): select → lease (user
//! RPM on the first lease only) → upstream call → classify → same-account retry on conflict →
//! fail over within the budget → report → bind on success → spend on release, usage batched.
//! Bookkeeping runs after the last byte, off the client's latency path.
//!
//! This module is the plan → lease → call loop; `auth` checks client keys, `keys` what a key
//! may reach and its holder's view of it, `request` builds the upstream request (the header
//! rules), `call` makes one upstream call and serves a whole answer, `stream` pumps a streamed
//! one, `finish` does the bookkeeping after the last byte.

mod auth;
mod body;
mod call;
mod finish;
mod keys;
mod request;
mod stream;

use poolgate_core::keys::KeyDescription;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use poolgate_core::account::{CredentialKind, Secret};
use poolgate_core::classify::{Classified, UpstreamError};
use poolgate_core::lease::{Denial, DenyReason, LeaseTerms, UserLimit};
use poolgate_core::money::usd_to_micros;
use poolgate_core::outcome::OutcomeClass;
use poolgate_core::select::NoneReason;
use tokio::sync::mpsc;

use crate::client_api::{Api, ErrorKind, RelayError};
use crate::metrics::Metrics;
use crate::ports::{
    Acquired, Caller, KeyCheck, KeyLimit, Lease, Leases, Plan, PlanRequest, PlannedAccount,
    Selection,
};

pub use body::{BodyJsonError, MAX_DEPTH as MAX_JSON_DEPTH, TopLevel};
pub use keys::key_view;
pub use request::{HttpClientError, merged_betas, passes_upstream, request_id_header};

#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Upstream failures one request may fail over on (local refusals do not count).
    pub failover_budget: u32,
    /// Acquire attempts per request, at most.
    pub max_acquires: u32,
    /// How long a request may wait for capacity (a full pool, or blocks ending).
    pub max_wait: Duration,
    /// A streaming client waiting this long gets SSE keep-alive comments.
    pub ping_after: Duration,
    pub ping_every: Duration,
    /// Same-account retries on 409/423, and the pause before each.
    pub conflict_retries: u32,
    pub conflict_delay: Duration,
    /// A 429 reset further ahead than this is "window exhausted" (hard block).
    pub hard_block_threshold: Duration,
    /// Bound on connecting and on the response head from upstream.
    pub upstream_timeout: Duration,
    /// How long an authentication answer is reused.
    pub auth_cache_ttl: Duration,
    /// Largest request body accepted, and largest error body kept.
    pub max_body_bytes: usize,
    /// After a client disconnects, how long its slot stays held before release (the upstream
    /// counts the cancelled call until it notices the closed connection).
    pub cancel_linger: Duration,
    /// The client edge under hostile traffic (docs/SECURITY.md, "The HTTP front").
    pub edge: EdgeSettings,
}

/// Bounds on what a client connection may hold of the relay's time and memory.
#[derive(Debug, Clone)]
pub struct EdgeSettings {
    /// Longest wait for a request's headers (HTTP/1).
    pub header_read_timeout: Duration,
    /// Longest pause between two chunks of a request body.
    pub body_idle_timeout: Duration,
    /// Past `body_rate_grace`, a body must have arrived at this many bytes per second on
    /// average, or the request gets a 408 and the connection is closed.
    pub body_min_rate: u64,
    pub body_rate_grace: Duration,
    /// Request body bytes buffered across all connections at once: past it, 503.
    pub max_buffered_bytes: usize,
    /// HTTP/2: concurrent streams per connection, and resets a client may make in a row.
    pub h2_max_concurrent_streams: u32,
    pub h2_max_pending_resets: usize,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        EdgeSettings {
            header_read_timeout: Duration::from_secs(20),
            body_idle_timeout: Duration::from_secs(30),
            body_min_rate: 16 << 10,
            body_rate_grace: Duration::from_secs(10),
            max_buffered_bytes: 512 << 20,
            h2_max_concurrent_streams: 128,
            h2_max_pending_resets: 32,
        }
    }
}

impl Default for RelaySettings {
    fn default() -> Self {
        RelaySettings {
            failover_budget: 3,
            max_acquires: 8,
            max_wait: Duration::from_secs(30),
            ping_after: Duration::from_secs(10),
            ping_every: Duration::from_secs(10),
            conflict_retries: 3,
            conflict_delay: Duration::from_millis(500),
            hard_block_threshold: Duration::from_secs(60),
            upstream_timeout: Duration::from_secs(600),
            auth_cache_ttl: Duration::from_millis(500),
            max_body_bytes: 32 << 20,
            cancel_linger: Duration::from_secs(1),
            edge: EdgeSettings::default(),
        }
    }
}

/// What went wrong with the client's request itself (before any account is involved).
pub type Refusal = RelayError;

/// The head of the answer, then its body.
pub enum Answer {
    Upstream {
        status: StatusCode,
        headers: HeaderMap,
        body: Body,
    },
    Error(RelayError),
}

pub enum Body {
    Full(Bytes),
    Stream(mpsc::Receiver<Bytes>),
}

/// A parsed client request.
pub struct Inbound {
    pub api: Api,
    /// Upstream path, e.g. `/v1/messages`.
    pub path: &'static str,
    /// The client's query string, passed upstream as it came (`beta=true`).
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The body's top level, raw (`body.rs`): what the relay reads and rewrites of it.
    pub top: TopLevel,
    pub model: String,
    pub stream: bool,
    pub caller: Caller,
    pub session_hash: Option<String>,
    pub previous_response_id: Option<String>,
    /// count_tokens: no account limits, no Messages RPM, no health change; its own per-user
    /// rate and per-account cap instead (`auth.rs`).
    pub ungoverned: bool,
    /// The share of the edge's body budget `body` holds, given back with it.
    pub buffered: crate::edge::Hold,
}

pub struct Relay {
    pub selection: Arc<dyn Selection>,
    pub leases: Arc<dyn Leases>,
    pub settings: RelaySettings,
    pub metrics: Metrics,
    http: reqwest::Client,
    proxied: Mutex<HashMap<String, reqwest::Client>>,
    auth_cache: Mutex<HashMap<String, (KeyCheck, Instant)>>,
    /// Key lookups in flight at the selector: a flood of random keys (each a cache miss) waits
    /// for a permit instead of multiplying selector calls (`auth.rs`).
    auth_lookups: tokio::sync::Semaphore,
    /// Self-service descriptions by key, reused for `keys::DESCRIPTION_TTL`: each costs the
    /// selector four ledger sums, and a key holder polling its view must not load Postgres.
    descriptions: Mutex<HashMap<String, (KeyDescription, Instant)>>,
    /// Models already logged as having no price (each once; bounded).
    unpriced_models: Mutex<HashSet<String>>,
}

/// What one upstream call came to.
enum Called {
    /// 2xx: the answer is on its way to the client; bookkeeping follows its last byte.
    Served(Answer),
    /// Admission said the lease is gone for good before the first byte reached the client.
    LeaseLost(Box<dyn Lease>),
    /// A non-2xx answer (or a network failure), classified, with the body kept for passing on.
    Failed {
        classified: Classified,
        status: u16,
        headers: HeaderMap,
        body: Bytes,
        lease: Box<dyn Lease>,
    },
}

impl Relay {
    pub fn new(
        selection: Arc<dyn Selection>,
        leases: Arc<dyn Leases>,
        settings: RelaySettings,
        metrics: Metrics,
    ) -> Result<Self, HttpClientError> {
        Ok(Relay {
            http: request::build_client(settings.upstream_timeout, None)?,
            selection,
            leases: Arc::new(crate::ports::Lingering::new(leases, settings.cancel_linger)),
            settings,
            metrics,
            proxied: Mutex::new(HashMap::new()),
            auth_cache: Mutex::new(HashMap::new()),
            auth_lookups: tokio::sync::Semaphore::new(auth::MAX_KEY_LOOKUPS),
            descriptions: Mutex::new(HashMap::new()),
            unpriced_models: Mutex::new(HashSet::new()),
        })
    }

    /// Runs the request to its answer; one that reached an upstream is timed in
    /// `relay_added_seconds` (all of its time here but its upstream calls).
    pub async fn run(self: Arc<Self>, inbound: Inbound) -> Answer {
        let started = Instant::now();
        let platform = inbound.api.platform();
        let mut upstream = UpstreamTime::default();
        let answer = self
            .clone()
            .plan_and_call(inbound, started, &mut upstream)
            .await;
        if upstream.calls > 0 {
            self.metrics.added_latency(
                platform.as_str(),
                started.elapsed().saturating_sub(upstream.spent),
            );
        }
        answer
    }

    /// select → lease → call → fail over, to the answer.
    async fn plan_and_call(
        self: Arc<Self>,
        inbound: Inbound,
        started: Instant,
        upstream: &mut UpstreamTime,
    ) -> Answer {
        let api = inbound.api;
        let deadline = started + self.settings.max_wait;
        let mut exclude: Vec<i64> = Vec::new();
        let mut failures = 0u32;
        let mut acquires = 0u32;
        let mut user_charged = false;
        let mut last_failure: Option<Failure> = None;
        // Upstream models that answered 404: the request fails over only to an account that
        // maps the client's model to a different upstream model.
        let mut not_found_models: Vec<String> = Vec::new();
        // OAuth accounts whose refused token the selector had refreshed (for this request or
        // before it): retried with the stored token, at most `REFRESHED_RETRIES` times each.
        let mut refreshed: HashMap<i64, (Secret, u32)> = HashMap::new();
        // A subscription account refused the request as another client's (third-party)
        // traffic: every subscription account of the platform would answer the same, so the
        // rest of the request goes to API-key accounts only.
        let mut no_subscriptions = false;
        loop {
            let plan = match self
                .selection
                .select(&PlanRequest {
                    api_key_id: inbound.caller.api_key_id,
                    group: inbound.caller.group.clone(),
                    platform: api.platform(),
                    model: inbound.model.clone(),
                    session_hash: inbound.session_hash.clone(),
                    previous_response_id: inbound.previous_response_id.clone(),
                    exclude: exclude.clone(),
                })
                .await
            {
                Ok(plan) => plan,
                Err(error) => {
                    tracing::warn!(%error, "selector unavailable");
                    return overloaded(api, "account selection is unavailable; try again");
                }
            };
            if plan.previous_response_other_key {
                let id = inbound.previous_response_id.as_deref().unwrap_or_default();
                return auth::previous_response_refusal(api, id);
            }
            let mut plan = plan;
            for planned in plan.accounts.iter_mut() {
                if let Some((fresh, _)) = refreshed.get(&planned.id) {
                    planned.credential = fresh.clone();
                }
            }
            // ChatGPT subscription accounts serve the Responses API only.
            if inbound.path != "/v1/responses" {
                plan.accounts
                    .retain(|a| a.credential_kind != CredentialKind::ChatGptOAuth);
            }
            if no_subscriptions {
                plan.accounts.retain(|a| !a.credential_kind.is_oauth());
            }
            // A group that keeps its subscriptions for the platform's own CLI: any other
            // client's request goes to its API-key accounts only.
            let cli_only = plan.subscriptions_cli_only && !request::from_platform_cli(&inbound);
            if cli_only && plan.accounts.iter().any(|a| a.credential_kind.is_oauth()) {
                plan.accounts.retain(|a| !a.credential_kind.is_oauth());
                if plan.accounts.is_empty() && last_failure.is_none() {
                    return subscriptions_for_the_cli_only(api);
                }
            }
            if !not_found_models.is_empty() {
                plan.accounts
                    .retain(|a| !not_found_models.contains(&a.mapped_model));
            }
            if plan.accounts.is_empty() {
                let blocked_for = Duration::from_millis(plan.retry_after_ms);
                let remaining = deadline.saturating_duration_since(Instant::now());
                if plan.none_reason == Some(NoneReason::Confirming) && !remaining.is_zero() {
                    // An account is out only while the selector confirms a suspicious answer:
                    // its verdict may bring it back (a refreshed token) at any moment, so the
                    // request joins the confirmation, planning again shortly until the verdict
                    // or its deadline; a verdict that blocks the account ends it as below.
                    let pause = if blocked_for.is_zero() {
                        Duration::from_millis(poolgate_core::select::CONFIRMING_RETRY_MS)
                    } else {
                        blocked_for
                    };
                    tokio::time::sleep(pause.min(remaining)).await;
                    continue;
                }
                if last_failure.is_none()
                    && !blocked_for.is_zero()
                    && blocked_for <= deadline.saturating_duration_since(Instant::now())
                {
                    // Every account is blocked for a while: wait for the earliest to come back.
                    tokio::time::sleep(blocked_for).await;
                    continue;
                }
                return last_error_or(last_failure, || no_plan(api, &inbound.model, &plan));
            }
            let sticky = plan.sticky;
            let mut leased = None;
            let mut refused_all = true;
            // The key at its concurrency limit: no other account has room for it either, so
            // the request waits (below) instead of failing over.
            let mut key_full = false;
            // Accounts tried, and refused for a hard block admission holds (`cooled`).
            let (mut tried, mut cooled) = (0u32, 0u32);
            // count_tokens: the user's own rate once, before any account's cap is asked.
            if inbound.ungoverned && !user_charged {
                if let Some(refusal) = self.charge_count_tokens(&inbound, &plan.accounts[0]).await {
                    return refusal;
                }
                user_charged = true;
            }
            for (index, account) in plan.accounts.iter().enumerate() {
                if acquires >= self.settings.max_acquires {
                    break;
                }
                acquires += 1;
                tried += 1;
                let terms = self.terms(&inbound, account, !user_charged, sticky && index == 0);
                match self.leases.acquire(terms, Duration::ZERO).await {
                    Ok(Acquired::Granted(lease)) => {
                        leased = Some((account.clone(), lease));
                        refused_all = false;
                        break;
                    }
                    // (For count_tokens the lease's user bucket is the account's cap: a sibling.)
                    Ok(Acquired::Denied(denial))
                        if denial.reason == DenyReason::UserRpm && !inbound.ungoverned =>
                    {
                        return user_rpm_refusal(api, denial);
                    }
                    // The key's own limit: about the key, not the account, so no failover.
                    // Concurrency waits like for an account; TPM and budget answer at once.
                    Ok(Acquired::Denied(denial)) if KeyLimit::of(denial.reason).is_some() => {
                        if denial.reason != DenyReason::KeyConcurrency {
                            return self.key_limited(api, denial);
                        }
                        key_full = true;
                        break;
                    }
                    Ok(Acquired::Denied(denial)) => {
                        cooled += u32::from(denial.reason == DenyReason::Cooling);
                        self.metrics.failover(denial.reason.as_str(), "local");
                    }
                    Err(error) => {
                        tracing::warn!(%error, account_id = account.id, "admission unavailable for this acquire");
                        self.metrics.failover("admission_unavailable", "local");
                    }
                }
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if leased.is_none() && cooled > 0 && cooled == tried && !remaining.is_zero() {
                // Every account tried was hard-blocked after the selector read its health (a
                // block reaches every selector within a second): plan again shortly, and the
                // next plan says why (a confirmation is joined, as above).
                let pause = Duration::from_millis(poolgate_core::select::CONFIRMING_RETRY_MS);
                tokio::time::sleep(pause.min(remaining)).await;
                continue;
            }
            if leased.is_none() && refused_all {
                // Everything is merely full: wait on the best candidate (the plan's first: the
                // sticky account, else the one with most headroom).
                let remaining = deadline.saturating_duration_since(Instant::now());
                let best = &plan.accounts[0];
                if !remaining.is_zero() && acquires < self.settings.max_acquires {
                    acquires += 1;
                    let terms = self.terms(&inbound, best, !user_charged, sticky);
                    match self.leases.acquire(terms, remaining).await {
                        Ok(Acquired::Granted(lease)) => leased = Some((best.clone(), lease)),
                        Ok(Acquired::Denied(denial))
                            if denial.reason == DenyReason::UserRpm && !inbound.ungoverned =>
                        {
                            return user_rpm_refusal(api, denial);
                        }
                        Ok(Acquired::Denied(denial)) if KeyLimit::of(denial.reason).is_some() => {
                            return self.key_limited(api, denial);
                        }
                        // The key had room at the last try: what refused is the account's.
                        Ok(Acquired::Denied(_)) => key_full = false,
                        Err(_) => {}
                    }
                }
                if leased.is_none() && key_full {
                    // No time left to wait: the key's limit is the answer, not the pool's.
                    return self.key_limited(api, Denial::new(DenyReason::KeyConcurrency, 0));
                }
                if leased.is_none() {
                    return last_error_or(last_failure, || {
                        overloaded(api, "every account is busy; try again shortly")
                    });
                }
            }
            let Some((account, lease)) = leased else {
                // The acquire budget ran out.
                return last_error_or(last_failure, || {
                    overloaded(api, "no capacity in time; try again")
                });
            };
            user_charged = true;
            match self
                .clone()
                .call_with_retries(&inbound, &account, lease, started, upstream)
                .await
            {
                Called::Served(answer) => return answer,
                Called::LeaseLost(lease) => {
                    // Neither the account's fault nor the upstream's: no report, no budget.
                    lease.release(0.0, 0).await;
                    exclude.push(account.id);
                    self.metrics.failover("lease_lost", "failover");
                }
                Called::Failed {
                    classified,
                    status,
                    headers,
                    body,
                    lease,
                } => {
                    // Spent nothing: the failed answer is not charged (no usage record either).
                    lease.release(0.0, 0).await;
                    if classified.class == OutcomeClass::ClientError {
                        // Not the account's fault, and nothing reported: a client's request
                        // never changes an account's health. The client gets the answer as it
                        // came, unless another account may answer differently: one with
                        // permission (403 permission_error), one that maps the model to a
                        // different upstream model (404), one whose limit of this model family
                        // is not used up (a model-scoped 429: its window reading, recorded from
                        // the answer's headers, keeps the family off this account), or an
                        // API-key account where a subscription refused the request as
                        // another client's (docs/SUBSCRIPTIONS.md).
                        let subscription_refused = classified.is_subscription_refusal()
                            && account.credential_kind.is_oauth();
                        no_subscriptions |= subscription_refused;
                        let other_may_answer = subscription_refused
                            || classified.is_model_limit()
                            || classified.is_permission_refusal()
                            || (status == 404 && {
                                not_found_models.push(account.mapped_model.clone());
                                true
                            });
                        if !other_may_answer {
                            return Failure::new(status, &headers, body, &account).into_answer();
                        }
                    } else if !inbound.ungoverned {
                        // The status reason carries what the upstream asserted (type/code),
                        // never the message, which can carry the client's input. (An
                        // ungoverned count_tokens call changes no account's health.)
                        // Status 0: no upstream answer at all (the selector applies a connect
                        // failure at once and confirms everything else by its probe first);
                        // the body is then the relay's own, so the label is the reason.
                        let no_answer = matches!(classified.label, "network" | "connect");
                        let reason = if no_answer {
                            classified.label.to_owned()
                        } else {
                            UpstreamError::parse(&body)
                                .map(|e| e.summary())
                                .unwrap_or_default()
                        };
                        let reported = if no_answer { 0 } else { status };
                        if classified.class == OutcomeClass::Unauthorized {
                            // Which credential was refused goes with the report (as its
                            // fingerprint): the selector refreshes only a token still stored.
                            let fresh = self
                                .selection
                                .report_refused(
                                    account.id,
                                    classified,
                                    reported,
                                    &reason,
                                    &account.credential,
                                )
                                .await;
                            let retries = refreshed.get(&account.id).map_or(0, |(_, n)| *n);
                            if let Some(fresh) = fresh.filter(|fresh| {
                                *fresh != account.credential && retries < REFRESHED_RETRIES
                            }) {
                                // The same account again, with the stored token; no budget
                                // spent.
                                refreshed.insert(account.id, (fresh, retries + 1));
                                self.metrics.failover("401", "retry_refreshed");
                                continue;
                            }
                        } else {
                            self.selection
                                .report(account.id, classified, reported, &reason)
                                .await;
                        }
                    }
                    failures += 1;
                    exclude.push(account.id);
                    let failure = Failure::new(status, &headers, body, &account);
                    if failures >= self.settings.failover_budget {
                        self.metrics.failover(classified.label, "budget_spent");
                        return failure.into_answer();
                    }
                    last_failure = Some(failure);
                    self.metrics.failover(classified.label, "failover");
                }
            }
        }
    }

    fn terms(
        &self,
        inbound: &Inbound,
        account: &PlannedAccount,
        charge_user: bool,
        bound: bool,
    ) -> LeaseTerms {
        let caller = &inbound.caller;
        LeaseTerms {
            account_id: account.id,
            concurrency_limit: if inbound.ungoverned {
                0
            } else {
                account.concurrency_limit
            },
            rpm_limit: if inbound.ungoverned {
                0
            } else {
                account.rpm_limit
            },
            // count_tokens takes no account limit and no Messages RPM: its user's rate was
            // charged apart (`charge_count_tokens`), and the user bucket here is the account's
            // count_tokens cap, so it cannot hammer one upstream.
            user: if inbound.ungoverned {
                Some(UserLimit {
                    user_id: auth::count_tokens_account_bucket(account.id),
                    rpm_limit: auth::COUNT_TOKENS_ACCOUNT_RPM,
                })
            } else {
                (charge_user && caller.user_rpm_limit > 0).then(|| UserLimit {
                    user_id: caller.user.clone(),
                    rpm_limit: caller.user_rpm_limit,
                })
            },
            session_hash: inbound.session_hash.clone(),
            session_window_limit_micros: if inbound.ungoverned {
                0
            } else {
                usd_to_micros(account.session_window_limit_usd.max(0.0)).unwrap_or(0)
            },
            session_bound: bound,
            ignore_cooldown: false,
            // count_tokens holds no slot of the key and charges it nothing: its budget and TPM
            // were asked once, with the user's rate (`charge_count_tokens`).
            key: if inbound.ungoverned {
                None
            } else {
                caller.key_limits()
            },
        }
    }

    /// The answer to a request its key's own limit refused (docs/DESIGN.md §4): nothing was
    /// leased, reported or recorded, and no upstream was called. Counted by limit, never by key.
    fn key_limited(&self, api: Api, denial: Denial) -> Answer {
        let Some(limit) = KeyLimit::of(denial.reason) else {
            return overloaded(api, "every account is busy; try again shortly");
        };
        self.metrics.key_limited(limit);
        tracing::debug!(limit = limit.as_str(), "client key limit reached");
        Answer::Error(RelayError::key_limit(
            api,
            limit,
            denial.retry_after_ms,
            poolgate_core::now_ms(),
        ))
    }

    /// Calls one account, retrying the same account on conflicts (keeping the lease).
    async fn call_with_retries(
        self: Arc<Self>,
        inbound: &Inbound,
        account: &PlannedAccount,
        mut lease: Box<dyn Lease>,
        started: Instant,
        upstream: &mut UpstreamTime,
    ) -> Called {
        let mut retries = 0;
        loop {
            match self
                .clone()
                .call(inbound, account, lease, started, upstream)
                .await
            {
                Called::Failed {
                    classified,
                    status,
                    headers,
                    body,
                    lease: mut returned,
                } if classified.class == OutcomeClass::Conflict
                    && retries < self.settings.conflict_retries =>
                {
                    retries += 1;
                    tokio::time::sleep(self.settings.conflict_delay).await;
                    self.metrics.same_account_retries.inc();
                    if !returned.attempt().await {
                        // The account's RPM refused the retry: try a sibling.
                        self.metrics.failover("rpm", "local");
                        return Called::Failed {
                            classified,
                            status,
                            headers,
                            body,
                            lease: returned,
                        };
                    }
                    self.metrics.failover("same_account", "retry");
                    lease = returned;
                }
                other => return other,
            }
        }
    }
}

/// The time one request spent in upstream calls; `relay_added_seconds` is the rest of its time
/// in the relay (docs/METRICS.md).
#[derive(Debug, Default)]
struct UpstreamTime {
    spent: Duration,
    calls: u32,
}

impl UpstreamTime {
    /// An upstream call sent at `sent` is over as far as the relay waits on it: its failure, its
    /// error answer read, a streamed answer's first byte, or a whole answer's last byte.
    fn ended(&mut self, sent: Instant) {
        self.spent += sent.elapsed();
        self.calls += 1;
    }
}

/// Same-account retries with a refreshed token, per account and request.
const REFRESHED_RETRIES: u32 = 2;

/// An upstream error answer, kept to pass on to the client as it came.
struct Failure {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
}

impl Failure {
    /// An account's error answer, with the headers its client may see.
    fn new(status: u16, upstream: &HeaderMap, body: Bytes, account: &PlannedAccount) -> Self {
        Failure {
            status,
            headers: request::response_headers(upstream, account.usage_headers_to_clients),
            body,
        }
    }

    fn into_answer(self) -> Answer {
        Answer::Upstream {
            status: StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_GATEWAY),
            headers: self.headers,
            body: Body::Full(self.body),
        }
    }
}

/// Ends a request no account will serve: with the last upstream error as it came, when an
/// account answered one (it tells the client more than a refusal of ours), else `otherwise`.
fn last_error_or(last_failure: Option<Failure>, otherwise: impl FnOnce() -> Answer) -> Answer {
    match last_failure {
        Some(failure) => failure.into_answer(),
        None => otherwise(),
    }
}

/// 403: the group's subscription accounts serve only the platform's own CLI, and it has no
/// API-key account for other clients (docs/SUBSCRIPTIONS.md, "Other clients").
fn subscriptions_for_the_cli_only(api: Api) -> Answer {
    let cli = match api {
        Api::Anthropic => "Claude Code",
        Api::OpenAi => "Codex",
    };
    Answer::Error(RelayError::new(
        api,
        ErrorKind::PermissionDenied,
        format!(
            "your group's subscription accounts serve only {cli}, and it has no API-key account for other clients"
        ),
    ))
}

/// 503, try again in a second.
fn overloaded(api: Api, message: &str) -> Answer {
    Answer::Error(RelayError::new(api, ErrorKind::Overloaded, message).retry_after_ms(1000))
}

/// 429: the caller's own per-minute limit, whichever account was asked.
fn user_rpm_refusal(api: Api, denial: Denial) -> Answer {
    Answer::Error(
        RelayError::new(
            api,
            ErrorKind::RateLimited,
            "you sent too many requests this minute",
        )
        .retry_after_ms(denial.retry_after_ms.max(1000)),
    )
}

/// The answer to a request whose plan is empty, from why: 404 for a model no account of the
/// group allows, 503 otherwise (retry when the earliest block ends, at least a second on; a
/// confirmation still running at the request's deadline included).
fn no_plan(api: Api, model: &str, plan: &Plan) -> Answer {
    let (kind, message) = match plan.none_reason.unwrap_or(NoneReason::NoAccounts) {
        NoneReason::ModelNotAllowed => (
            ErrorKind::NotFound,
            format!("no account in your group serves model {model:?}"),
        ),
        NoneReason::NoAccounts => (
            ErrorKind::Overloaded,
            "no account in your group serves this API".to_owned(),
        ),
        reason @ (NoneReason::AllBlocked
        | NoneReason::AllExcluded
        | NoneReason::BreakerOpen
        | NoneReason::Confirming) => (
            ErrorKind::Overloaded,
            format!(
                "no capacity in the pool ({}); try again later",
                reason.as_str()
            ),
        ),
    };
    let retry = plan.retry_after_ms.max(1000);
    Answer::Error(RelayError::new(api, kind, message).retry_after_ms(retry))
}
