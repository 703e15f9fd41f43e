//! `relay-svc --standalone`: the whole pool in one process, no Redis, no Postgres. Accounts and
//! client keys come from a YAML file; health lives in memory with the same decisions as the
//! selector (`poolgate_core::outcome::decide`) and the same ordering (`selector_svc::select`);
//! admission is the admission engine on its memory backend, and a lease is a drop guard.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use admission_svc::admission::{AcquireOutcome, Admission};
use async_trait::async_trait;
use poolgate_core::account::{
    Account, AccountStatus, ApiKeyRecord, CredentialKind, OAuthState, Platform, Price, Secret,
    default_oauth_token_url, group_models,
};
use poolgate_core::health::{AccountHealth, Breaker};
use poolgate_core::lease::{LeaseId, LeaseTerms, Settings};
use poolgate_core::money::usd_to_micros;
use poolgate_core::outcome::{Decision, decide};
use poolgate_core::outcome::{Outcome, OutcomeClass, RuntimeBlockSettings};
use poolgate_core::select::{Candidate, order};
use poolgate_core::{millis, now_ms};
use selector_svc::crypto::{api_key_hash, api_key_prefix};
use selector_svc::snapshot::Snapshot;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::backends::{
    Acquired, BackendError, Caller, Lease, Leases, Plan, PlanRequest, Planned, Selection,
    UsageRecord,
};
use poolgate_core::classify::Classified;
use selector_svc::confirm::{
    ProbeSettings, Suspicion, Verdict, breaker_closes, confirm, probe_under_lease,
};

/// The standalone account file (see `examples/standalone.yaml`). Unknown fields are ignored, so
/// a file written for a newer relay still loads.
#[derive(Debug, Deserialize)]
pub struct StandaloneFile {
    /// Listen address (the `--listen` flag wins when given).
    #[serde(default)]
    pub listen: Option<String>,
    #[serde(default)]
    pub api_keys: Vec<KeyEntry>,
    pub accounts: Vec<AccountEntry>,
    #[serde(default)]
    pub prices: Prices,
}

#[derive(Debug, Deserialize)]
pub struct KeyEntry {
    pub key: String,
    #[serde(default = "default_user")]
    pub user: String,
    #[serde(default = "default_group")]
    pub group: String,
    /// Per-user requests per minute; <= 0: unlimited.
    #[serde(default, alias = "user_rpm", alias = "user_rpm_limit")]
    pub rpm_limit: i32,
}

#[derive(Debug, Deserialize)]
pub struct OAuthEntry {
    pub access_token: String,
    #[serde(default)]
    pub refresh_token: Option<String>,
    #[serde(default)]
    pub expires_at: Option<serde_yaml_ng::Value>,
    /// Default: the platform's (Anthropic's console, OpenAI's auth server).
    #[serde(default)]
    pub token_url: Option<String>,
    /// The OAuth client id refresh requests carry (default: the official CLI's).
    #[serde(default)]
    pub client_id: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct AccountEntry {
    /// Stable id (default: position in the file, from 1).
    #[serde(default)]
    pub id: Option<i64>,
    pub name: String,
    #[serde(default = "default_group")]
    pub group: String,
    /// `anthropic` or `openai`.
    pub platform: String,
    pub base_url: String,
    /// The upstream API key...
    #[serde(default, alias = "credential")]
    pub api_key: Option<String>,
    /// ...or the environment variable holding it...
    #[serde(default, alias = "api_key_env")]
    pub credential_env: Option<String>,
    /// ...or an OAuth access token (refreshing it is the distributed selector's job).
    #[serde(default)]
    pub oauth: Option<OAuthEntry>,
    /// A ChatGPT subscription (the Codex CLI's sign-in): platform openai, `/v1/responses` only.
    #[serde(default)]
    pub chatgpt_oauth: Option<OAuthEntry>,
    #[serde(default)]
    pub priority: i32,
    #[serde(default = "one")]
    pub weight: i32,
    #[serde(default, alias = "concurrency_limit")]
    pub concurrency: i32,
    #[serde(default, alias = "rpm")]
    pub rpm_limit: i32,
    #[serde(default, alias = "session_window_usd")]
    pub session_window_limit_usd: f64,
    #[serde(default, alias = "allowed_models")]
    pub models: Vec<String>,
    #[serde(default)]
    pub model_mapping: HashMap<String, String>,
    #[serde(default, alias = "proxy")]
    pub proxy_url: Option<String>,
    /// The model the confirmation probe asks for (none: the platform default).
    #[serde(default)]
    pub probe_model: Option<String>,
    /// OpenAI chat streams: ask the upstream for usage when the client did not (default true).
    #[serde(default = "yes")]
    pub stream_usage: bool,
    /// `active` (default) or `disabled`.
    #[serde(default)]
    pub status: Option<String>,
}

/// Prices as a list of `{model, input, output, cache_write, cache_read}` or a map by model.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prices {
    List(Vec<PriceEntry>),
    Map(HashMap<String, PriceEntry>),
}

