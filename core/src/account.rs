//! Accounts as selection sees them: platforms, credentials (and the `Secret` that never prints),
//! client keys, prices. Nothing here knows gRPC, Postgres or Redis.

use std::collections::HashMap;
use std::fmt;

use crate::AccountId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    Anthropic,
    OpenAi,
}

impl Platform {
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Anthropic => "anthropic",
            Platform::OpenAi => "openai",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "anthropic" => Some(Platform::Anthropic),
            "openai" => Some(Platform::OpenAi),
            _ => None,
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
}

impl Account {
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

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    pub cache_write_per_mtok: f64,
    pub cache_read_per_mtok: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

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
