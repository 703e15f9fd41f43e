//! The standalone YAML file: listen address, client keys, accounts (API keys or subscription
//! sign-ins), prices — checked once at start and turned into the selector's snapshot.

use std::collections::HashMap;

use poolgate_core::account::{
    Account, AccountStatus, ApiKeyRecord, CredentialKind, GroupSettings, OAuthState, Platform,
    Price, Secret, Service, default_oauth_token_url, serves_problem,
};
use poolgate_core::keys::{KeyAccess, check_new_model_patterns, parse_endpoints};
use poolgate_core::lease::KeyLimits;
use poolgate_core::money::{MAX_SPEND_USD, usd_to_micros};
use poolgate_core::price::{UnpricedPolicy, check_price};
use poolgate_core::windows::Thresholds;
use poolgate_operator::instant::parse_instant;
use poolgate_select::crypto::{api_key_hash, api_key_prefix};
use poolgate_select::snapshot::Snapshot;
use serde::Deserialize;

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
    /// The operator's prices, over the catalogue shipped with the build (docs/DESIGN.md §6,
    /// "Prices").
    #[serde(default)]
    pub prices: Prices,
    /// What a model with neither a price here nor one in the catalogue costs: `fallback`
    /// (default: its family's highest catalogue price) or `refuse` (no price: refused to a key
    /// with a budget, naming the model).
    #[serde(default)]
    pub unpriced: Option<String>,
    /// Per-group settings by group name (a group not named has the defaults).
    #[serde(default)]
    pub groups: HashMap<String, GroupEntry>,
    /// How often each OAuth account's usage endpoint (the one its CLI reads) is read for its
    /// windows, in seconds, and at start (docs/SUBSCRIPTIONS.md, "Probes and usage
    /// readings"). Default 300; 0: never.
    #[serde(default)]
    pub usage_read_every_secs: Option<u64>,
}

/// What a group sets (see `GroupSettings`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupEntry {
    /// Pass the accounts' usage-window headers on to clients: only for a pool with one user.
    #[serde(default)]
    pub usage_headers_to_clients: bool,
    /// Above this share of any plan usage window an account orders last for new sessions
    /// (default 0.9; docs/DESIGN.md §5).
    #[serde(default)]
    pub window_shed_at: Option<f64>,
    /// Above this share its sticky sessions move too (default 0.97).
    #[serde(default)]
    pub window_move_at: Option<f64>,
    /// Subscription accounts serve only the platform's own CLI; other clients go to the
    /// group's API-key accounts (docs/SUBSCRIPTIONS.md, "Other clients").
    #[serde(default)]
    pub subscriptions_cli_only: bool,
    /// `passthrough`: rerank requests no account can serve now get the documents in the order
    /// they were sent, marked as not reranked; `error` (default): an error. A request's
    /// `x-poolgate-rerank-fallback` header decides for itself (docs/DESIGN.md §6).
    #[serde(default)]
    pub rerank_fallback: Option<String>,
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
    /// When the key stops working: RFC 3339 (`2026-12-31T23:59:59Z`), a date (its midnight UTC)
    /// or seconds since the epoch. None: never.
    #[serde(default)]
    pub expires_at: Option<serde_yaml_ng::Value>,
    /// Refused until enabled (`relay-svc admin enable-key`, which the state file keeps).
    #[serde(default)]
    pub disabled: bool,
    /// Glob patterns (`*`: any run of characters) on the model the client asks for; empty: any.
    #[serde(default, alias = "allowed_models")]
    pub models: Vec<String>,
    /// `messages`, `count_tokens`, `chat_completions`, `responses`, `models`; empty: any.
    #[serde(default, alias = "allowed_endpoints")]
    pub endpoints: Vec<String>,
    /// Requests of the key in flight at once (docs/DESIGN.md §4, "Client key limits"); 0: none.
    #[serde(default, alias = "concurrency_limit")]
    pub concurrency: i64,
    /// Input + output tokens over a rolling minute; 0: none.
    #[serde(default, alias = "tpm_limit")]
    pub tpm: i64,
    /// Spend budgets in USD (the relay's `--budget-time-zone` and `--budget-week-start` calendar).
    #[serde(default)]
    pub budget_usd: BudgetEntry,
}

/// A key's spend budgets in USD; absent or 0: none.
#[derive(Debug, Default, Deserialize)]
pub struct BudgetEntry {
    #[serde(default)]
    pub total: f64,
    #[serde(default)]
    pub day: f64,
    #[serde(default)]
    pub week: f64,
    #[serde(default)]
    pub month: f64,
}