impl Default for Prices {
    fn default() -> Self {
        Prices::List(Vec::new())
    }
}

#[derive(Debug, Deserialize)]
pub struct PriceEntry {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub input: f64,
    #[serde(default)]
    pub output: f64,
    #[serde(default)]
    pub cache_write: f64,
    #[serde(default)]
    pub cache_read: f64,
}

fn default_user() -> String {
    "default".into()
}

fn default_group() -> String {
    "default".into()
}

fn one() -> i32 {
    1
}

fn yes() -> bool {
    true
}

impl StandaloneFile {
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: StandaloneFile =
            serde_yaml_ng::from_str(text).map_err(|e| format!("config: {e}"))?;
        if file.accounts.is_empty() {
            return Err("config: no accounts".into());
        }
        Ok(file)
    }

    fn accounts(&self) -> Result<Vec<Account>, String> {
        let mut accounts = Vec::new();
        let mut ids = std::collections::HashSet::new();
        for (index, entry) in self.accounts.iter().enumerate() {
            let at =
                |message: &str| format!("config: accounts[{index}] ({}): {message}", entry.name);
            let platform = Platform::parse(&entry.platform)
                .ok_or_else(|| at("platform must be anthropic or openai"))?;
            let signed_in = entry.oauth.as_ref().or(entry.chatgpt_oauth.as_ref());
            let (credential_kind, credential) = match (
                &entry.api_key,
                &entry.credential_env,
                entry.oauth.as_ref().or(entry.chatgpt_oauth.as_ref()),
            ) {
                (Some(key), _, _) => (CredentialKind::ApiKey, key.clone()),
                (None, Some(var), _) => (
                    CredentialKind::ApiKey,
                    std::env::var(var)
                        .map_err(|_| at(&format!("environment variable {var} is not set")))?,
                ),
                (None, None, Some(oauth)) if entry.chatgpt_oauth.is_some() => {
                    if platform != Platform::OpenAi {
                        return Err(at("chatgpt_oauth accounts are on platform openai"));
                    }
                    (CredentialKind::ChatGptOAuth, oauth.access_token.clone())
                }
                (None, None, Some(oauth)) => (CredentialKind::OAuth, oauth.access_token.clone()),
                (None, None, None) => return Err(at("needs api_key, credential_env or oauth")),
            };
            if credential.is_empty() {
                return Err(at("the credential is empty"));
            }
            if !(entry.base_url.starts_with("http://") || entry.base_url.starts_with("https://")) {
                return Err(at("base_url must be an http(s) URL"));
            }
            let id = entry.id.unwrap_or(index as i64 + 1);
            if id <= 0 || !ids.insert(id) {
                return Err(at("id must be positive and unique"));
            }
            let status = match entry.status.as_deref() {
                None | Some("active") => AccountStatus::Active,
                Some("disabled") => AccountStatus::Disabled,
                Some(_) => return Err(at("status must be active or disabled")),
            };
            accounts.push(Account {
                id,
                name: entry.name.clone(),
                group: entry.group.clone(),
                platform,
                base_url: entry.base_url.trim_end_matches('/').to_owned(),
                credential_kind,
                credential: Secret::new(credential),
                oauth: match signed_in {
                    Some(oauth) if credential_kind.is_oauth() => {
                        oauth_state(oauth, platform).map_err(|message| at(&message))?
                    }
                    _ => None,
                },
                status,
                status_reason: String::new(),
                priority: entry.priority,
                weight: entry.weight.max(1),
                concurrency_limit: entry.concurrency,
                rpm_limit: entry.rpm_limit,
                session_window_limit_usd: entry.session_window_limit_usd,
                allowed_models: entry.models.clone(),
                model_mapping: entry.model_mapping.clone(),
                proxy_url: entry.proxy_url.clone().filter(|p| !p.is_empty()),
                probe_model: entry.probe_model.clone().filter(|m| !m.is_empty()),
                stream_usage: entry.stream_usage,
            });
        }
        Ok(accounts)
    }

    /// The selector's view of this file: accounts, client keys (by hash, ids from 1 in file
    /// order), prices.
    pub fn snapshot(&self) -> Result<Snapshot, String> {
        let mut keys = HashMap::new();
        for (index, entry) in self.api_keys.iter().enumerate() {
            if entry.key.is_empty() {
                return Err(format!("config: api_keys[{index}]: the key is empty"));
            }
            let record = ApiKeyRecord {
                id: index as i64 + 1,
                name: format!("api_keys[{index}]"),
                prefix: api_key_prefix(&entry.key),
                user: entry.user.clone(),
                group: entry.group.clone(),
                user_rpm_limit: entry.rpm_limit,
                active: true,
            };
            if keys.insert(api_key_hash(&entry.key), record).is_some() {
                return Err(format!(
                    "config: api_keys[{index}]: the key is listed twice"
                ));
            }
        }
        let groups = self.api_keys.iter().map(|k| k.group.clone()).collect();
        Ok(Snapshot::new(
            groups,
            self.accounts()?,
            keys,
            self.prices()?,
        ))
    }

    fn prices(&self) -> Result<HashMap<String, Price>, String> {
        let price = |p: &PriceEntry| Price {
            input_per_mtok: p.input,
            output_per_mtok: p.output,
            cache_write_per_mtok: p.cache_write,
            cache_read_per_mtok: p.cache_read,
        };
        match &self.prices {
            Prices::Map(map) => Ok(map
                .iter()
                .map(|(model, p)| (model.clone(), price(p)))
                .collect()),
            Prices::List(list) => list
                .iter()
                .enumerate()
                .map(|(index, p)| {
                    let model = p
                        .model
                        .clone()
                        .ok_or_else(|| format!("config: prices[{index}]: model is required"))?;
                    Ok((model, price(p)))
                })
                .collect(),
        }
    }
}

