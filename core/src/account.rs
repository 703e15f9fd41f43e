//! Accounts as selection sees them: platforms, credentials (and the `Secret` that never prints),
//! client keys, prices. Nothing here knows gRPC, Postgres or Redis.

use std::collections::HashMap;
use std::fmt;

use crate::AccountId;
pub use crate::service::{Service, serves_problem};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    Anthropic,
    OpenAi,
    /// Rerank APIs in Cohere's format (`/v1/rerank`, `/v2/rerank`): Cohere, and the Jina, vLLM
    /// and other servers that speak it. API keys only.
    Rerank,
}

impl Platform {
    pub const ALL: [Platform; 3] = [Platform::Anthropic, Platform::OpenAi, Platform::Rerank];

    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Anthropic => "anthropic",
            Platform::OpenAi => "openai",
            Platform::Rerank => "rerank",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Platform::ALL.into_iter().find(|p| p.as_str() == text)
    }

    /// Whether an account of this platform and credential kind can serve `service` at all (an
    /// account's own list, [`Account::serves`], may name less).
    pub fn can_serve(self, kind: CredentialKind, service: Service) -> bool {
        match (self, kind, service) {
            (Platform::Anthropic, _, Service::Chat) => true,
            (Platform::OpenAi, CredentialKind::ChatGptOAuth, Service::Chat) => true,
            (Platform::OpenAi, CredentialKind::ChatGptOAuth, _) => false,
            (Platform::OpenAi, _, Service::Chat | Service::Embeddings) => true,
            (Platform::Rerank, CredentialKind::ApiKey, Service::Rerank) => true,
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountStatus {
    Active,
    Disabled,
    Error,
    Retired,
}

impl AccountStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            AccountStatus::Active => "active",
            AccountStatus::Disabled => "disabled",
            AccountStatus::Error => "error",
            AccountStatus::Retired => "retired",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "active" => Some(AccountStatus::Active),
            "disabled" => Some(AccountStatus::Disabled),
            "error" => Some(AccountStatus::Error),
            "retired" => Some(AccountStatus::Retired),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialKind {
    ApiKey,
    /// A Claude subscription signed in with OAuth (Anthropic).
    OAuth,
    /// A ChatGPT subscription signed in with OAuth (the Codex CLI's sign-in): served through the
    /// ChatGPT backend's Codex endpoint, `/v1/responses` only.
    ChatGptOAuth,
}

impl CredentialKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialKind::ApiKey => "api_key",
            CredentialKind::OAuth => "oauth",
            CredentialKind::ChatGptOAuth => "chatgpt_oauth",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "api_key" => Some(CredentialKind::ApiKey),
            "oauth" => Some(CredentialKind::OAuth),
            "chatgpt_oauth" => Some(CredentialKind::ChatGptOAuth),
            _ => None,
        }
    }
}

/// A secret string: its `Debug` and `Display` never show it, so it cannot reach a log by accident.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `…wxyz`: the last four characters, enough to tell two credentials apart, never enough
    /// to use one. The head is not shown: it is the vendor's fixed prefix (`sk-ant-`) at best,
    /// and four more known characters of a credential at worst. A secret of 12 characters or
    /// fewer shows nothing but `…`.
    pub fn masked(&self) -> String {
        let chars: Vec<char> = self.0.chars().collect();
        if chars.len() <= 12 {
            return "…".repeat(usize::from(!chars.is_empty()));
        }
        let tail: String = chars[chars.len() - 4..].iter().collect();
        format!("…{tail}")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// OAuth state of an account signed in with a subscription.
#[derive(Debug, Clone, PartialEq)]
pub struct OAuthState {
    pub refresh_token: Secret,
    /// Access token expiry, ms since the epoch (0: unknown).
    pub expires_at_ms: i64,
    pub token_url: String,
    /// Sent with refresh requests; empty: the platform's default (`default_oauth_client_id`).
    pub client_id: String,
}

impl OAuthState {
    /// The client id a refresh request carries.
    pub fn client_id_for(&self, platform: Platform) -> &str {
        if self.client_id.is_empty() {
            default_oauth_client_id(platform)
        } else {
            &self.client_id
        }
    }
}

impl CredentialKind {
    /// Signed in with OAuth (a refresh token keeps it alive).
    pub fn is_oauth(self) -> bool {
        matches!(self, CredentialKind::OAuth | CredentialKind::ChatGptOAuth)
    }
}

/// The ChatGPT account a Codex access token belongs to: its JWT's
/// `https://api.openai.com/auth` claim, `chatgpt_account_id` (the backend wants it in the
/// `chatgpt-account-id` header). `None` when the token carries none.
pub fn chatgpt_account_id(access_token: &str) -> Option<String> {
    use base64::Engine;
    let payload = access_token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims
        .get("https://api.openai.com/auth")?
        .get("chatgpt_account_id")?
        .as_str()
        .filter(|id| !id.is_empty() && id.len() <= 128)
        .map(str::to_owned)
}

/// The public OAuth client ids of the official CLIs, whose sign-ins subscription accounts come
/// from: Claude Code's for Anthropic, the Codex CLI's for OpenAI (ChatGPT).
pub fn default_oauth_client_id(platform: Platform) -> &'static str {
    match platform {
        Platform::Anthropic => "9d1c250a-e61b-44d9-88ed-5944d1962f5e",
        Platform::OpenAi => "app_EMoamEEZ73f0CkXaXp7hrann",
        Platform::Rerank => "",
    }
}

