//! Where accounts come from, behind one trait: what the engine, the token refresher and the
//! snapshot reload need of the config ([`AccountSource`]), and what the operator's verbs read and
//! write of it beyond that ([`AdminStore`]). Two sources: Postgres (`selector-svc`'s `store.rs`:
//! every selector replica) and memory (`memory.rs`: the relay's standalone mode, its config file
//! plus an optional state file for what must survive a restart).

use std::collections::HashMap;

use async_trait::async_trait;

use crate::crypto::CryptoError;
use crate::snapshot::Snapshot;
use poolgate_core::AccountId;
use poolgate_core::account::{
    Account, AccountStatus, ApiKeyRecord, OAuthState, Price, Secret, SignIn, SignedIn,
};
use poolgate_core::keys::KeyUpdate;

pub mod budgets;
mod memory;

pub use memory::{MemorySource, StateFile, USAGE_RETENTION_MS};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("postgres unavailable: {0}")]
    Unavailable(String),
    /// A schema the selector does not run on: older than it knows, or newer and needing a later
    /// release (`hint` says which, and what to do).
    #[error("database schema is at version {found}, this selector knows version {known}: {hint}")]
    Schema {
        found: i64,
        known: i64,
        hint: String,
    },
    #[error("not found: {0}")]
    NotFound(String),
    #[error("conflict: {0}")]
    Conflict(String),
    /// A change this store cannot make, naming the field.
    #[error("invalid {field}: {message}")]
    Invalid { field: String, message: String },
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    /// The standalone state file could not be read or written.
    #[error("state file: {0}")]
    StateFile(String),
}

/// One usage record.
#[derive(Debug, Clone, Default)]
pub struct UsageInput {
    pub api_key_id: Option<i64>,
    pub user: String,
    pub account_id: Option<AccountId>,
    pub model: String,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cache_write_tokens: i64,
    pub cache_read_tokens: i64,
    pub cost_usd: f64,
    /// Which price `cost_usd` was charged at; `None`: not said (an older relay).
    pub price_source: Option<poolgate_core::price::PriceSource>,
    pub status: i32,
    pub latency_ms: i32,
    pub at_ms: Option<i64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UsageTotals {
    pub requests: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_usd: f64,
}

/// One client key's usage of one model under one price source (docs/DESIGN.md §6, "Prices").
pub use poolgate_core::keys::ModelPeriodUsage as ModelUsage;

/// The config the engine serves from and the few writes it makes to it.
#[async_trait]
pub trait AccountSource: Send + Sync + 'static {
    /// Every group, account (credentials in clear), active API key and price.
    async fn load_snapshot(&self) -> Result<Snapshot, StoreError>;

    /// One account as stored now, not as the snapshot has it: the token refresh needs the
    /// latest refresh token, which another replica may just have rotated.
    async fn load_account(&self, id: AccountId) -> Result<Account, StoreError>;

    /// Retires, marks `error`, disables or restores an account, with the reason operators see.
    async fn set_status(
        &self,
        id: AccountId,
        status: AccountStatus,
        reason: &str,
    ) -> Result<(), StoreError>;

    /// Writes refreshed OAuth tokens. Refresh tokens are single-use: once this returns, the
    /// old one is gone upstream, so the new one must outlive the process.
    async fn store_tokens(
        &self,
        id: AccountId,
        access_token: &Secret,
        refresh_token: &Secret,
        expires_at_ms: i64,
    ) -> Result<(), StoreError>;

    /// Adds usage records; returns how many were taken.
    async fn insert_usage(&self, records: &[UsageInput]) -> Result<u64, StoreError>;