/// The refresh state of a subscription account. Without a refresh token the access token is
/// used until it stops working.
fn oauth_state(entry: &OAuthEntry, platform: Platform) -> Result<Option<OAuthState>, String> {
    let Some(refresh_token) = entry.refresh_token.as_ref().filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let expires_at_ms = match &entry.expires_at {
        None => 0,
        Some(value) => {
            let number = value
                .as_i64()
                .or_else(|| value.as_str().and_then(|text| text.trim().parse().ok()))
                .filter(|n| *n >= 0)
                .ok_or("oauth.expires_at must be a time in ms (or seconds) since the epoch")?;
            // Seconds and milliseconds since the epoch differ by three orders of magnitude.
            if number < 100_000_000_000 {
                number * 1000
            } else {
                number
            }
        }
    };
    let token_url = entry
        .token_url
        .clone()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| default_oauth_token_url(platform).to_owned());
    if !(token_url.starts_with("http://") || token_url.starts_with("https://")) {
        return Err("oauth.token_url must be an http(s) URL".into());
    }
    Ok(Some(OAuthState {
        refresh_token: Secret::new(refresh_token.clone()),
        expires_at_ms,
        token_url,
        client_id: entry.client_id.clone().unwrap_or_default(),
    }))
}

/// In-memory health of one account (the same state the selector keeps in Redis).
#[derive(Debug, Default, Clone)]
struct MemoryHealth {
    soft_until: i64,
    hard_until: i64,
    failures: u32,
    open_until: i64,
    open_ms: i64,
    probe_until: i64,
    /// A billing-class answer is being confirmed by the probe until then (excluded meanwhile).
    confirming_until: i64,
    /// After a confirmation the probe did not bear out: no new one until then.
    quiet_until: i64,
    unauthorized: VecDeque<i64>,
}