/// Claude Code's token endpoint before it moved to `platform.claude.com`; it now answers 404.
/// Migration 0003 rewrites stored rows that still name it.
pub const LEGACY_ANTHROPIC_TOKEN_URL: &str = "https://console.anthropic.com/v1/oauth/token";

/// Where the official CLIs refresh their subscription tokens (Claude Code's `TOKEN_URL`, the
/// Codex CLI's refresh endpoint). An account without a token URL of its own uses these, applied
/// when it is read, so a changed default needs no rewrite of stored rows.
pub fn default_oauth_token_url(platform: Platform) -> &'static str {
    match platform {
        Platform::Anthropic => "https://platform.claude.com/v1/oauth/token",
        Platform::OpenAi => "https://auth.openai.com/oauth/token",
        Platform::Rerank => "",
    }
}

/// One upstream account, credentials decrypted (the selector is the only place that holds them).
#[derive(Debug, Clone, PartialEq)]
pub struct Account {
    pub id: AccountId,
    pub name: String,
    pub group: String,
    pub platform: Platform,
    pub base_url: String,
    pub credential_kind: CredentialKind,
    pub credential: Secret,
    pub oauth: Option<OAuthState>,
    pub status: AccountStatus,
    pub status_reason: String,
    pub priority: i32,
    pub weight: i32,
    pub concurrency_limit: i32,
    pub rpm_limit: i32,
    pub session_window_limit_usd: f64,
    /// Empty: every model.
    pub allowed_models: Vec<String>,
    pub model_mapping: HashMap<String, String>,
    pub proxy_url: Option<String>,
    /// The model the confirmation probe asks for; `None`: the platform's default.
    pub probe_model: Option<String>,
    /// OpenAI chat streams: ask the upstream for usage when the client did not (default on).
    pub stream_usage: bool,
    /// Who the upstream says this account is, when it was signed in (or imported) through
    /// poolgate; empty for an account configured by hand.
    pub identity: AccountIdentity,
    /// What the upstream answers; empty: all its platform and kind can
    /// ([`Platform::can_serve`]). An OpenAI-compatible upstream without embeddings says
    /// `[chat]`; an embeddings server `[embeddings]` (its probe then asks for an embedding).
    pub serves: Vec<Service>,
}

/// Who an upstream says a subscription account is, from what its sign-in returned: the id that
/// makes it one account (signing the same one in again updates it in place), the email and the
/// plan operators see. Empty fields: not known.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccountIdentity {
    /// The upstream's ids of the signed-in user and of the organisation or workspace whose
    /// subscription it uses, as `<user>/<organisation>`: Anthropic's account and organization
    /// uuids; ChatGPT's `chatgpt_user_id` and `chatgpt_account_id` (a Team workspace is one
    /// account id for all its members, each with limits of their own). Unique per platform.
    pub upstream_id: String,
    pub email: String,
    /// The subscription as the upstream names it (`max`, `pro`, `plus`, `team`, …).
    pub plan: String,
}

impl AccountIdentity {
    /// The `<user>/<organisation>` id of an account; `None` unless both are known: an
    /// organisation (a Team workspace) alone would make its members one account, and a user
    /// alone would make the same subscription a second account once its organisation is known.
    pub fn upstream_id(user: &str, organisation: &str) -> Option<String> {
        if user.is_empty() || organisation.is_empty() {
            return None;
        }
        Some(format!("{user}/{organisation}"))
    }