    /// Totals of one client key's usage in `[from_ms, to_ms)`.
    async fn read_usage(
        &self,
        api_key_id: i64,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<UsageTotals, StoreError>;

    /// One client key's usage in `[from_ms, to_ms)` per model and price source, ascending by
    /// model.
    async fn read_model_usage(
        &self,
        api_key_id: i64,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<ModelUsage>, StoreError>;

    /// The spend (USD) of each key in `api_key_ids` in `[since, to_ms)` for each of `since_ms`,
    /// in that order: what the budget rebuild seeds admission's counters with (docs/DESIGN.md
    /// §4). A key with no usage has zeros. By default one `read_usage` per key and period; a
    /// store that can sum them in one query does.
    async fn spend_since(
        &self,
        api_key_ids: &[i64],
        since_ms: &[i64],
        to_ms: i64,
    ) -> Result<HashMap<i64, Vec<f64>>, StoreError> {
        let mut spend = HashMap::with_capacity(api_key_ids.len());
        for &api_key_id in api_key_ids {
            let mut periods = Vec::with_capacity(since_ms.len());
            for &since in since_ms {
                periods.push(self.read_usage(api_key_id, since, to_ms).await?.cost_usd);
            }
            spend.insert(api_key_id, periods);
        }
        Ok(spend)
    }
}

/// The config the operator's verbs read and write beyond what the engine itself needs: one
/// implementation per source (Postgres, memory), called only by the engine's admin API
/// (`poolgate_operator::engine::EngineAdmin`), which reloads the engine's snapshot after a write.
#[async_trait]
pub trait AdminStore: Send + Sync + 'static {
    /// Every client key the operator lists, ascending by id (Postgres: revoked ones too, with
    /// `active: false`).
    async fn list_api_keys(&self) -> Result<Vec<ApiKeyRecord>, StoreError>;

    /// Changes what `update` gives of client key `api_key_id` (its disable, access, limits); the
    /// record after. An unknown or revoked key is `NotFound`; a change the store cannot make is
    /// `Invalid` naming the field.
    async fn update_api_key(
        &self,
        api_key_id: i64,
        update: &KeyUpdate,
    ) -> Result<ApiKeyRecord, StoreError>;

    /// Puts a sign-in's tokens into the pool (docs/DESIGN.md §5, "Signing accounts in"): into
    /// `sign_in.account_id` when given, else into the account of the same platform and identity,
    /// else into a new account. Signing in another identity than an account's is `Invalid`
    /// (field `account`); a new account's name taken by another is `Conflict`. Nothing changes
    /// on an error.
    async fn sign_in(&self, sign_in: &SignIn) -> Result<SignedIn, StoreError>;

    /// Sets (`Some`, checked by the caller) or removes (`None`) the operator's price of a model
    /// (docs/DESIGN.md §6, "Prices"); the engine reloads after. Removing a price the operator
    /// never set is `NotFound`.
    async fn set_price(&self, model: &str, price: Option<Price>) -> Result<(), StoreError>;
}

/// Why `sign_in` cannot go into `account` (another platform, kind or identity), in words naming
/// both; `None` when it can.
pub fn sign_in_mismatch(account: &Account, sign_in: &SignIn) -> Option<String> {
    if account.platform != sign_in.platform || account.credential_kind != sign_in.kind {
        return Some(format!(
            "account {} is an {} {} account; this sign-in is {} {}",
            account.id,
            account.platform.as_str(),
            account.credential_kind.as_str(),
            sign_in.platform.as_str(),
            sign_in.kind.as_str()
        ));
    }
    let stored = &account.identity;
    if stored.is_known() && stored.upstream_id != sign_in.identity.upstream_id {
        let who = |email: &str, id: &str| {
            if email.is_empty() {
                id.to_owned()
            } else {
                format!("{email} ({id})")
            }
        };
        return Some(format!(
            "account {} is {}; this sign-in is {}: sign that one in without --account",
            account.id,
            who(&stored.email, &stored.upstream_id),
            who(&sign_in.identity.email, &sign_in.identity.upstream_id)
        ));
    }
    loses_refresh_token(account, sign_in)
}

/// `account` with `sign_in`'s tokens and identity. The token endpoint and client id become the
/// ones the sign-in used (the new tokens were issued there; a refresh elsewhere would be
/// refused); an existing account keeps its own settings (an import's apply to new accounts).
pub fn apply_sign_in(account: &mut Account, sign_in: &SignIn) {
    account.credential = sign_in.access_token.clone();
    if account.credential_kind.is_oauth() {
        account.oauth = Some(OAuthState {
            refresh_token: sign_in.refresh_token.clone(),
            expires_at_ms: sign_in.expires_at_ms,
            token_url: if sign_in.token_url.is_empty() {
                poolgate_core::account::default_oauth_token_url(account.platform).to_owned()
            } else {
                sign_in.token_url.clone()
            },
            client_id: sign_in.client_id.clone(),
        });
    }
    account.identity = sign_in.identity.clone();
}

/// Why `sign_in` must not silently replace `account`'s refresh token with none (Claude Code's
/// setup token over a full sign-in of the same user): asked for by `--account`, it may.
pub fn loses_refresh_token(account: &Account, sign_in: &SignIn) -> Option<String> {
    let refreshable = account
        .oauth
        .as_ref()
        .is_some_and(|oauth| !oauth.refresh_token.is_empty());
    (refreshable && sign_in.refresh_token.is_empty() && sign_in.account_id.is_none()).then(|| {
        format!(
            "account {} keeps itself signed in with a refresh token; this sign-in has none \
             (a setup token) and would replace it: name the account (--account {}) to do that",
            account.id, account.id
        )
    })
}