/// The in-process selector of standalone mode.
pub struct StandaloneSelection {
    accounts: Arc<Mutex<Vec<Arc<Account>>>>,
    keys: HashMap<String, Caller>,
    prices: HashMap<String, Price>,
    health: Arc<Mutex<HashMap<i64, MemoryHealth>>>,
    sticky: Mutex<HashMap<(String, String), (i64, Instant)>>,
    responses: Mutex<HashMap<String, (i64, Instant)>>,
    admission: Arc<Admission>,
    blocks: RuntimeBlockSettings,
    probe: ProbeSettings,
    probe_http: reqwest::Client,
}

const BINDING_TTL: Duration = Duration::from_secs(3600);

impl StandaloneSelection {
    pub fn new(
        file: &StandaloneFile,
        admission: Arc<Admission>,
        blocks: RuntimeBlockSettings,
    ) -> Result<Self, String> {
        let accounts = file.accounts()?.into_iter().map(Arc::new).collect();
        let mut keys = HashMap::new();
        for (index, key) in file.api_keys.iter().enumerate() {
            if key.key.is_empty() {
                return Err(format!("config: api_keys[{index}]: the key is empty"));
            }
            keys.insert(
                key.key.clone(),
                Caller {
                    api_key_id: index as i64 + 1,
                    user: key.user.clone(),
                    group: key.group.clone(),
                    user_rpm_limit: key.rpm_limit,
                },
            );
        }
        let prices = file.prices()?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let probe_http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("http client: {e}"))?;
        Ok(StandaloneSelection {
            accounts: Arc::new(Mutex::new(accounts)),
            keys,
            prices,
            health: Arc::new(Mutex::new(HashMap::new())),
            probe: ProbeSettings::default(),
            probe_http,
            sticky: Mutex::new(HashMap::new()),
            responses: Mutex::new(HashMap::new()),
            admission,
            blocks,
        })
    }

    fn set_status(&self, id: i64, status: AccountStatus, reason: String) {
        set_status(&self.accounts, id, status, reason);
    }

    /// Confirms an answer the request may have shaped (billing-class, or the upstream failing)
    /// with the probe (see `selector_svc::confirm`), in the background; the account is excluded
    /// until the verdict, and the outcome applies only if the probe gets the same class.
    fn start_confirmation(&self, account_id: i64, suspicion: Suspicion) {
        let account = {
            let accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
            accounts.iter().find(|a| a.id == account_id).cloned()
        };
        let Some(account) = account else { return };
        let (admission, http, probe) = (
            self.admission.clone(),
            self.probe_http.clone(),
            self.probe.clone(),
        );
        let (accounts, health) = (self.accounts.clone(), self.health.clone());
        let blocks = self.blocks.clone();
        let threshold = blocks.hard_block_threshold.as_millis() as u64;
        tracing::info!(
            account_id,
            ?suspicion,
            "confirming with a probe before the outcome applies"
        );
        tokio::spawn(async move {
            if suspicion == Suspicion::Broken {
                let probed =
                    probe_under_lease(&admission, &http, &account, &probe, threshold).await;
                let confirmed = probed
                    .as_ref()
                    .is_ok_and(|p| p.classified.class == OutcomeClass::Broken);
                let cleared = probed.as_ref().is_ok_and(|p| !confirmed && p.status != 0);
                let ms = millis(blocks.broken_block);
                {
                    let mut health = health.lock().unwrap_or_else(|p| p.into_inner());
                    let state = health.entry(account_id).or_default();
                    state.confirming_until = 0;
                    if confirmed {
                        apply_broken(state, &blocks, now_ms(), ms);
                    } else if cleared {
                        state.quiet_until =
                            now_ms() + probe.quiet_after_unconfirmed.as_millis() as i64;
                    }
                }
                if confirmed {
                    let _ = admission
                        .set_cooldown(account_id, Duration::from_millis(ms))
                        .await;
                }
                return;
            }
            let verdict = confirm(&admission, &http, &account, &probe, threshold).await;
            if let Verdict::Confirmed(probed) = &verdict {
                let reason = format!(
                    "quota gone: confirmed by probe ({} {})",
                    probed.status, probed.summary
                );
                tracing::warn!(account_id, %reason, "account retired");
                set_status(&accounts, account_id, AccountStatus::Retired, reason);
            } else {
                tracing::info!(
                    account_id,
                    verdict = verdict.label(),
                    "billing-class answer not confirmed; the account stays"
                );
            }
            let mut health = health.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(state) = health.get_mut(&account_id) {
                state.confirming_until = 0;
                if verdict.cleared() {
                    state.quiet_until = now_ms() + probe.quiet_after_unconfirmed.as_millis() as i64;
                }
            }
        });
    }

    /// Checks a half-open breaker with the probe, in the background: closes it unless the
    /// upstream itself failed, in which case it reopens for twice as long.
    fn start_half_open_check(&self, account: Arc<Account>) {
        let (admission, http, probe) = (
            self.admission.clone(),
            self.probe_http.clone(),
            self.probe.clone(),
        );
        let health = self.health.clone();
        let blocks = self.blocks.clone();
        tokio::spawn(async move {
            let threshold = blocks.hard_block_threshold.as_millis() as u64;
            let probed = probe_under_lease(&admission, &http, &account, &probe, threshold).await;
            let mut health = health.lock().unwrap_or_else(|p| p.into_inner());
            let state = health.entry(account.id).or_default();
            state.probe_until = 0;
            match probed {
                Ok(probed) if breaker_closes(&probed) => {
                    tracing::info!(
                        account_id = account.id,
                        "half-open probe answered; breaker closed"
                    );
                    state.failures = 0;
                    state.open_until = 0;
                    state.open_ms = 0;
                }
                Ok(_) => {
                    let now = now_ms();
                    let max = blocks.breaker_max_open.as_millis() as i64;
                    state.open_ms = (state.open_ms * 2).min(max);
                    state.open_until = now + state.open_ms;
                    tracing::warn!(
                        account_id = account.id,
                        open_ms = state.open_ms,
                        "half-open probe failed; breaker reopened"
                    );
                }
                Err(why) => {
                    tracing::info!(account_id = account.id, why, "half-open probe not sent")
                }
            }
        });
    }

    /// The status of an account (for tests and the admin view of standalone mode).
    pub fn status(&self, id: i64) -> Option<AccountStatus> {
        let accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        accounts.iter().find(|a| a.id == id).map(|a| a.status)
    }
}