    pub fn is_known(&self) -> bool {
        !self.upstream_id.is_empty()
    }
}

impl Account {
    /// Whether the account answers `service` (its own list, else its platform's).
    pub fn serves(&self, service: Service) -> bool {
        if self.serves.is_empty() {
            self.platform.can_serve(self.credential_kind, service)
        } else {
            self.serves.contains(&service)
        }
    }

    pub fn allows(&self, model: &str) -> bool {
        self.allowed_models.is_empty() || self.allowed_models.iter().any(|m| m == model)
    }

    pub fn mapped_model(&self, model: &str) -> String {
        self.model_mapping
            .get(model)
            .cloned()
            .unwrap_or_else(|| model.to_owned())
    }
}

/// The models a group's active accounts of `platform` name (allow-lists and mapping keys),
/// sorted, each once: what `/v1/models` lists, in both modes.
pub fn group_models<'a>(
    accounts: impl IntoIterator<Item = &'a Account>,
    group: &str,
    platform: Platform,
) -> Vec<String> {
    let mut models: Vec<String> = accounts
        .into_iter()
        .filter(|a| a.group == group && a.platform == platform && a.status == AccountStatus::Active)
        .flat_map(|a| a.allowed_models.iter().chain(a.model_mapping.keys()))
        .cloned()
        .collect();
    models.sort();
    models.dedup();
    models
}

/// What a group sets for every request it serves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupSettings {
    /// Clients get the pooled account's usage-window headers (`anthropic-ratelimit-unified-*`,
    /// `x-codex-*`). They describe the account, which every client of a shared pool shares: only
    /// a pool with one user (its own subscription behind the relay) should pass them on.
    pub usage_headers_to_clients: bool,
    /// The group's own usage-window shed threshold (docs/DESIGN.md §5); `None`: the
    /// deployment's.
    pub window_shed_at: Option<f64>,
    /// The group's own threshold above which sticky sessions move; `None`: the deployment's.
    pub window_move_at: Option<f64>,
    /// The group's subscription accounts serve only the platform's own CLI (Claude Code on a
    /// Claude subscription, Codex on a ChatGPT one); every other client's request goes to the
    /// group's API-key accounts (docs/SUBSCRIPTIONS.md, "Other clients").
    pub subscriptions_cli_only: bool,
    /// Rerank requests no account can serve now get the recall order, marked as not reranked,
    /// unless the request says otherwise (docs/DESIGN.md §6, "Embeddings and rerank").
    pub rerank_passthrough: bool,
}

/// A client API key, as authentication needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKeyRecord {
    pub id: i64,
    pub name: String,
    pub prefix: String,
    pub user: String,
    pub group: String,
    pub user_rpm_limit: i32,
    pub active: bool,
    /// Its expiry, disable and model/endpoint lists (`keys::KeyAccess`; empty: no limits).
    pub access: crate::keys::KeyAccess,
    /// Its concurrency, TPM and budgets, counted by admission (`lease::KeyLimits`; every limit
    /// 0: none). `limits.api_key_id` is this key's id.
    pub limits: crate::lease::KeyLimits,
}

/// A model's price: USD per million tokens of each kind, and USD per search unit (rerank, as
/// Cohere bills: one query over up to 100 documents).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    pub cache_write_per_mtok: f64,
    pub cache_read_per_mtok: f64,
    pub per_search_unit: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_an_account_serves_is_its_list_else_its_platforms() {
        let mut account = Account {
            id: 1,
            name: "a".into(),
            group: "g".into(),
            platform: Platform::OpenAi,
            base_url: String::new(),
            credential_kind: CredentialKind::ApiKey,
            credential: Secret::new("k"),
            oauth: None,
            status: AccountStatus::Active,
            status_reason: String::new(),
            priority: 0,
            weight: 1,
            concurrency_limit: 0,
            rpm_limit: 0,
            session_window_limit_usd: 0.0,
            allowed_models: Vec::new(),
            model_mapping: HashMap::new(),
            proxy_url: None,
            probe_model: None,
            stream_usage: true,
            identity: AccountIdentity::default(),
            serves: Vec::new(),
        };
        assert!(account.serves(Service::Chat) && account.serves(Service::Embeddings));
        assert!(!account.serves(Service::Rerank));
        account.serves = vec![Service::Chat];
        assert!(!account.serves(Service::Embeddings), "a chat-only upstream");
        account.serves = vec![Service::Embeddings];
        assert!(!account.serves(Service::Chat), "an embeddings server");
        account.credential_kind = CredentialKind::ChatGptOAuth;
        account.serves = Vec::new();
        assert!(
            !account.serves(Service::Embeddings),
            "ChatGPT serves the Responses API only"
        );
        account.platform = Platform::Rerank;
        account.credential_kind = CredentialKind::ApiKey;
        assert!(account.serves(Service::Rerank) && !account.serves(Service::Chat));
    }

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("sk-ant-api03-very-secret-value");
        assert_eq!(format!("{secret:?}"), "Secret(***)");
        assert_eq!(format!("{secret}"), "***");
        assert_eq!(secret.masked(), "…alue", "the last four characters only");
        assert_eq!(Secret::new("short").masked(), "…");
        assert_eq!(Secret::new("").masked(), "");
    }
}

