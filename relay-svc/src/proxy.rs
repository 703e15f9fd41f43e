//! One client request, end to end (DESIGN §6): select → lease (user RPM on the first lease only)
//! → upstream call → classify → same-account retry on conflict → fail over within the budget →
//! report → bind on success → spend on release, usage batched. Bookkeeping runs after the last
//! byte, off the client's latency path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use poolgate_core::account::{CredentialKind, Price, chatgpt_account_id};
use poolgate_core::lease::{DenyReason, LeaseTerms, UserLimit};
use poolgate_core::money::usd_to_micros;
use poolgate_core::now_ms;
use poolgate_core::outcome::OutcomeClass;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::api::{Api, ErrorKind, RelayError};
use crate::backends::{
    Acquired, Caller, Lease, Leases, PlanRequest, Planned, Selection, UsageRecord,
};
use crate::metrics::Metrics;
use crate::usage::{ChatUsageStripper, SseScanner, Usage, completed_response};
use poolgate_core::classify::{
    Classified, UpstreamError, classify, classify_stream_error, network_failure,
};
use poolgate_core::upstream::{CLAUDE_CODE_IDENTITY, chatgpt_responses_url, upstream_url};

#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Upstream failures one request may fail over on (local refusals do not count).
    pub failover_budget: u32,
    /// Acquire attempts per request, at most (seed 001).
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
    pub json: Value,
    pub model: String,
    pub stream: bool,
    pub caller: Caller,
    pub session_hash: Option<String>,
    pub previous_response_id: Option<String>,
    /// Requests that cost nothing and take no lease (count_tokens).
    pub ungoverned: bool,
}

pub struct Relay {
    pub selection: Arc<dyn Selection>,
    pub leases: Arc<dyn Leases>,
    pub settings: RelaySettings,
    pub metrics: Metrics,
    http: reqwest::Client,
    proxied: Mutex<HashMap<String, reqwest::Client>>,
    auth_cache: Mutex<HashMap<String, (Option<Caller>, Instant)>>,
    /// Models already logged as having no price (each once; bounded).
    unpriced_models: Mutex<std::collections::HashSet<String>>,
}

/// Request headers passed upstream as they are: what the official SDKs and CLIs send (Claude
/// Code: `anthropic-*`, `x-app`, `x-stainless-*`, `x-claude-code-session-id`; Codex: `originator`,
/// `session-id`, `thread-id`, `x-client-request-id`, `x-codex-*`). Everything else (credentials,
/// cookies, hop-by-hop, encodings, `host`) is dropped or set by the relay.
const PASSED_HEADERS: [&str; 11] = [
    "content-type",
    "accept",
    "user-agent",
    "idempotency-key",
    "openai-beta",
    "originator",
    "session-id",
    "session_id",
    "thread-id",
    "x-client-request-id",
    "x-app",
];

/// Header prefixes passed upstream (`anthropic-beta` is merged with the account's own betas).
const PASSED_PREFIXES: [&str; 4] = ["anthropic-", "x-stainless-", "x-codex-", "x-claude-code-"];

/// Whether a client's request header goes upstream.
pub fn passes_upstream(name: &str) -> bool {
    PASSED_HEADERS.contains(&name)
        || (PASSED_PREFIXES.iter().any(|p| name.starts_with(p)) && name != "anthropic-beta")
}

/// The `anthropic-beta` value sent upstream: the client's betas (every header line, comma
/// lists) and the account's own, each once, in order.
pub fn merged_betas(client: &HeaderMap, own: &[&str]) -> Option<String> {
    let mut betas: Vec<String> = Vec::new();
    let client_betas = client
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim);
    for beta in client_betas.chain(own.iter().copied()) {
        if !beta.is_empty() && !betas.iter().any(|b| b == beta) {
            betas.push(beta.to_owned());
        }
    }
    (!betas.is_empty()).then(|| betas.join(","))
}

/// Response headers never copied back (hop-by-hop, or re-computed).
const DROPPED_RESPONSE_HEADERS: [&str; 6] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "content-encoding",
    "keep-alive",
    "x-request-id",
];