/// A broken outcome: hard block, one more count toward the breaker (opened at the threshold,
/// reopened for twice as long when it fails while half-open).
fn apply_broken(state: &mut MemoryHealth, blocks: &RuntimeBlockSettings, now: i64, ms: u64) {
    state.hard_until = state.hard_until.max(now + ms as i64);
    state.failures += 1;
    let first = blocks.breaker_open.as_millis() as i64;
    let max = blocks.breaker_max_open.as_millis() as i64;
    if state.open_until > 0 && now >= state.open_until {
        state.open_ms = (state.open_ms * 2).min(max);
        state.open_until = now + state.open_ms;
        state.probe_until = 0;
    } else if state.open_until == 0 && state.failures >= blocks.breaker_threshold {
        state.open_ms = first;
        state.open_until = now + first;
    }
}

fn set_status(accounts: &Mutex<Vec<Arc<Account>>>, id: i64, status: AccountStatus, reason: String) {
    let mut accounts = accounts.lock().unwrap_or_else(|p| p.into_inner());
    for account in accounts.iter_mut() {
        if account.id == id {
            let mut changed = (**account).clone();
            changed.status = status;
            changed.status_reason = reason.clone();
            *account = Arc::new(changed);
        }
    }
}

#[async_trait]
impl Selection for StandaloneSelection {
    async fn authenticate(&self, api_key: &str) -> Result<Option<Caller>, BackendError> {
        Ok(self.keys.get(api_key).cloned())
    }

