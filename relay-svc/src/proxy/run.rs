//! One client request's way through the pool (docs/DESIGN.md §6) as a type: [`RequestRun`] holds
//! what the request has learned so far — the accounts it excluded, its failures and acquires,
//! the upstream models that answered 404, the tokens the selector refreshed for it, whether a
//! subscription refused it as another client's — and moves through three steps, each answering
//! go on, plan again, or the answer: [`plan`](RequestRun::plan) (select, and what the request
//! may not use of the plan), [`lease`](RequestRun::lease) (the plan's accounts in order, then a
//! wait on the best), [`outcome`](RequestRun::outcome) (what one account's answer means: served,
//! the client's own error, or a failure to report and fail over from). The upstream call between
//! lease and outcome is `call.rs`'s.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use poolgate_core::account::{CredentialKind, Secret, Service};
use poolgate_core::classify::UpstreamError;
use poolgate_core::lease::{Denial, DenyReason};
use poolgate_core::outcome::OutcomeClass;
use poolgate_core::select::NoneReason;

use super::{Answer, Body, Called, Inbound, Relay, auth, headers};
use crate::client_api::{Api, ErrorKind, RelayError};
use crate::ports::{Acquired, KeyLimit, Lease, Plan, PlanRequest, PlannedAccount};

/// Same-account retries with a refreshed token, per account and request.
const REFRESHED_RETRIES: u32 = 2;

/// Where a step leaves the request.
pub(super) enum Step<T> {
    /// On to the next step with this.
    Go(T),
    /// Back to planning (after any pause the step took).
    Again,
    /// Over: this is the client's answer.
    Answer(Answer),
}

/// Why the pool could not serve a request now (every account busy, blocked, broken or out),
/// as opposed to the caller's own limits or the request itself: what an embeddings batch is
/// answered 429 for, and what lets a rerank request degrade (docs/DESIGN.md §6, "Embeddings and
/// rerank").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PoolOut {
    /// `busy`, `failed`, or the empty plan's reason (`no_accounts`, `all_blocked`, …).
    pub reason: &'static str,
    /// The soonest an account is known to have room again, ms from now; 0: not known.
    pub retry_after_ms: u64,
}

/// What a refused acquire means for the request.
enum Refusal {
    /// The caller's own limit (its user's RPM, its key's TPM or budget): the answer, whatever
    /// account is asked.
    Answer(Answer),
    /// The key holds as many leases as it may: no other account has room for it either.
    KeyFull(Denial),
    /// This account's: another may take the request.
    Account(DenyReason, u64),
}

/// One client request between its plans and its answer.
pub(super) struct RequestRun<'a> {
    relay: &'a Arc<Relay>,
    inbound: &'a Inbound,
    api: Api,
    deadline: Instant,
    /// Accounts not to plan again: failed, or whose lease was lost.
    exclude: Vec<i64>,
    failures: u32,
    acquires: u32,
    /// The user's RPM was charged (with the first lease, or count_tokens' own rate).
    user_charged: bool,
    last_failure: Option<Failure>,
    /// Upstream models that answered 404: the request fails over only to an account that maps
    /// the client's model to a different upstream model.
    not_found_models: Vec<String>,
    /// OAuth accounts whose refused token the selector had refreshed (for this request or
    /// before it): retried with the stored token, at most `REFRESHED_RETRIES` times each.
    refreshed: HashMap<i64, (Secret, u32)>,
    /// A subscription account refused the request as another client's (third-party) traffic:
    /// every subscription account of the platform would answer the same, so the rest of the
    /// request goes to API-key accounts only.
    no_subscriptions: bool,
    /// The request ended because the pool could not serve it now.
    pub(super) out: Option<PoolOut>,
    /// The soonest time a failed account's answer said it resets (ms since the epoch).
    failure_reset_at_ms: Option<i64>,
    /// The group's rerank passthrough setting, from its last plan.
    pub(super) group_rerank_passthrough: bool,
}

impl<'a> RequestRun<'a> {
    pub(super) fn new(relay: &'a Arc<Relay>, inbound: &'a Inbound, started: Instant) -> Self {
        RequestRun {
            relay,
            inbound,
            api: inbound.api,
            // Embeddings and rerank wait in no queue: a batch the pool cannot take now goes back
            // to its client's queue, and a rerank answers at once (docs/DESIGN.md §6).
            deadline: if inbound.service == Service::Chat {
                started + relay.settings.max_wait
            } else {
                started
            },
            exclude: Vec::new(),
            failures: 0,
            acquires: 0,
            user_charged: false,
            last_failure: None,
            not_found_models: Vec::new(),
            refreshed: HashMap::new(),
            no_subscriptions: false,
            out: None,
            failure_reset_at_ms: None,
            group_rerank_passthrough: false,
        }
    }