fn build_client(timeout: Duration, proxy: Option<&str>) -> Result<reqwest::Client, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10).min(timeout))
        .read_timeout(timeout)
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true);
    if let Some(proxy) = proxy {
        builder =
            builder.proxy(reqwest::Proxy::all(proxy).map_err(|_| "bad proxy url".to_string())?);
    }
    builder.build().map_err(|e| format!("http client: {e}"))
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
    ) -> Result<Self, String> {
        Ok(Relay {
            http: build_client(settings.upstream_timeout, None)?,
            selection,
            leases: Arc::new(crate::backends::Lingering::new(
                leases,
                settings.cancel_linger,
            )),
            settings,
            metrics,
            proxied: Mutex::new(HashMap::new()),
            auth_cache: Mutex::new(HashMap::new()),
            unpriced_models: Mutex::new(std::collections::HashSet::new()),
        })
    }

    /// Authenticates a client key, reusing answers for `auth_cache_ttl` (so a revoked key is
    /// refused within a second of the change).
    pub async fn authenticate(&self, api: Api, key: Option<&str>) -> Result<Caller, RelayError> {
        let Some(key) = key.filter(|k| !k.is_empty() && k.len() <= 256) else {
            return Err(RelayError::new(
                api,
                ErrorKind::Authentication,
                "missing or malformed API key (x-api-key or Authorization: Bearer)",
            ));
        };
        {
            let cache = self.auth_cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((answer, at)) = cache.get(key)
                && at.elapsed() < self.settings.auth_cache_ttl
            {
                return answer.clone().ok_or_else(|| {
                    RelayError::new(api, ErrorKind::Authentication, "invalid API key")
                });
            }
        }
        let answer = self.selection.authenticate(key).await.map_err(|_| {
            RelayError::new(
                api,
                ErrorKind::Overloaded,
                "authentication is unavailable; try again",
            )
            .retry_after_ms(1000)
        })?;
        {
            let mut cache = self.auth_cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() > 100_000 {
                let ttl = self.settings.auth_cache_ttl;
                cache.retain(|_, (_, at)| at.elapsed() < ttl);
            }
            cache.insert(key.to_owned(), (answer.clone(), Instant::now()));
        }
        answer.ok_or_else(|| RelayError::new(api, ErrorKind::Authentication, "invalid API key"))
    }

    /// Counts an answer whose model has no price, and logs each such model once.
    fn note_unpriced(&self, model: &str) {
        self.metrics.unpriced_usage.inc();
        let mut seen = self
            .unpriced_models
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if seen.len() < 1000 && seen.insert(model.to_owned()) {
            tracing::warn!(
                model,
                "no price for this model: its usage is recorded at $0 (add a price)"
            );
        }
    }

    fn client_for(&self, proxy: Option<&str>) -> reqwest::Client {
        let Some(proxy) = proxy.filter(|p| !p.is_empty()) else {
            return self.http.clone();
        };
        let mut proxied = self.proxied.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = proxied.get(proxy) {
            return client.clone();
        }
        match build_client(self.settings.upstream_timeout, Some(proxy)) {
            Ok(client) => {
                proxied.insert(proxy.to_owned(), client.clone());
                client
            }
            Err(error) => {
                tracing::warn!(%error, "account proxy unusable; calling directly");
                self.http.clone()
            }
        }
    }

    /// Runs the request to its answer.
    pub async fn run(self: Arc<Self>, inbound: Inbound) -> Answer {
        let api = inbound.api;
        let started = Instant::now();
        let deadline = started + self.settings.max_wait;
        let mut exclude: Vec<i64> = Vec::new();
        let mut failures = 0u32;
        let mut acquires = 0u32;
        let mut user_charged = false;
        let mut last_failure: Option<(u16, HeaderMap, Bytes)> = None;
        // Upstream models that answered 404: the request fails over only to an account that
        // maps the client's model to a different upstream model.
        let mut not_found_models: Vec<String> = Vec::new();
        // OAuth accounts whose refused token the selector refreshed for this request: retried
        // once with the new token.
        let mut refreshed: HashMap<i64, poolgate_core::account::Secret> = HashMap::new();
        loop {
            let plan = match self
                .selection
                .select(&PlanRequest {
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
                    return Answer::Error(
                        RelayError::new(
                            api,
                            ErrorKind::Overloaded,
                            "account selection is unavailable; try again",
                        )
                        .retry_after_ms(1000),
                    );
                }
            };
            let mut plan = plan;
            for planned in plan.accounts.iter_mut() {
                if let Some(fresh) = refreshed.get(&planned.id) {
                    planned.credential = fresh.clone();
                }
            }
            // ChatGPT subscription accounts serve the Responses API only.
            if inbound.path != "/v1/responses" {
                plan.accounts
                    .retain(|a| a.credential_kind != CredentialKind::ChatGptOAuth);
            }
            if !not_found_models.is_empty() {
                plan.accounts
                    .retain(|a| !not_found_models.contains(&a.mapped_model));
                if plan.accounts.is_empty()
                    && let Some((status, headers, body)) = last_failure
                {
                    return upstream_error(status, headers, body);
                }
            }
            if plan.accounts.is_empty() {
                if let Some((status, headers, body)) = last_failure {
                    return upstream_error(status, headers, body);
                }
                let reason = plan.none_reason.unwrap_or_else(|| "no_accounts".into());
                let remaining = deadline.saturating_duration_since(Instant::now());
                if plan.retry_after_ms > 0
                    && Duration::from_millis(plan.retry_after_ms) <= remaining
                {
                    // Every account is blocked for a while: wait for the earliest to come back.
                    tokio::time::sleep(Duration::from_millis(plan.retry_after_ms)).await;
                    continue;
                }
                let (kind, message) = match reason.as_str() {
                    "model_not_allowed" => (
                        ErrorKind::NotFound,
                        format!("no account in your group serves model {:?}", inbound.model),
                    ),
                    "no_accounts" => (
                        ErrorKind::Overloaded,
                        "no account in your group serves this API".to_owned(),
                    ),
                    _ => (
                        ErrorKind::Overloaded,
                        format!("no capacity in the pool ({reason}); try again later"),
                    ),
                };
                let retry = plan.retry_after_ms.max(1000);
                return Answer::Error(RelayError::new(api, kind, message).retry_after_ms(retry));
            }
            let sticky = plan.sticky;
            let mut leased = None;
            let mut refused_all = true;
            for (index, account) in plan.accounts.iter().enumerate() {
                if acquires >= self.settings.max_acquires {
                    break;
                }
                acquires += 1;
                let terms = self.terms(&inbound, account, !user_charged, sticky && index == 0);
                match self.leases.acquire(terms, Duration::ZERO).await {
                    Ok(Acquired::Granted(lease)) => {
                        leased = Some((account.clone(), lease));
                        refused_all = false;
                        break;
                    }
                    Ok(Acquired::Denied(denial)) if denial.reason == DenyReason::UserRpm => {
                        return Answer::Error(
                            RelayError::new(
                                api,
                                ErrorKind::RateLimited,
                                "you sent too many requests this minute",
                            )
                            .retry_after_ms(denial.retry_after_ms.max(1000)),
                        );
                    }
                    Ok(Acquired::Denied(denial)) => {
                        self.metrics.failover(denial.reason.as_str(), "local");
                    }
                    Err(error) => {
                        tracing::warn!(%error, account_id = account.id, "admission unavailable for this acquire");
                        self.metrics.failover("admission_unavailable", "local");
                    }
                }
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
                        Ok(Acquired::Denied(denial)) if denial.reason == DenyReason::UserRpm => {
                            return Answer::Error(
                                RelayError::new(
                                    api,
                                    ErrorKind::RateLimited,
                                    "you sent too many requests this minute",
                                )
                                .retry_after_ms(denial.retry_after_ms.max(1000)),
                            );
                        }
                        Ok(Acquired::Denied(_)) | Err(_) => {}
                    }
                }
                if leased.is_none() {
                    if let Some((status, headers, body)) = last_failure {
                        return upstream_error(status, headers, body);
                    }
                    return Answer::Error(
                        RelayError::new(
                            api,
                            ErrorKind::Overloaded,
                            "every account is busy; try again shortly",
                        )
                        .retry_after_ms(1000),
                    );
                }
            }
            let Some((account, lease)) = leased else {
                // The acquire budget ran out.
                if let Some((status, headers, body)) = last_failure {
                    return upstream_error(status, headers, body);
                }
                return Answer::Error(
                    RelayError::new(api, ErrorKind::Overloaded, "no capacity in time; try again")
                        .retry_after_ms(1000),
                );
            };
            user_charged = true;
            match self
                .clone()
                .call_with_retries(&inbound, &account, lease, started)
                .await
            {
                Called::Served(answer) => return answer,
                Called::LeaseLost(lease) => {
                    // Neither the account's fault nor the upstream's: no report, no budget.
                    lease.release(0.0).await;
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
                    lease.release(0.0).await;
                    if classified.class == OutcomeClass::ClientError {
                        // Not the account's fault, and nothing reported: a client's request
                        // never changes an account's health. The client gets the answer as it
                        // came, unless another account may answer differently: one with
                        // permission (403 permission_error), or one that maps the model to a
                        // different upstream model (404).
                        let other_may_answer = classified.is_permission_refusal()
                            || (status == 404 && {
                                not_found_models.push(account.mapped_model.clone());
                                true
                            });
                        if !other_may_answer {
                            return upstream_error(status, headers, body);
                        }
                    } else if !inbound.ungoverned {
                        // The status reason carries what the upstream asserted (type/code),
                        // never the message, which can carry the client's input. (An
                        // ungoverned count_tokens call changes no account's health.)
                        let reason = UpstreamError::parse(&body)
                            .map(|e| e.summary())
                            .unwrap_or_default();
                        // Status 0: no upstream answer at all (the selector applies that at
                        // once; an answer is confirmed by its probe first).
                        let reported = if classified.label == "network" {
                            0
                        } else {
                            status
                        };
                        if classified.class == OutcomeClass::Unauthorized
                            && account.credential_kind.is_oauth()
                        {
                            let after_refresh = refreshed.contains_key(&account.id);
                            let fresh = self
                                .selection
                                .report_refused(
                                    account.id,
                                    classified,
                                    reported,
                                    &reason,
                                    after_refresh,
                                )
                                .await;
                            if let Some(fresh) = fresh.filter(|_| !after_refresh) {
                                // The same account again, with the new token; no budget spent.
                                refreshed.insert(account.id, fresh);
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
                    last_failure = Some((status, headers, body));
                    if failures >= self.settings.failover_budget {
                        self.metrics.failover(classified.label, "budget_spent");
                        let (status, headers, body) = last_failure.unwrap_or_default();
                        return upstream_error(status, headers, body);
                    }
                    self.metrics.failover(classified.label, "failover");
                }
            }
        }
    }

    fn terms(
        &self,
        inbound: &Inbound,
        account: &Planned,
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
            user: (charge_user && caller.user_rpm_limit > 0 && !inbound.ungoverned).then(|| {
                UserLimit {
                    user_id: caller.user.clone(),
                    rpm_limit: caller.user_rpm_limit,
                }
            }),
            session_hash: inbound.session_hash.clone(),
            session_window_limit_micros: if inbound.ungoverned {
                0
            } else {
                usd_to_micros(account.session_window_limit_usd.max(0.0)).unwrap_or(0)
            },
            session_bound: bound,
            ignore_cooldown: false,
        }
    }

    /// Calls one account, retrying the same account on conflicts (keeping the lease).
    async fn call_with_retries(
        self: Arc<Self>,
        inbound: &Inbound,
        account: &Planned,
        mut lease: Box<dyn Lease>,
        started: Instant,
    ) -> Called {
        let mut retries = 0;
        loop {
            match self.clone().call(inbound, account, lease, started).await {
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

    fn upstream_request(&self, inbound: &Inbound, account: &Planned) -> reqwest::RequestBuilder {
        let client = self.client_for(account.proxy_url.as_deref());
        let chatgpt = account.credential_kind == CredentialKind::ChatGptOAuth;
        let url = match &inbound.query {
            _ if chatgpt => chatgpt_responses_url(&account.base_url),
            Some(query) => format!("{}?{query}", upstream_url(&account.base_url, inbound.path)),
            None => upstream_url(&account.base_url, inbound.path),
        };
        let mut request = client.post(url);
        for (name, value) in &inbound.headers {
            // The ChatGPT backend gets its own `openai-beta` and session headers below.
            let replaced =
                chatgpt && matches!(name.as_str(), "openai-beta" | "session_id" | "session-id");
            if passes_upstream(name.as_str()) && !replaced {
                request = request.header(name, value);
            }
        }
        if chatgpt {
            // What the Codex CLI sends the ChatGPT backend with a subscription sign-in (see
            // docs/SUBSCRIPTIONS.md): the account (from the token's auth claim), the beta, who
            // is calling, and the session (the client's, else the relay's session hash).
            request = request.header("openai-beta", "responses=experimental");
            if let Some(id) = chatgpt_account_id(account.credential.expose()) {
                request = request.header("chatgpt-account-id", id);
            }
            if !inbound.headers.contains_key("originator") {
                request = request.header("originator", "codex_cli_rs");
            }
            let session = ["session-id", "session_id"]
                .iter()
                .find_map(|name| inbound.headers.get(*name).cloned())
                .or_else(|| {
                    inbound
                        .session_hash
                        .as_deref()
                        .and_then(|s| HeaderValue::from_str(s).ok())
                });
            if let Some(session) = session {
                request = request.header("session_id", session);
            }
        }
        request = request.header(http::header::ACCEPT_ENCODING, "identity");
        let credential = account.credential.expose();
        // `anthropic-beta` goes upstream once: the client's list, plus the account's own. A
        // subscription (OAuth) token serves only Claude Code's requests: other clients' requests
        // get Claude Code's identity (its beta here, its system line below).
        let as_claude_code = needs_claude_code_identity(inbound, account);
        let own_betas: &[&str] = match (inbound.api, account.credential_kind) {
            (Api::Anthropic, CredentialKind::OAuth) if as_claude_code => {
                &["claude-code-20250219", "oauth-2025-04-20"]
            }
            (Api::Anthropic, CredentialKind::OAuth) => &["oauth-2025-04-20"],
            _ => &[],
        };
        if let Some(betas) = merged_betas(&inbound.headers, own_betas) {
            request = request.header("anthropic-beta", betas);
        }
        request = match (inbound.api, account.credential_kind) {
            (Api::Anthropic, CredentialKind::ApiKey | CredentialKind::ChatGptOAuth) => {
                request.header("x-api-key", credential)
            }
            (Api::Anthropic, CredentialKind::OAuth) | (Api::OpenAi, _) => {
                request.bearer_auth(credential)
            }
        };
        let ask_usage = asks_stream_usage(inbound, account);
        let body =
            if account.mapped_model != inbound.model || ask_usage || as_claude_code || chatgpt {
                // `inbound.json` is an object (checked when the request came in).
                let mut json = inbound.json.clone();
                json["model"] = Value::String(account.mapped_model.clone());
                if as_claude_code {
                    let mut system =
                        vec![serde_json::json!({"type": "text", "text": CLAUDE_CODE_IDENTITY})];
                    match json.get("system") {
                        Some(Value::String(text)) if !text.is_empty() => {
                            system.push(serde_json::json!({"type": "text", "text": text}));
                        }
                        Some(Value::Array(blocks)) => system.extend(blocks.iter().cloned()),
                        _ => {}
                    }
                    json["system"] = Value::Array(system);
                }
                if chatgpt {
                    // The backend keeps nothing and always streams (a non-streaming client's answer
                    // is folded from the stream).
                    json["store"] = Value::Bool(false);
                    json["stream"] = Value::Bool(true);
                }
                if ask_usage {
                    match json
                        .get_mut("stream_options")
                        .and_then(Value::as_object_mut)
                    {
                        Some(options) => {
                            options.insert("include_usage".into(), Value::Bool(true));
                        }
                        None => json["stream_options"] = serde_json::json!({"include_usage": true}),
                    }
                }
                Bytes::from(serde_json::to_vec(&json).unwrap_or_else(|_| inbound.body.to_vec()))
            } else {
                inbound.body.clone()
            };
        if !inbound.headers.contains_key(http::header::CONTENT_TYPE) {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        request.body(body)
    }

    async fn call(
        self: Arc<Self>,
        inbound: &Inbound,
        account: &Planned,
        lease: Box<dyn Lease>,
        started: Instant,
    ) -> Called {
        let platform = inbound.api.platform().as_str();
        let sent = Instant::now();
        // Until the first byte reaches the client, a lease admission says is gone (released by
        // someone else, no room to restore it) ends this call: the request fails over.
        let mut lost = lease.lost();
        let answered = tokio::select! {
            answered = self.upstream_request(inbound, account).send() => answered,
            _ = gone(&mut lost) => return Called::LeaseLost(lease),
        };
        let response = match answered {
            Ok(response) => response,
            Err(error) => {
                tracing::warn!(account_id = account.id, error = %error.without_url(), "upstream unreachable");
                return Called::Failed {
                    classified: network_failure(),
                    status: 502,
                    headers: HeaderMap::new(),
                    body: Bytes::from_static(b"upstream unreachable"),
                    lease,
                };
            }
        };
        let status = response.status();
        let headers = response.headers().clone();
        if !status.is_success() {
            let body = read_bounded(response, self.settings.max_body_bytes).await;
            let classified = classify(
                status.as_u16(),
                &headers,
                &body,
                now_ms(),
                self.settings.hard_block_threshold.as_millis() as u64,
            );
            return Called::Failed {
                classified,
                status: status.as_u16(),
                headers,
                body,
                lease,
            };
        }
        let is_sse = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        let mut client_headers = response_headers(&headers);
        let mut upstream = response.bytes_stream();
        // The ChatGPT backend always streams: a client that did not ask for a stream gets the
        // stream folded into one response.
        let fold =
            is_sse && !inbound.stream && account.credential_kind == CredentialKind::ChatGptOAuth;
        if !is_sse || fold {
            let mut collected = Vec::new();
            let mut failed = false;
            loop {
                let chunk = tokio::select! {
                    chunk = upstream.next() => chunk,
                    _ = gone(&mut lost) => return Called::LeaseLost(lease),
                };
                let Some(chunk) = chunk else { break };
                match chunk {
                    Ok(chunk) if collected.len() + chunk.len() <= self.settings.max_body_bytes => {
                        collected.extend_from_slice(&chunk)
                    }
                    _ => {
                        failed = true;
                        break;
                    }
                }
            }
            if failed {
                return Called::Failed {
                    classified: network_failure(),
                    status: 502,
                    headers: HeaderMap::new(),
                    body: Bytes::from_static(b"upstream response broke off"),
                    lease,
                };
            }
            let mut body = Bytes::from(collected);
            if fold {
                match completed_response(&body) {
                    Ok(response) => {
                        body = Bytes::from(serde_json::to_vec(&response).unwrap_or_default());
                        client_headers.insert(
                            http::header::CONTENT_TYPE,
                            HeaderValue::from_static("application/json"),
                        );
                    }
                    Err(event) => {
                        return Called::Failed {
                            classified: event
                                .as_ref()
                                .map(classify_stream_error)
                                .unwrap_or_else(network_failure),
                            status: 502,
                            headers: HeaderMap::new(),
                            body: Bytes::from(event.map(|e| e.to_string()).unwrap_or_else(|| {
                                "the upstream stream ended without a response".into()
                            })),
                            lease,
                        };
                    }
                }
            }
            self.metrics.upstream_latency(platform, sent.elapsed());
            let mut usage = Usage::default();
            let mut response_id = None;
            if let Ok(json) = serde_json::from_slice::<Value>(&body) {
                usage.absorb_message(&json);
                response_id = json
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|id| id.starts_with("resp_"))
                    .map(str::to_owned);
            }
            let finish = Finish {
                relay: self.clone(),
                account: account.clone(),
                caller: inbound.caller.clone(),
                session_hash: inbound.session_hash.clone(),
                model: inbound.model.clone(),
                started,
                status: status.as_u16(),
                governed: !inbound.ungoverned,
            };
            // Bound before the client has the answer: its next request in the conversation
            // (or with this `previous_response_id`) must find the binding.
            finish.bind_session().await;
            if let Some(response_id) = &response_id
                && finish.governed
            {
                self.selection.bind_response(response_id, account.id).await;
            }
            tokio::spawn(tracing::Instrument::in_current_span(
                finish.run(lease, usage, true),
            ));
            return Called::Served(Answer::Upstream {
                status,
                headers: client_headers,
                body: Body::Full(body),
            });
        }
        // Streaming: fail over only before the first upstream byte reaches the client.
        let first = tokio::select! {
            first = upstream.next() => first,
            _ = gone(&mut lost) => return Called::LeaseLost(lease),
        };
        let first = match first {
            Some(Ok(chunk)) => chunk,
            _ => {
                return Called::Failed {
                    classified: network_failure(),
                    status: 502,
                    headers: HeaderMap::new(),
                    body: Bytes::from_static(b"upstream stream ended before its first byte"),
                    lease,
                };
            }
        };
        self.metrics.time_to_first_byte(platform, sent.elapsed());
        let (sender, receiver) = mpsc::channel::<Bytes>(32);
        // What the relay added to the stream by asking for usage comes out again.
        let mut stripper = asks_stream_usage(inbound, account).then(ChatUsageStripper::default);
        let finish = Finish {
            relay: self.clone(),
            account: account.clone(),
            caller: inbound.caller.clone(),
            session_hash: inbound.session_hash.clone(),
            model: inbound.model.clone(),
            started,
            status: status.as_u16(),
            governed: !inbound.ungoverned,
        };
        let api = inbound.api;
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            let mut scanner = SseScanner::default();
            let mut response_bound = false;
            scanner.feed(&first);
            finish
                .bind_response_once(&scanner, &mut response_bound)
                .await;
            let mut complete = sender.send(strip(&mut stripper, first)).await.is_ok();
            // Bound while the stream runs, long before the client can send its next request.
            if complete {
                finish.bind_session().await;
            }
            let mut client_gone = !complete;
            while complete {
                tokio::select! {
                    chunk = upstream.next() => match chunk {
                        Some(Ok(chunk)) => {
                            scanner.feed(&chunk);
                            // Bound as soon as the id shows, before the client has it.
                            finish.bind_response_once(&scanner, &mut response_bound).await;
                            let chunk = strip(&mut stripper, chunk);
                            if !chunk.is_empty() && sender.send(chunk).await.is_err() {
                                client_gone = true;
                                complete = false;
                            }
                        }
                        Some(Err(error)) => {
                            tracing::warn!(account_id = finish.account.id, error = %error.without_url(), "upstream stream broke mid-way");
                            let error = RelayError::new(api, ErrorKind::Upstream, "the upstream stream broke off; the response is incomplete");
                            let _ = sender.send(error.sse_event()).await;
                            complete = false;
                            if finish.governed {
                                finish.relay.selection.report(finish.account.id, network_failure(), 0, "stream broke mid-way").await;
                            }
                        }
                        None => {
                            if let Some(rest) = stripper.as_mut().map(ChatUsageStripper::finish)
                                && !rest.is_empty()
                            {
                                let _ = sender.send(Bytes::from(rest)).await;
                            }
                            break;
                        }
                    },
                    // A client that disconnects cancels the upstream call at once.
                    _ = sender.closed() => {
                        client_gone = true;
                        complete = false;
                    }
                }
            }
            drop(upstream);
            finish
                .relay
                .metrics
                .upstream_latency(api.platform().as_str(), sent.elapsed());
            if client_gone {
                finish.relay.metrics.client_disconnects.inc();
                // The upstream notices the closed connection at its next write; until then it
                // still counts the request (see `Lingering`).
                tokio::time::sleep(finish.relay.settings.cancel_linger).await;
            }
            let succeeded = complete && !client_gone && scanner.error.is_none();
            if let Some(event) = &scanner.error {
                // A 200 whose stream carried an error event is not a success; what the event
                // says decides (busy, broken, billing), and a request-caused one changes nothing.
                let classified = classify_stream_error(event);
                if classified.class != OutcomeClass::ClientError && finish.governed {
                    let reason = UpstreamError::from_json(event)
                        .map(|e| e.summary())
                        .unwrap_or_default();
                    finish
                        .relay
                        .selection
                        .report(finish.account.id, classified, 200, &reason)
                        .await;
                }
            }
            finish.run(lease, scanner.usage, succeeded).await;
        }));
        Called::Served(Answer::Upstream {
            status,
            headers: client_headers,
            body: Body::Stream(receiver),
        })
    }
}