impl KeyEntry {
    /// What the key may reach, checked; the error names the field (`expires_at: …`).
    fn access(&self) -> Result<KeyAccess, String> {
        let expires_at_ms = match &self.expires_at {
            None | Some(serde_yaml_ng::Value::Null) => None,
            Some(serde_yaml_ng::Value::String(text)) => {
                Some(parse_instant(text).map_err(|problem| format!("expires_at: {problem}"))?)
            }
            Some(serde_yaml_ng::Value::Number(number)) => Some(
                number
                    .as_u64()
                    .and_then(|seconds| i64::try_from(seconds).ok())
                    .and_then(|seconds| seconds.checked_mul(1000))
                    .ok_or("expires_at: seconds since the epoch must be a whole number >= 0")?,
            ),
            Some(_) => {
                return Err(
                    "expires_at: write an RFC 3339 time, a date or seconds since the epoch".into(),
                );
            }
        };
        check_new_model_patterns(&self.models).map_err(|problem| format!("models: {problem}"))?;
        let endpoints =
            parse_endpoints(&self.endpoints).map_err(|problem| format!("endpoints: {problem}"))?;
        Ok(KeyAccess {
            expires_at_ms,
            disabled: self.disabled,
            allowed_models: self.models.clone(),
            allowed_endpoints: endpoints,
        })
    }