    /// The soonest an account is known to have room again, ms from now (0: not known): `known`
    /// (an empty plan's, an admission refusal's) or a failed answer's reset, whichever is first.
    fn soonest_room_ms(&self, known: u64) -> u64 {
        let failed = self.failure_reset_at_ms.map_or(0, |at| {
            u64::try_from(at.saturating_sub(self.relay.clock.wall_ms())).unwrap_or(0)
        });
        match (known, failed) {
            (0, ms) | (ms, 0) => ms,
            (a, b) => a.min(b),
        }
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Ends the request with the last upstream error as it came, when an account answered one
    /// (it tells the client more than a refusal of ours), else `otherwise`.
    fn last_error_or(&mut self, otherwise: impl FnOnce() -> Answer) -> Answer {
        match self.last_failure.take() {
            Some(failure) => failure.into_answer(),
            None => otherwise(),
        }
    }

    /// Asks the selector for a plan and keeps of it what this request may use. An empty plan
    /// pauses and plans again while a confirmation runs or every account is blocked for less
    /// than the time left; otherwise it is the answer.
    pub(super) async fn plan(&mut self) -> Step<Plan> {
        let inbound = self.inbound;
        let api = self.api;
        let asked = PlanRequest {
            api_key_id: inbound.caller.api_key_id,
            group: inbound.caller.group.clone(),
            platform: api.platform(),
            service: inbound.service,
            model: inbound.model.clone(),
            session_hash: inbound.session_hash.clone(),
            previous_response_id: inbound.previous_response_id.clone(),
            exclude: self.exclude.clone(),
            opens_conversation: inbound.opens_conversation,
        };
        let mut plan = match self.relay.selection.plan(&asked).await {
            Ok(plan) => plan,
            Err(error) => {
                tracing::warn!(%error, "selector unavailable");
                return Step::Answer(overloaded(
                    api,
                    "account selection is unavailable; try again",
                ));
            }
        };
        self.group_rerank_passthrough = plan.rerank_passthrough;
        if plan.previous_response_other_key {
            let id = inbound.previous_response_id.as_deref().unwrap_or_default();
            return Step::Answer(auth::previous_response_refusal(api, id));
        }
        for planned in plan.accounts.iter_mut() {
            if let Some((fresh, _)) = self.refreshed.get(&planned.id) {
                planned.credential = fresh.clone();
            }
        }
        // ChatGPT subscription accounts serve the Responses API only.
        if inbound.path != "/v1/responses" {
            plan.accounts
                .retain(|a| a.credential_kind != CredentialKind::ChatGptOAuth);
        }
        if self.no_subscriptions {
            plan.accounts.retain(|a| !a.credential_kind.is_oauth());
        }
        // A group that keeps its subscriptions for the platform's own CLI: any other client's
        // request goes to its API-key accounts only.
        let cli_only = plan.subscriptions_cli_only && !headers::from_platform_cli(inbound);
        if cli_only && plan.accounts.iter().any(|a| a.credential_kind.is_oauth()) {
            plan.accounts.retain(|a| !a.credential_kind.is_oauth());
            if plan.accounts.is_empty() && self.last_failure.is_none() {
                return Step::Answer(subscriptions_for_the_cli_only(api));
            }
        }
        if !self.not_found_models.is_empty() {
            plan.accounts
                .retain(|a| !self.not_found_models.contains(&a.mapped_model));
        }
        // Where the operator refuses unpriced models, a key with a budget is never served at $0
        // (docs/DESIGN.md §6, "Prices"): accounts whose model has no price are left out, and a
        // plan left empty by it is refused naming the model. (count_tokens charges nothing.)
        if !inbound.ungoverned
            && inbound.caller.limits.has_budget()
            && plan.accounts.iter().any(|a| a.price.refuse_budgeted)
        {
            plan.accounts.retain(|a| !a.price.refuse_budgeted);
            if plan.accounts.is_empty() && self.last_failure.is_none() {
                self.relay
                    .metrics
                    .key_refusals
                    .with_label_values(&["unpriced"])
                    .inc();
                return Step::Answer(unpriced_model(api, &inbound.model));
            }
        }
        if !plan.accounts.is_empty() {
            return Step::Go(plan);
        }
        let blocked_for = Duration::from_millis(plan.retry_after_ms);
        let remaining = self.remaining();
        if plan.none_reason == Some(NoneReason::Confirming) && !remaining.is_zero() {
            // An account is out only while the selector confirms a suspicious answer: its
            // verdict may bring it back (a refreshed token) at any moment, so the request joins
            // the confirmation, planning again shortly until the verdict or its deadline; a
            // verdict that blocks the account ends it as below.
            let pause = if blocked_for.is_zero() {
                Duration::from_millis(poolgate_core::select::CONFIRMING_RETRY_MS)
            } else {
                blocked_for
            };
            tokio::time::sleep(pause.min(remaining)).await;
            return Step::Again;
        }
        if self.last_failure.is_none() && !blocked_for.is_zero() && blocked_for <= remaining {
            // Every account is blocked for a while: wait for the earliest to come back.
            tokio::time::sleep(blocked_for).await;
            return Step::Again;
        }
        let model = &inbound.model;
        let reason = plan.none_reason.unwrap_or(NoneReason::NoAccounts);
        if reason != NoneReason::ModelNotAllowed {
            self.out = Some(PoolOut {
                reason: if self.last_failure.is_some() {
                    "failed"
                } else {
                    reason.as_str()
                },
                retry_after_ms: self.soonest_room_ms(plan.retry_after_ms),
            });
        }
        let service = inbound.service;
        Step::Answer(self.last_error_or(|| no_plan(api, service, model, &plan)))
    }

    /// What a refused acquire means for this request (the one reading of a denial, for the
    /// plan's accounts and for the wait on the best alike).
    fn refusal(&self, denial: Denial) -> Refusal {
        // (For count_tokens the lease's user bucket is the account's cap: a sibling.)
        if denial.reason == DenyReason::UserRpm && !self.inbound.ungoverned {
            return Refusal::Answer(user_rpm_refusal(self.api, denial));
        }
        // The key's own limit: about the key, not the account, so no failover. Concurrency
        // waits like for an account; TPM and budget answer at once.
        if KeyLimit::of(denial.reason).is_some() {
            if denial.reason == DenyReason::KeyConcurrency {
                return Refusal::KeyFull(denial);
            }
            return Refusal::Answer(self.relay.key_limited(self.api, denial));
        }
        Refusal::Account(denial.reason, denial.retry_after_ms)
    }

    /// Leases an account of `plan`: each in the plan's order without waiting, then a wait on
    /// the best (the plan's first: the sticky account, else the one with most headroom) when
    /// every one was merely full.
    pub(super) async fn lease(&mut self, plan: &Plan) -> Step<(PlannedAccount, Box<dyn Lease>)> {
        let relay = self.relay;
        let inbound = self.inbound;
        let sticky = plan.sticky;
        // count_tokens: the user's own rate once, before any account's cap is asked.
        if inbound.ungoverned && !self.user_charged {
            if let Some(refusal) = relay.charge_count_tokens(inbound, &plan.accounts[0]).await {
                return Step::Answer(refusal);
            }
            self.user_charged = true;
        }
        // The key at its concurrency limit: no other account has room for it either, so the
        // request waits (below) instead of failing over.
        let mut key_full = false;
        // Accounts tried, and refused for a hard block admission holds (`cooled`).
        let (mut tried, mut cooled) = (0u32, 0u32);
        // The soonest an account refused said it has room again (0: none said).
        let mut soonest_ms = 0u64;
        for (index, account) in plan.accounts.iter().enumerate() {
            if self.acquires >= relay.settings.max_acquires {
                break;
            }
            self.acquires += 1;
            tried += 1;
            let terms = relay.terms(inbound, account, !self.user_charged, sticky && index == 0);
            match relay.leases.acquire(terms, Duration::ZERO).await {
                Ok(Acquired::Granted(lease)) => return self.leased(account.clone(), lease),
                Ok(Acquired::Denied(denial)) => match self.refusal(denial) {
                    Refusal::Answer(answer) => return Step::Answer(answer),
                    Refusal::KeyFull(_) => {
                        key_full = true;
                        break;
                    }
                    Refusal::Account(reason, retry_after_ms) => {
                        if retry_after_ms > 0 {
                            soonest_ms = match soonest_ms {
                                0 => retry_after_ms,
                                soonest => soonest.min(retry_after_ms),
                            };
                        }
                        cooled += u32::from(reason == DenyReason::Cooling);
                        relay.metrics.failover(reason.as_str(), "local");
                    }
                },
                Err(error) => {
                    tracing::warn!(%error, account_id = account.id, "admission unavailable for this acquire");
                    relay.metrics.failover("admission_unavailable", "local");
                }
            }
        }
        let remaining = self.remaining();
        if cooled > 0 && cooled == tried && !remaining.is_zero() {
            // Every account tried was hard-blocked after the selector read its health (a block
            // reaches every selector within a second): plan again shortly, and the next plan
            // says why (a confirmation is joined, as above).
            let pause = Duration::from_millis(poolgate_core::select::CONFIRMING_RETRY_MS);
            tokio::time::sleep(pause.min(remaining)).await;
            return Step::Again;
        }
        // Everything is merely full (or admission did not answer): wait on the best candidate.
        let best = &plan.accounts[0];
        if !remaining.is_zero() && self.acquires < relay.settings.max_acquires {
            self.acquires += 1;
            let terms = relay.terms(inbound, best, !self.user_charged, sticky);
            match relay.leases.acquire(terms, remaining).await {
                Ok(Acquired::Granted(lease)) => return self.leased(best.clone(), lease),
                Ok(Acquired::Denied(denial)) => match self.refusal(denial) {
                    Refusal::Answer(answer) => return Step::Answer(answer),
                    Refusal::KeyFull(denial) => {
                        return Step::Answer(relay.key_limited(self.api, denial));
                    }
                    // The key had room at the last try: what refused is the account's.
                    Refusal::Account(..) => key_full = false,
                },
                Err(_) => {}
            }
        }
        if key_full {
            // No time left to wait: the key's limit is the answer, not the pool's.
            let denial = Denial::new(DenyReason::KeyConcurrency, 0);
            return Step::Answer(relay.key_limited(self.api, denial));
        }
        let api = self.api;
        self.out = Some(PoolOut {
            reason: if self.last_failure.is_some() {
                "failed"
            } else {
                "busy"
            },
            retry_after_ms: self.soonest_room_ms(soonest_ms),
        });
        Step::Answer(
            self.last_error_or(|| overloaded(api, "every account is busy; try again shortly")),
        )
    }

    fn leased(
        &mut self,
        account: PlannedAccount,
        lease: Box<dyn Lease>,
    ) -> Step<(PlannedAccount, Box<dyn Lease>)> {
        self.user_charged = true;
        Step::Go((account, lease))
    }

    /// What one account's answer means: the client's answer (`Some`), or a failover (`None`:
    /// plan again, without the account unless the selector refreshed its token).
    pub(super) async fn outcome(
        &mut self,
        account: &PlannedAccount,
        called: Called,
    ) -> Option<Answer> {
        let relay = self.relay;
        let (classified, status, headers, body) = match called {
            Called::Served(answer) => return Some(answer),
            Called::LeaseLost(lease) => {
                // Neither the account's fault nor the upstream's: no report, no budget.
                lease.release(0.0, 0).await;
                self.exclude.push(account.id);
                relay.metrics.failover("lease_lost", "failover");
                return None;
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
                (classified, status, headers, body)
            }
        };
        if classified.class == OutcomeClass::ClientError {
            // Not the account's fault, and nothing reported: a client's request never changes
            // an account's health. The client gets the answer as it came, unless another
            // account may answer differently: one with permission (403 permission_error), one
            // that maps the model to a different upstream model (404), one whose limit of this
            // model family is not used up (a model-scoped 429: its window reading, recorded
            // from the answer's headers, keeps the family off this account), or an API-key
            // account where a subscription refused the request as another client's
            // (docs/SUBSCRIPTIONS.md).
            let subscription_refused =
                classified.is_subscription_refusal() && account.credential_kind.is_oauth();
            self.no_subscriptions |= subscription_refused;
            let not_found = status == 404;
            if not_found {
                self.not_found_models.push(account.mapped_model.clone());
            }
            let other_may_answer = subscription_refused
                || classified.is_model_limit()
                || classified.is_permission_refusal()
                || not_found;
            if !other_may_answer {
                return Some(Failure::new(status, &headers, body, account).into_answer());
            }
        } else if !self.inbound.ungoverned {
            // The status reason carries what the upstream asserted (type/code), never the
            // message, which can carry the client's input. (An ungoverned count_tokens call
            // changes no account's health.) Status 0: no upstream answer at all (the selector
            // applies a connect failure at once and confirms everything else by its probe
            // first); the body is then the relay's own, so the label is the reason.
            let no_answer = matches!(classified.label, "network" | "connect");
            let reason = if no_answer {
                classified.label.to_owned()
            } else {
                UpstreamError::parse(&body)
                    .map(|e| e.summary())
                    .unwrap_or_default()
            };
            let reported = if no_answer { 0 } else { status };
            // Which credential was refused goes with an unauthorized report (as its
            // fingerprint): the selector refreshes only a token still stored.
            let refused =
                (classified.class == OutcomeClass::Unauthorized).then_some(&account.credential);
            let fresh = relay
                .report(account.id, &classified, reported, &reason, refused)
                .await;
            let retries = self.refreshed.get(&account.id).map_or(0, |(_, n)| *n);
            if let Some(fresh) =
                fresh.filter(|fresh| *fresh != account.credential && retries < REFRESHED_RETRIES)
            {
                // The same account again, with the stored token; no budget spent.
                self.refreshed.insert(account.id, (fresh, retries + 1));
                relay.metrics.failover("401", "retry_refreshed");
                return None;
            }
        }
        self.failures += 1;
        self.exclude.push(account.id);
        if let Some(at) = classified.reset_at_ms {
            self.failure_reset_at_ms = Some(self.failure_reset_at_ms.map_or(at, |s| s.min(at)));
        }
        let failure = Failure::new(status, &headers, body, account);
        if self.failures >= relay.settings.failover_budget {
            relay.metrics.failover(classified.label, "budget_spent");
            self.out = Some(PoolOut {
                reason: "failed",
                retry_after_ms: self.soonest_room_ms(0),
            });
            return Some(failure.into_answer());
        }
        self.last_failure = Some(failure);
        relay.metrics.failover(classified.label, "failover");
        None
    }
}

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
            headers: headers::response_headers(upstream, account.usage_headers_to_clients),
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

/// 403: the group's subscription accounts serve only the platform's own CLI, and it has no
/// API-key account for other clients (docs/SUBSCRIPTIONS.md, "Other clients").
fn subscriptions_for_the_cli_only(api: Api) -> Answer {
    let cli = match api {
        Api::Anthropic => "Claude Code",
        Api::OpenAi => "Codex",
        Api::Cohere => "its platform's CLI",
    };
    Answer::Error(RelayError::new(
        api,
        ErrorKind::PermissionDenied,
        format!(
            "your group's subscription accounts serve only {cli}, and it has no API-key account for other clients"
        ),
    ))
}

/// A model without a price asked with a key that has a budget, where the operator refuses
/// unpriced models: 403 `permission_error` naming the model (not retried by the SDKs).
fn unpriced_model(api: Api, model: &str) -> Answer {
    Answer::Error(RelayError {
        openai_code: Some("model_not_priced"),
        openai_param: Some("model"),
        should_retry: Some(false),
        ..RelayError::new(
            api,
            ErrorKind::PermissionDenied,
            format!(
                "the model `{model}` has no price, and this API key has a spend budget: the operator refuses unpriced models to budgeted keys (ask for a price to be set)"
            ),
        )
    })
}

/// 503, try again in a second.
pub(super) fn overloaded(api: Api, message: &str) -> Answer {
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
fn no_plan(api: Api, service: Service, model: &str, plan: &Plan) -> Answer {
    let (kind, message) = match plan.none_reason.unwrap_or(NoneReason::NoAccounts) {
        NoneReason::ModelNotAllowed => (
            ErrorKind::NotFound,
            format!("no account in your group serves model {model:?}"),
        ),
        // Not a passing state: the group has no account for this endpoint at all.
        NoneReason::NoAccounts if service != Service::Chat => {
            let error = RelayError {
                openai_code: Some("unsupported_endpoint"),
                ..RelayError::new(
                    api,
                    ErrorKind::NotFound,
                    format!("no account in your group serves {}", service.as_str()),
                )
            };
            return Answer::Error(error);
        }
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