/// Where a platform's accounts are called when a sign-in or an import names no base URL: the
/// API for keys and Claude subscriptions, the ChatGPT backend for ChatGPT subscriptions
/// (docs/SUBSCRIPTIONS.md).
pub fn default_base_url(platform: Platform, kind: CredentialKind) -> &'static str {
    match (platform, kind) {
        (Platform::Anthropic, _) => "https://api.anthropic.com",
        (Platform::OpenAi, CredentialKind::ChatGptOAuth) => "https://chatgpt.com/backend-api",
        (Platform::OpenAi, _) => "https://api.openai.com",
        (Platform::Rerank, _) => "https://api.cohere.com",
    }
}

/// Settings an import carries from its source (CLIProxyAPI, sub2api, claude-relay-service);
/// `None`: keep the account's (a new account: the defaults).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportedSettings {
    pub priority: Option<i32>,
    pub concurrency_limit: Option<i32>,
    pub rpm_limit: Option<i32>,
    pub proxy_url: Option<String>,
    pub model_mapping: Option<HashMap<String, String>>,
}

/// What a sign-in (`login`) or an import puts into the pool: the tokens the upstream returned
/// and who it says the account is. The account is found by `account_id` when given (signing
/// that one in again), else by platform and identity; found, its tokens, token endpoint and
/// client id are replaced in place (id, settings, group and history kept; an account in `error`
/// comes back to `active`); otherwise a new account is created, with `settings`.
#[derive(Debug, Clone, PartialEq)]
pub struct SignIn {
    pub platform: Platform,
    pub kind: CredentialKind,
    /// The API key or the OAuth access token.
    pub access_token: Secret,
    /// Empty: none. Claude Code's `setup-token` makes a year-long inference-only token with no
    /// refresh token: the account is signed in again before `expires_at_ms`.
    pub refresh_token: Secret,
    /// Access token expiry, ms since the epoch (0: unknown).
    pub expires_at_ms: i64,
    /// Where the token is refreshed; empty: the platform's default.
    pub token_url: String,
    /// The client id refreshes carry; empty: the platform's default.
    pub client_id: String,
    pub identity: AccountIdentity,
    pub account_id: Option<AccountId>,
    /// A new account's name; `None`: [`SignIn::default_name`].
    pub name: Option<String>,
    /// A new account's group (an existing account keeps its own); `None`: `default`.
    pub group: Option<String>,
    /// A new account's base URL; `None`: [`default_base_url`].
    pub base_url: Option<String>,
    pub settings: ImportedSettings,
}

/// The group a signed-in account joins when none is named.
pub const DEFAULT_GROUP: &str = "default";

impl SignIn {
    /// A sign-in of `access_token` (an API key, or an access token without a refresh token,
    /// expiry or identity yet): the fields the flows and the imports then fill in.
    pub fn new(platform: Platform, kind: CredentialKind, access_token: impl Into<String>) -> Self {
        SignIn {
            platform,
            kind,
            access_token: Secret::new(access_token),
            refresh_token: Secret::default(),
            expires_at_ms: 0,
            token_url: String::new(),
            client_id: String::new(),
            identity: AccountIdentity::default(),
            account_id: None,
            name: None,
            group: None,
            base_url: None,
            settings: ImportedSettings::default(),
        }
    }