/// Bookkeeping after the last byte: report, bind, spend on release, usage record.
struct Finish {
    relay: Arc<Relay>,
    account: Planned,
    caller: Caller,
    session_hash: Option<String>,
    model: String,
    started: Instant,
    status: u16,
    /// Ungoverned requests (count_tokens) change no shared state: no outcome report, no binding.
    governed: bool,
}

impl Finish {
    /// Binds the conversation to the account that answered it (sticky sessions).
    async fn bind_session(&self) {
        if !self.governed {
            return;
        }
        if let Some(session) = &self.session_hash {
            self.relay
                .selection
                .bind_session(&self.caller.group, session, self.account.id)
                .await;
        }
    }

    /// Binds a streamed response's `resp_` id the first time the scanner has seen it.
    async fn bind_response_once(&self, scanner: &SseScanner, bound: &mut bool) {
        if *bound || !self.governed {
            return;
        }
        if let Some(response_id) = &scanner.response_id {
            self.relay
                .selection
                .bind_response(response_id, self.account.id)
                .await;
            *bound = true;
        }
    }

    /// Release, outcome report, usage. The session and response bindings are made earlier,
    /// before the client can ask again.
    async fn run(self, lease: Box<dyn Lease>, usage: Usage, succeeded: bool) {
        let cost = usage.cost_usd(&self.account.price);
        if usage != Usage::default() && self.account.price == Price::default() {
            self.relay.note_unpriced(&self.account.mapped_model);
        }
        // Spend travels with the release, in the same script.
        lease.release(cost).await;
        let selection = &self.relay.selection;
        if succeeded && self.governed {
            let success = Classified {
                class: OutcomeClass::Success,
                reset_at_ms: None,
                label: "success",
            };
            selection
                .report(self.account.id, success, self.status, "")
                .await;
        }
        self.relay
            .metrics
            .spend_micros
            .inc_by(usd_to_micros(cost).unwrap_or(0).max(0) as u64);
        selection.record_usage(UsageRecord {
            api_key_id: self.caller.api_key_id,
            user: self.caller.user.clone(),
            account_id: self.account.id,
            model: self.model.clone(),
            input_tokens: usage.input,
            output_tokens: usage.output,
            cache_write_tokens: usage.cache_write,
            cache_read_tokens: usage.cache_read,
            cost_usd: cost,
            status: self.status,
            latency_ms: self.started.elapsed().as_millis().min(u32::MAX as u128) as u32,
            at_ms: now_ms().max(0) as u64,
        });
    }
}