    /// The key's limits (`api_key_id` is the key's id), checked; the error names the field
    /// (`concurrency: …`, `budget_usd.day: …`).
    fn limits(&self, api_key_id: i64) -> Result<KeyLimits, String> {
        let concurrency_limit = i32::try_from(self.concurrency)
            .ok()
            .filter(|limit| *limit >= 0)
            .ok_or_else(|| {
                format!(
                    "concurrency: must be a whole number >= 0 (0: none), got {}",
                    self.concurrency
                )
            })?;
        if self.tpm < 0 {
            return Err(format!(
                "tpm: must be a whole number >= 0 (0: none), got {}",
                self.tpm
            ));
        }
        let budget = |period: &str, usd: f64| {
            usd_to_micros(usd).ok_or_else(|| {
                format!(
                    "budget_usd.{period}: must be an amount in [0, {MAX_SPEND_USD}] USD \
                     (0: none), got {usd}"
                )
            })
        };
        Ok(KeyLimits {
            api_key_id,
            concurrency_limit,
            tpm_limit: self.tpm,
            budget_total_micros: budget("total", self.budget_usd.total)?,
            budget_day_micros: budget("day", self.budget_usd.day)?,
            budget_week_micros: budget("week", self.budget_usd.week)?,
            budget_month_micros: budget("month", self.budget_usd.month)?,
        })
    }
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
    /// `anthropic`, `openai` or `rerank` (Cohere's format: Cohere, Jina, vLLM; API keys).
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
    /// What the upstream answers (`chat`, `embeddings`, `rerank`) when less than its platform
    /// can: `[chat]` for an OpenAI-compatible upstream without embeddings, `[embeddings]` for an
    /// embeddings server. Default: all the platform and credential can.
    #[serde(default)]
    pub serves: Vec<String>,
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
    /// Rerank: USD per search unit (one query over up to 100 documents).
    #[serde(default)]
    pub search_unit: f64,
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
        file.unpriced_policy()?;
        if file.accounts.is_empty() {
            return Err("config: no accounts".into());
        }
        Ok(file)
    }

    fn accounts(&self) -> Result<Vec<Account>, String> {
        let mut accounts = Vec::new();
        let mut ids = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for (index, entry) in self.accounts.iter().enumerate() {
            let at =
                |message: &str| format!("config: accounts[{index}] ({}): {message}", entry.name);
            // The name is what the state file keeps an account's tokens and status under.
            if entry.name.trim().is_empty() || !names.insert(entry.name.as_str()) {
                return Err(at("name must be non-empty and unique"));
            }
            let platform = Platform::parse(&entry.platform)
                .ok_or_else(|| at("platform must be anthropic, openai or rerank"))?;
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
            if platform == Platform::Rerank && credential_kind != CredentialKind::ApiKey {
                return Err(at("rerank accounts are API keys"));
            }
            let mut serves = Vec::with_capacity(entry.serves.len());
            for name in &entry.serves {
                let service = Service::parse(name).ok_or_else(|| {
                    at(&format!(
                        "serves: {name:?} is not one of chat, embeddings, rerank"
                    ))
                })?;
                if !serves.contains(&service) {
                    serves.push(service);
                }
            }
            if let Some(problem) = serves_problem(platform, credential_kind, &serves) {
                return Err(at(&format!("serves: {problem}")));
            }
            if let Some(problem) = poolgate_select::probe::probe_model_refusal(
                platform,
                credential_kind,
                entry.probe_model.as_deref().unwrap_or_default(),
            ) {
                return Err(at(&format!("probe_model: {problem}")));
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
                serves,
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
                identity: Default::default(),
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
            // A key's group must exist: an account's, or declared under `groups:` (a typo would
            // leave every request of the key without an account).
            if !self.accounts.iter().any(|a| a.group == entry.group)
                && !self.groups.contains_key(&entry.group)
            {
                return Err(format!(
                    "config: api_keys[{index}].group: no account is in the group {:?} and it is not declared under groups:",
                    entry.group
                ));
            }
            let id = index as i64 + 1;
            let (access, limits) = entry
                .access()
                .and_then(|access| Ok((access, entry.limits(id)?)))
                .map_err(|problem| format!("config: api_keys[{index}].{problem}"))?;
            let record = ApiKeyRecord {
                id,
                name: format!("api_keys[{index}]"),
                prefix: api_key_prefix(&entry.key),
                user: entry.user.clone(),
                group: entry.group.clone(),
                user_rpm_limit: entry.rpm_limit,
                limits,
                active: true,
                access,
            };
            if keys.insert(api_key_hash(&entry.key), record).is_some() {
                return Err(format!(
                    "config: api_keys[{index}]: the key is listed twice"
                ));
            }
        }
        let groups = self.api_keys.iter().map(|k| k.group.clone()).collect();
        let mut settings = HashMap::new();
        for (name, entry) in &self.groups {
            let defaults = Thresholds::default();
            Thresholds::new(
                entry.window_shed_at.unwrap_or(defaults.shed),
                entry.window_move_at.unwrap_or(defaults.move_sessions),
            )
            .map_err(|problem| {
                format!("config: groups.{name}: window_shed_at / window_move_at: {problem}")
            })?;
            let rerank_passthrough = match entry.rerank_fallback.as_deref() {
                None | Some("error") => false,
                Some("passthrough") => true,
                Some(other) => {
                    return Err(format!(
                        "config: groups.{name}: rerank_fallback: {other:?} is neither \"passthrough\" nor \"error\""
                    ));
                }
            };
            let group = GroupSettings {
                usage_headers_to_clients: entry.usage_headers_to_clients,
                window_shed_at: entry.window_shed_at,
                window_move_at: entry.window_move_at,
                subscriptions_cli_only: entry.subscriptions_cli_only,
                rerank_passthrough,
            };
            settings.insert(name.clone(), group);
        }
        Ok(
            Snapshot::new(groups, self.accounts()?, keys, self.prices()?)
                .with_group_settings(settings),
        )
    }

    /// The file's `unpriced` policy (default `fallback`).
    pub fn unpriced_policy(&self) -> Result<UnpricedPolicy, String> {
        match self.unpriced.as_deref() {
            None => Ok(UnpricedPolicy::default()),
            Some(text) => UnpricedPolicy::parse(text).ok_or_else(|| {
                format!("config: unpriced: {text:?} is neither \"fallback\" nor \"refuse\"")
            }),
        }
    }

    /// The operator's prices, each checked (`prices[i].output: …`, `prices.<model>.input: …`).
    fn prices(&self) -> Result<HashMap<String, Price>, String> {
        let price = |p: &PriceEntry| Price {
            input_per_mtok: p.input,
            output_per_mtok: p.output,
            cache_write_per_mtok: p.cache_write,
            cache_read_per_mtok: p.cache_read,
            per_search_unit: p.search_unit,
        };
        let checked = |at: String, model: String, p: &PriceEntry| {
            let price = price(p);
            check_price(&model, &price)
                .map(|()| (model, price))
                .map_err(|(field, problem)| format!("config: {at}.{field}: {problem}"))
        };
        match &self.prices {
            Prices::Map(map) => map
                .iter()
                .map(|(model, p)| checked(format!("prices.{model}"), model.clone(), p))
                .collect(),
            Prices::List(list) => list
                .iter()
                .enumerate()
                .map(|(index, p)| {
                    let model = p
                        .model
                        .clone()
                        .ok_or_else(|| format!("config: prices[{index}]: model is required"))?;
                    checked(format!("prices[{index}]"), model, p)
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

#[cfg(test)]
mod tests;