    async fn select(&self, request: &PlanRequest) -> Result<Plan, BackendError> {
        let accounts: Vec<Arc<Account>> = self
            .accounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|a| {
                a.group == request.group
                    && a.status == AccountStatus::Active
                    && a.platform == request.platform
            })
            .cloned()
            .collect();
        let none = |reason: &str, retry_after_ms| Plan {
            accounts: Vec::new(),
            sticky: false,
            none_reason: Some(reason.to_owned()),
            retry_after_ms,
        };
        if accounts.is_empty() {
            return Ok(none("no_accounts", 0));
        }
        let allowed: Vec<Arc<Account>> = accounts
            .into_iter()
            .filter(|a| a.allows(&request.model))
            .collect();
        if allowed.is_empty() {
            return Ok(none("model_not_allowed", 0));
        }
        let included: Vec<Arc<Account>> = allowed
            .into_iter()
            .filter(|a| !request.exclude.contains(&a.id))
            .collect();
        if included.is_empty() {
            return Ok(none("all_excluded", 0));
        }
        let ids: Vec<i64> = included.iter().map(|a| a.id).collect();
        let inflight = self.admission.inflight(&ids).await.unwrap_or_default();
        let now = now_ms();
        let mut candidates = Vec::new();
        let mut earliest = i64::MAX;
        let mut half_open = Vec::new();
        {
            let mut health = self.health.lock().unwrap_or_else(|p| p.into_inner());
            for (index, account) in included.into_iter().enumerate() {
                let state = health.entry(account.id).or_default();
                let blocked_until = state.hard_until.max(state.confirming_until);
                if blocked_until > now {
                    earliest = earliest.min(blocked_until - now);
                    continue;
                }
                let breaker = if state.open_until == 0 {
                    Breaker::Closed
                } else if state.open_until > now {
                    earliest = earliest.min(state.open_until - now);
                    Breaker::Open((state.open_until - now) as u64)
                } else {
                    Breaker::HalfOpen
                };
                match breaker {
                    Breaker::Open(_) => continue,
                    // The probe decides (no client request goes through as the probe); the
                    // account is excluded until then.
                    Breaker::HalfOpen => {
                        if state.probe_until <= now {
                            state.probe_until = now + self.probe.block.as_millis() as i64;
                            half_open.push(account.clone());
                        }
                        continue;
                    }
                    Breaker::Closed => {}
                }
                candidates.push(Candidate {
                    health: Some(AccountHealth {
                        inflight: inflight.get(index).copied(),
                        hard_block_ms: 0,
                        soft_block_ms: (state.soft_until - now).max(0) as u64,
                        breaker,
                        failures: state.failures,
                    }),
                    account,
                });
            }
        }
        for account in half_open {
            self.start_half_open_check(account);
        }
        if candidates.is_empty() {
            return Ok(none(
                "all_blocked",
                if earliest == i64::MAX {
                    0
                } else {
                    earliest as u64
                },
            ));
        }
        let sticky = self.binding(request);
        let (ordered, is_sticky) = order(candidates, sticky, &mut fastrand::Rng::new());
        Ok(Plan {
            accounts: ordered
                .into_iter()
                .map(|candidate| {
                    let account = &candidate.account;
                    let mapped_model = account.mapped_model(&request.model);
                    Planned {
                        id: account.id,
                        name: account.name.clone(),
                        base_url: account.base_url.clone(),
                        credential: account.credential.clone(),
                        credential_kind: account.credential_kind,
                        price: self.prices.get(&mapped_model).copied().unwrap_or_default(),
                        mapped_model,
                        concurrency_limit: account.concurrency_limit,
                        rpm_limit: account.rpm_limit,
                        session_window_limit_usd: account.session_window_limit_usd,
                        proxy_url: account.proxy_url.clone(),
                        stream_usage: account.stream_usage,
                        soft_blocked: candidate.soft_blocked(),
                        inflight: candidate.health.and_then(|h| h.inflight),
                    }
                })
                .collect(),
            sticky: is_sticky,
            none_reason: None,
            retry_after_ms: 0,
        })
    }

    async fn report(&self, account_id: i64, outcome: Classified, status: u16, reason: &str) {
        let now = now_ms();
        let decision = decide(
            &Outcome {
                account_id,
                class: outcome.class,
                status,
                reset_at_ms: outcome.reset_at_ms,
                reason: reason.to_owned(),
            },
            &self.blocks,
            now,
        );
        let mut cooldown = None;
        let mut new_status = None;
        let mut confirm = None;
        {
            let mut health = self.health.lock().unwrap_or_else(|p| p.into_inner());
            let state = health.entry(account_id).or_default();
            match decision {
                Decision::Nothing => {}
                Decision::Success => {
                    state.failures = 0;
                    state.open_until = 0;
                    state.open_ms = 0;
                    state.probe_until = 0;
                }
                Decision::SoftBlock { ms } => {
                    state.soft_until = state.soft_until.max(now + ms as i64)
                }
                Decision::HardBlock { ms } => {
                    state.hard_until = state.hard_until.max(now + ms as i64);
                    cooldown = Some(ms);
                }
                // An upstream answer may have been shaped by the request: the probe confirms it.
                Decision::Broken { .. } if status != 0 => {
                    if state.confirming_until <= now && state.quiet_until <= now {
                        state.confirming_until = now + self.probe.block.as_millis() as i64;
                        confirm = Some(Suspicion::Broken);
                    }
                }
                Decision::Broken { ms } => {
                    apply_broken(state, &self.blocks, now, ms);
                    cooldown = Some(ms);
                }
                Decision::Unauthorized { ms } => {
                    state.hard_until = state.hard_until.max(now + ms as i64);
                    cooldown = Some(ms);
                    let window = self.blocks.unauthorized_window.as_millis() as i64;
                    state.unauthorized.push_back(now);
                    while state
                        .unauthorized
                        .front()
                        .is_some_and(|at| *at < now - window)
                    {
                        state.unauthorized.pop_front();
                    }
                    if state.unauthorized.len() as u32 >= self.blocks.unauthorized_error_count {
                        new_status = Some((
                            AccountStatus::Error,
                            format!("{} unauthorized outcomes", state.unauthorized.len()),
                        ));
                    }
                }
                Decision::Confirm => {
                    // One confirmation at a time; never a retirement by itself.
                    if state.confirming_until <= now && state.quiet_until <= now {
                        state.confirming_until = now + self.probe.block.as_millis() as i64;
                        confirm = Some(Suspicion::QuotaGone);
                    }
                }
            }
        }
        if let Some(suspicion) = confirm {
            self.start_confirmation(account_id, suspicion);
        }
        if let Some(ms) = cooldown {
            let _ = self
                .admission
                .set_cooldown(account_id, Duration::from_millis(ms))
                .await;
        }
        if let Some((status, reason)) = new_status {
            tracing::warn!(account_id, status = status.as_str(), %reason, "account status changed");
            self.set_status(account_id, status, reason);
        }
    }

    async fn bind_session(&self, group: &str, session_hash: &str, account_id: i64) {
        let mut sticky = self.sticky.lock().unwrap_or_else(|p| p.into_inner());
        if sticky.len() > 100_000 {
            sticky.retain(|_, (_, at)| at.elapsed() < BINDING_TTL);
        }
        sticky.insert(
            (group.to_owned(), session_hash.to_owned()),
            (account_id, Instant::now()),
        );
    }

    async fn bind_response(&self, response_id: &str, account_id: i64) {
        let mut responses = self.responses.lock().unwrap_or_else(|p| p.into_inner());
        if responses.len() > 100_000 {
            responses.retain(|_, (_, at)| at.elapsed() < BINDING_TTL);
        }
        responses.insert(response_id.to_owned(), (account_id, Instant::now()));
    }

    async fn models(&self, group: &str, platform: Platform) -> Vec<String> {
        let accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        group_models(accounts.iter().map(|a| a.as_ref()), group, platform)
    }

    fn record_usage(&self, record: UsageRecord) {
        tracing::debug!(
            account_id = record.account_id,
            model = %record.model,
            input = record.input_tokens,
            output = record.output_tokens,
            cost_usd = record.cost_usd,
            "usage"
        );
    }
}