async fn read_bounded(response: reqwest::Response, max: usize) -> Bytes {
    let mut stream = response.bytes_stream();
    let mut body = Vec::new();
    while let Some(Ok(chunk)) = stream.next().await {
        let room = max.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if room <= chunk.len() {
            break;
        }
    }
    Bytes::from(body)
}

fn response_headers(upstream: &HeaderMap) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in upstream {
        if !DROPPED_RESPONSE_HEADERS.contains(&name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    headers
}

/// Resolves when the lease is lost (see `Lease::lost`); never when it cannot be, or when its
/// keeper is gone.
async fn gone(lost: &mut Option<tokio::sync::watch::Receiver<bool>>) {
    if let Some(lost) = lost
        && lost.wait_for(|lost| *lost).await.is_ok()
    {
        return;
    }
    std::future::pending::<()>().await
}

/// Whether the request already opens with Claude Code's identity line (Claude Code's own
/// requests do; they go upstream untouched).
fn opens_with_claude_code_identity(json: &Value) -> bool {
    match json.get("system") {
        Some(Value::String(text)) => text.trim_start().starts_with(CLAUDE_CODE_IDENTITY),
        Some(Value::Array(blocks)) => blocks
            .first()
            .and_then(|block| block.get("text"))
            .and_then(Value::as_str)
            .is_some_and(|text| text.trim_start().starts_with(CLAUDE_CODE_IDENTITY)),
        _ => false,
    }
}

/// A Messages request of another client (an SDK, curl) on a Claude subscription (OAuth)
/// account: Anthropic serves such tokens only for Claude Code, so the request gets Claude Code's
/// identity line as its first system block and Claude Code's beta, as sub2api and
/// claude-relay-service do. `count_tokens` takes no system prompt and is left alone.
fn needs_claude_code_identity(inbound: &Inbound, account: &Planned) -> bool {
    inbound.api == Api::Anthropic
        && inbound.path == "/v1/messages"
        && account.credential_kind == CredentialKind::OAuth
        && !opens_with_claude_code_identity(&inbound.json)
}

/// A stream chunk as the client gets it (see `ChatUsageStripper`).
fn strip(stripper: &mut Option<ChatUsageStripper>, chunk: Bytes) -> Bytes {
    match stripper {
        Some(stripper) => Bytes::from(stripper.feed(&chunk)),
        None => chunk,
    }
}

/// An OpenAI chat stream whose client did not ask for usage, on an account that allows asking:
/// the relay asks the upstream for it (so streamed spend is recorded) and strips it from what
/// the client gets.
fn asks_stream_usage(inbound: &Inbound, account: &Planned) -> bool {
    inbound.api == Api::OpenAi
        && inbound.path == "/v1/chat/completions"
        && inbound.stream
        && account.stream_usage
        && inbound
            .json
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            != Some(true)
}

/// The last upstream error, passed to the client as it came.
fn upstream_error(status: u16, headers: HeaderMap, body: Bytes) -> Answer {
    Answer::Upstream {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        headers: response_headers(&headers),
        body: Body::Full(body),
    }
}

/// `x-request-id` of every response.
pub fn request_id_header() -> (HeaderName, HeaderValue) {
    let id = format!("req_{:016x}{:08x}", fastrand::u64(..), fastrand::u32(..));
    (
        HeaderName::from_static("x-request-id"),
        HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("req_unknown")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_clis_send_goes_upstream_and_credentials_do_not() {
        for name in [
            "anthropic-version",
            "anthropic-dangerous-direct-browser-access",
            "x-stainless-os",
            "x-stainless-retry-count",
            "x-app",
            "x-claude-code-session-id",
            "originator",
            "session-id",
            "session_id",
            "thread-id",
            "x-client-request-id",
            "x-codex-turn-metadata",
            "x-codex-beta-features",
            "user-agent",
        ] {
            assert!(passes_upstream(name), "{name}");
        }
        for name in [
            "authorization",
            "x-api-key",
            "cookie",
            "host",
            "content-length",
            "accept-encoding",
            "connection",
            "anthropic-beta",
            "x-forwarded-for",
        ] {
            assert!(!passes_upstream(name), "{name}");
        }
    }

    #[test]
    fn anthropic_beta_goes_once_with_the_accounts_own() {
        let mut headers = HeaderMap::new();
        headers.append(
            "anthropic-beta",
            HeaderValue::from_static("claude-code-20250219, oauth-2025-04-20"),
        );
        headers.append(
            "anthropic-beta",
            HeaderValue::from_static("interleaved-thinking-2025-05-14"),
        );
        assert_eq!(
            merged_betas(&headers, &["oauth-2025-04-20"]).as_deref(),
            Some("claude-code-20250219,oauth-2025-04-20,interleaved-thinking-2025-05-14")
        );
        assert_eq!(
            merged_betas(&HeaderMap::new(), &["oauth-2025-04-20"]).as_deref(),
            Some("oauth-2025-04-20")
        );
        assert_eq!(merged_betas(&HeaderMap::new(), &[]), None);
    }
}