    /// The name a new account gets when none is given: the platform's short name and the email
    /// (`claude-ada@example.com`, `chatgpt-ada@example.com`), else the start of the upstream id.
    pub fn default_name(&self) -> String {
        let prefix = match (self.platform, self.kind) {
            (Platform::Anthropic, CredentialKind::ApiKey) => "anthropic",
            (Platform::Anthropic, _) => "claude",
            (Platform::OpenAi, CredentialKind::ChatGptOAuth) => "chatgpt",
            (Platform::OpenAi, _) => "openai",
            (Platform::Rerank, _) => "rerank",
        };
        let who = if self.identity.email.is_empty() {
            self.identity.upstream_id.chars().take(12).collect()
        } else {
            self.identity.email.clone()
        };
        format!("{prefix}-{who}")
    }

    /// The first field that cannot be stored, and why.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        let oauth = self.kind.is_oauth();
        if self.kind == CredentialKind::ChatGptOAuth && self.platform != Platform::OpenAi {
            return Some(("platform", "a ChatGPT account is on platform openai".into()));
        }
        if self.access_token.is_empty() || self.access_token.expose().len() > 16_384 {
            return Some(("access_token", "must be 1..=16384 bytes".into()));
        }
        if self.refresh_token.expose().len() > 16_384 {
            return Some(("refresh_token", "must be at most 16384 bytes".into()));
        }
        if !oauth && !self.refresh_token.is_empty() {
            return Some(("refresh_token", "an API key has none".into()));
        }
        if self.expires_at_ms < 0 {
            return Some(("expires_at", "must not be negative".into()));
        }
        for (field, value, max) in [
            ("upstream_id", &self.identity.upstream_id, 512),
            ("email", &self.identity.email, 320),
            ("plan", &self.identity.plan, 64),
        ] {
            if value.len() > max || value.chars().any(char::is_control) {
                return Some((
                    field,
                    format!("must be at most {max} bytes, no control characters"),
                ));
            }
        }
        if !self.identity.is_known() {
            return Some((
                "upstream_id",
                "the sign-in named no account or organisation id".into(),
            ));
        }
        let name = self.name.clone().unwrap_or_else(|| self.default_name());
        for (field, value) in [("name", Some(&name)), ("group", self.group.as_ref())] {
            if let Some(value) = value
                && (value.trim().is_empty()
                    || value.len() > 128
                    || value.chars().any(char::is_control))
            {
                let hint = if field == "name" && self.name.is_none() {
                    " (the default, from the email, is longer: give one)"
                } else {
                    ""
                };
                return Some((
                    field,
                    format!("must be 1..=128 bytes, no control characters{hint}"),
                ));
            }
        }
        if self.client_id.len() > 256 || self.client_id.chars().any(char::is_control) {
            return Some((
                "client_id",
                "must be at most 256 bytes, no control characters".into(),
            ));
        }
        let settings = &self.settings;
        for (field, value) in [
            ("concurrency_limit", settings.concurrency_limit),
            ("rpm_limit", settings.rpm_limit),
        ] {
            if value.is_some_and(|v| v < 0) {
                return Some((field, "must not be negative".into()));
            }
        }
        if let Some(proxy) = &settings.proxy_url
            && (proxy.len() > 2048 || proxy.chars().any(|c| c.is_control() || c.is_whitespace()))
        {
            return Some(("proxy_url", "must be at most 2048 bytes, no spaces".into()));
        }
        let url_problem = |url: &str| {
            !(url.starts_with("http://") || url.starts_with("https://"))
                || url.len() > 2048
                || url.chars().any(|c| c.is_control() || c.is_whitespace())
        };
        if let Some(url) = &self.base_url
            && url_problem(url)
        {
            return Some(("base_url", "must be an http(s) URL".into()));
        }
        if !self.token_url.is_empty() && url_problem(&self.token_url) {
            return Some(("token_url", "must be an http(s) URL".into()));
        }
        None
    }
}

/// What a sign-in did.
#[derive(Debug, Clone, PartialEq)]
pub struct SignedIn {
    /// The account after.
    pub account: Account,
    /// A new account (`false`: an existing one's tokens were replaced).
    pub created: bool,
    /// It was in `error` and is `active` again.
    pub reactivated: bool,
}

#[cfg(test)]
mod identity_tests {
    use super::AccountIdentity;

    #[test]
    fn an_identity_needs_the_user_and_the_organisation() {
        assert_eq!(
            AccountIdentity::upstream_id("u1", "org").as_deref(),
            Some("u1/org")
        );
        // Two members of one Team workspace are two accounts, never one "/org".
        assert_eq!(AccountIdentity::upstream_id("", "org"), None);
        assert_eq!(AccountIdentity::upstream_id("u1", ""), None);
    }
}