impl StandaloneSelection {
    fn binding(&self, request: &PlanRequest) -> Option<i64> {
        if let Some(response_id) = &request.previous_response_id {
            let responses = self.responses.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((id, at)) = responses.get(response_id)
                && at.elapsed() < BINDING_TTL
            {
                return Some(*id);
            }
        }
        let session = request.session_hash.as_ref()?;
        let mut sticky = self.sticky.lock().unwrap_or_else(|p| p.into_inner());
        let entry = sticky.get_mut(&(request.group.clone(), session.clone()))?;
        if entry.1.elapsed() >= BINDING_TTL {
            return None;
        }
        entry.1 = Instant::now();
        Some(entry.0)
    }
}

/// Admission in this process: the engine on its memory backend.
pub struct LocalLeases {
    admission: Arc<Admission>,
}

impl LocalLeases {
    pub fn new(admission: Arc<Admission>) -> Self {
        LocalLeases { admission }
    }

    /// The admission engine on its memory backend, built as `admission-svc` builds it (with
    /// the release-retry task), its metrics in `registry`.
    pub fn engine(settings: Settings, registry: &prometheus::Registry) -> Arc<Admission> {
        admission_svc::server::memory_admission(
            settings,
            admission_svc::metrics::Metrics::registered_in(registry.clone()),
        )
    }
}

#[async_trait]
impl Leases for LocalLeases {
    async fn acquire(&self, terms: LeaseTerms, wait: Duration) -> Result<Acquired, BackendError> {
        let cancel = CancellationToken::new();
        let outcome = self
            .admission
            .acquire(&terms, wait, &cancel, |_| {})
            .await
            .map_err(|e| BackendError(e.to_string()))?;
        match outcome {
            AcquireOutcome::Granted(lease_id) => {
                let renewer = tokio::spawn(renew(
                    self.admission.clone(),
                    lease_id.clone(),
                    terms.clone(),
                ));
                Ok(Acquired::Granted(Box::new(LocalLease {
                    admission: self.admission.clone(),
                    lease_id,
                    terms,
                    attempts: AtomicU32::new(0),
                    renewer,
                    released: false,
                })))
            }
            AcquireOutcome::Denied(denial) => Ok(Acquired::Denied(denial)),
            AcquireOutcome::Cancelled => Err(BackendError("acquire cancelled".into())),
        }
    }
}

async fn renew(admission: Arc<Admission>, lease_id: LeaseId, terms: LeaseTerms) {
    let every = admission.settings().lease_ttl / 3;
    loop {
        tokio::time::sleep(every).await;
        let _ = admission.renew(&lease_id, &terms).await;
    }
}

struct LocalLease {
    admission: Arc<Admission>,
    lease_id: LeaseId,
    terms: LeaseTerms,
    attempts: AtomicU32,
    renewer: tokio::task::JoinHandle<()>,
    released: bool,
}

#[async_trait]
impl Lease for LocalLease {
    async fn attempt(&mut self) -> bool {
        let n = self.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        matches!(
            self.admission.attempt(&self.lease_id, &self.terms, n).await,
            Ok(None)
        )
    }

    async fn release(mut self: Box<Self>, spend_usd: f64) {
        self.released = true;
        self.renewer.abort();
        let micros = usd_to_micros(spend_usd).unwrap_or(0);
        self.admission
            .release(&self.lease_id, Some(&self.terms), micros)
            .await;
    }
}

impl Drop for LocalLease {
    fn drop(&mut self) {
        self.renewer.abort();
        if !self.released {
            let (admission, lease_id, terms) = (
                self.admission.clone(),
                self.lease_id.clone(),
                self.terms.clone(),
            );
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    admission.release(&lease_id, Some(&terms), 0).await;
                });
            }
        }
    }
}
