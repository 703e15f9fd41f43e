//! Account config in Postgres: loading a snapshot (credentials decrypted), and every write the
//! selector makes (admin changes, token refreshes, retirements, usage); the migrations and the
//! schema check at start are `store/schema.rs`'s. Queries are checked at run time, so a clean
//! clone builds without a database.
//!
//! The only module that knows SQL (with its `store/reencrypt.rs` and `store/schema.rs`);
//! `sqlx::Error` never leaves it.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{Row, migrate::Migrator};

use poolgate_core::AccountId;
use poolgate_core::account::{
    Account, AccountIdentity, AccountStatus, CredentialKind, GroupSettings, OAuthState, Platform,
    Price, Secret, Service, default_oauth_token_url,
};
use poolgate_select::crypto::{BlobPlace, Keyring};
use poolgate_select::snapshot::Snapshot;
use poolgate_select::source::AccountSource;
pub use poolgate_select::source::{StoreError, UsageInput, UsageTotals};

mod reencrypt;
mod schema;
pub use reencrypt::{ReencryptOutcome, ReencryptReport, StoredCiphertexts};
pub use schema::SchemaStatus;

/// The account columns every read uses (a macro so `concat!` can extend it).
macro_rules! account_select {
    () => {
        "SELECT a.id, a.name, g.name AS group_name, a.platform, a.base_url, \
    a.credential_kind, a.credential_ciphertext, a.credential_key_id, a.refresh_token_ciphertext, \
    (extract(epoch FROM a.expires_at) * 1000)::bigint AS expires_at_ms, a.token_url, \
    a.oauth_client_id, a.status, \
    a.status_reason, a.priority, a.weight, a.concurrency_limit, a.rpm_limit, \
    a.session_window_limit_usd, a.allowed_models, a.model_mapping, a.proxy_url, \
    a.probe_model, a.stream_usage, a.upstream_id, a.email, a.plan, a.serves \
    FROM accounts a JOIN groups g ON g.id = a.group_id"
    };
}

const ACCOUNT_SELECT: &str = account_select!();

/// A new account's row, `AccountParams` bound; nothing when the name is taken.
const INSERT_ACCOUNT: &str = "INSERT INTO accounts (id, name, group_id, platform, base_url, credential_kind, \
       credential_ciphertext, credential_key_id, refresh_token_ciphertext, expires_at, token_url, \
       priority, weight, concurrency_limit, rpm_limit, session_window_limit_usd, allowed_models, \
       model_mapping, proxy_url, probe_model, stream_usage, oauth_client_id, serves) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, to_timestamp($10::double precision / 1000), $11, \
       $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23) \
     ON CONFLICT (name) DO NOTHING RETURNING id";

/// The client key columns every read uses: the record, its status, what it may reach (migration
/// 0006) and its limits (migration 0007), with its group's name.
macro_rules! api_key_select {
    ($from:literal) => {
        concat!(
            "SELECT k.id, k.name, k.key_hash, k.key_prefix, k.user_name, g.name AS group_name, \
             k.user_rpm_limit, k.status, \
             (extract(epoch FROM k.expires_at) * 1000)::bigint AS expires_at_ms, \
             k.allowed_models, k.allowed_endpoints, k.concurrency_limit, k.tpm_limit, \
             k.budget_total_usd, k.budget_day_usd, k.budget_week_usd, k.budget_month_usd FROM ",
            $from,
            " k JOIN groups g ON g.id = k.group_id"
        )
    };
}

mod api_keys;
mod sign_in;
mod usage;

use api_keys::api_key_from_row;

/// The migrations in `migrations/`, embedded at build time.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

fn convert(error: sqlx::Error) -> StoreError {
    match &error {
        sqlx::Error::RowNotFound => StoreError::NotFound("row".into()),
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            StoreError::Conflict(db.constraint().unwrap_or("unique").to_owned())
        }
        sqlx::Error::Database(db) if db.is_check_violation() => {
            StoreError::Conflict(format!("check {}", db.constraint().unwrap_or("constraint")))
        }
        // Connection strings (with passwords) are not part of sqlx's error messages.
        _ => StoreError::Unavailable(error.to_string()),
    }
}

/// The latest schema version this build knows.
pub fn known_schema_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Fields of an account upsert (credential in clear; encrypted here).
#[derive(Debug, Clone)]
pub struct AccountInput {
    pub name: String,
    pub group: String,
    pub platform: Platform,
    pub base_url: String,
    pub credential_kind: CredentialKind,
    /// `None` on update: keep the stored credential.
    pub credential: Option<Secret>,
    pub oauth: Option<OAuthState>,
    pub priority: i32,
    pub weight: i32,
    pub concurrency_limit: i32,
    pub rpm_limit: i32,
    pub session_window_limit_usd: f64,
    pub allowed_models: Vec<String>,
    pub model_mapping: HashMap<String, String>,
    pub proxy_url: Option<String>,
    pub probe_model: Option<String>,
    pub stream_usage: bool,
    /// Empty: all the platform and kind can.
    pub serves: Vec<Service>,
}

#[derive(Clone)]
pub struct PostgresSource {
    pool: PgPool,
    keyring: Arc<Keyring>,
}

impl PostgresSource {
    pub async fn connect(url: &str, keyring: Arc<Keyring>) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(convert)?;
        Ok(PostgresSource { pool, keyring })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn keyring(&self) -> &Keyring {
        &self.keyring
    }

    /// Loads every group, account (credentials decrypted), client key that is not revoked
    /// (disabled ones too, so their holders hear why they are refused) and price.
    pub async fn load_snapshot(&self) -> Result<Snapshot, StoreError> {
        let group_rows = sqlx::query(
            "SELECT name, usage_headers_to_clients, window_shed_at, window_move_at, subscriptions_cli_only, rerank_passthrough FROM groups",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(convert)?;
        let mut groups = Vec::with_capacity(group_rows.len());
        let mut settings = HashMap::new();
        for row in group_rows {
            let name: String = row.try_get("name").map_err(convert)?;
            let set = GroupSettings {
                usage_headers_to_clients: row
                    .try_get("usage_headers_to_clients")
                    .map_err(convert)?,
                window_shed_at: row.try_get("window_shed_at").map_err(convert)?,
                window_move_at: row.try_get("window_move_at").map_err(convert)?,
                subscriptions_cli_only: row.try_get("subscriptions_cli_only").map_err(convert)?,
                rerank_passthrough: row.try_get("rerank_passthrough").map_err(convert)?,
            };
            if set != GroupSettings::default() {
                settings.insert(name.clone(), set);
            }
            groups.push(name);
        }
        let rows = sqlx::query(ACCOUNT_SELECT)
            .fetch_all(&self.pool)
            .await
            .map_err(convert)?;
        let mut accounts = Vec::with_capacity(rows.len());
        for row in rows {
            match self.account_from_row(&row) {
                Ok(account) => accounts.push(account),
                // A credential that does not decrypt, or a platform, sign-in or status a newer
                // release wrote (DESIGN §8): the account is left out, the rest served.
                Err(error) => {
                    let id: i64 = row.try_get("id").unwrap_or_default();
                    tracing::error!(account_id = id, %error, "account skipped: unreadable by this release");
                }
            }
        }
        let key_rows = sqlx::query(concat!(
            api_key_select!("api_keys"),
            " WHERE k.status <> 'revoked'"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(convert)?;
        let mut api_keys = HashMap::new();
        for row in key_rows {
            let hash: Vec<u8> = row.try_get("key_hash").map_err(convert)?;
            match api_key_from_row(&row) {
                Ok(record) => {
                    api_keys.insert(hash, record);
                }
                // A status a newer release wrote (DESIGN §8): the key is left out, so it is
                // refused as unknown until this selector is upgraded; the others are served.
                Err(error) => {
                    let id: i64 = row.try_get("id").unwrap_or_default();
                    tracing::error!(api_key_id = id, %error, "client key skipped: unreadable by this release");
                }
            }
        }
        let price_rows = sqlx::query(
            "SELECT model, input_per_mtok, output_per_mtok, cache_write_per_mtok, cache_read_per_mtok, per_search_unit FROM model_prices",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(convert)?;
        let mut prices = HashMap::new();
        for row in price_rows {
            prices.insert(
                row.try_get::<String, _>("model").map_err(convert)?,
                Price {
                    input_per_mtok: row.try_get("input_per_mtok").map_err(convert)?,
                    output_per_mtok: row.try_get("output_per_mtok").map_err(convert)?,
                    cache_write_per_mtok: row.try_get("cache_write_per_mtok").map_err(convert)?,
                    cache_read_per_mtok: row.try_get("cache_read_per_mtok").map_err(convert)?,
                    per_search_unit: row.try_get("per_search_unit").map_err(convert)?,
                },
            );
        }
        Ok(Snapshot::new(groups, accounts, api_keys, prices).with_group_settings(settings))
    }

    /// An account as stored. A blob that does not decrypt for this row and field (wrong key, or
    /// moved here from another row or column) fails the whole account: the snapshot load skips
    /// it with an error log, `load_account` returns the error; it never yields a credential.
    pub(crate) fn account_from_row(&self, row: &PgRow) -> Result<Account, StoreError> {
        let id: AccountId = row.try_get("id").map_err(convert)?;
        let key_id: String = row.try_get("credential_key_id").map_err(convert)?;
        let blob: Vec<u8> = row.try_get("credential_ciphertext").map_err(convert)?;
        let credential = self
            .keyring
            .decrypt(&key_id, &blob, BlobPlace::credential(id))?;
        let kind_text: String = row.try_get("credential_kind").map_err(convert)?;
        let credential_kind = CredentialKind::parse(&kind_text)
            .ok_or_else(|| StoreError::Conflict(format!("credential kind {kind_text}")))?;
        let platform_text: String = row.try_get("platform").map_err(convert)?;
        let platform = Platform::parse(&platform_text)
            .ok_or_else(|| StoreError::Conflict(format!("platform {platform_text}")))?;
        let oauth = match credential_kind {
            CredentialKind::ApiKey => None,
            CredentialKind::OAuth | CredentialKind::ChatGptOAuth => {
                let refresh: Option<Vec<u8>> =
                    row.try_get("refresh_token_ciphertext").map_err(convert)?;
                let refresh_token = match refresh {
                    Some(blob) => {
                        self.keyring
                            .decrypt(&key_id, &blob, BlobPlace::refresh_token(id))?
                    }
                    None => Secret::default(),
                };
                Some(OAuthState {
                    refresh_token,
                    expires_at_ms: row
                        .try_get::<Option<i64>, _>("expires_at_ms")
                        .map_err(convert)?
                        .unwrap_or(0),
                    // NULL or empty: the platform's default, applied here so a changed
                    // default reaches every account that never named an endpoint.
                    token_url: row
                        .try_get::<Option<String>, _>("token_url")
                        .map_err(convert)?
                        .filter(|url| !url.is_empty())
                        .unwrap_or_else(|| default_oauth_token_url(platform).to_owned()),
                    client_id: row
                        .try_get::<Option<String>, _>("oauth_client_id")
                        .map_err(convert)?
                        .unwrap_or_default(),
                })
            }
        };
        let status_text: String = row.try_get("status").map_err(convert)?;
        let mapping: serde_json::Value = row.try_get("model_mapping").map_err(convert)?;
        let model_mapping = mapping
            .as_object()
            .map(|object| {
                object
                    .iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        let serves: Option<Vec<String>> = row.try_get("serves").map_err(convert)?;
        let serves = serves
            .unwrap_or_default()
            .iter()
            .map(|name| {
                Service::parse(name).ok_or_else(|| StoreError::Conflict(format!("serves {name}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Account {
            serves,
            id,
            name: row.try_get("name").map_err(convert)?,
            group: row.try_get("group_name").map_err(convert)?,
            platform,
            base_url: row.try_get("base_url").map_err(convert)?,
            credential_kind,
            credential,
            oauth,
            status: AccountStatus::parse(&status_text)
                .ok_or_else(|| StoreError::Conflict(format!("status {status_text}")))?,
            status_reason: row.try_get("status_reason").map_err(convert)?,
            priority: row.try_get("priority").map_err(convert)?,
            weight: row.try_get("weight").map_err(convert)?,
            concurrency_limit: row.try_get("concurrency_limit").map_err(convert)?,
            rpm_limit: row.try_get("rpm_limit").map_err(convert)?,
            session_window_limit_usd: row.try_get("session_window_limit_usd").map_err(convert)?,
            allowed_models: row.try_get("allowed_models").map_err(convert)?,
            model_mapping,
            proxy_url: row.try_get("proxy_url").map_err(convert)?,
            probe_model: row.try_get("probe_model").map_err(convert)?,
            stream_usage: row.try_get("stream_usage").map_err(convert)?,
            identity: AccountIdentity {
                upstream_id: row
                    .try_get::<Option<String>, _>("upstream_id")
                    .map_err(convert)?
                    .unwrap_or_default(),
                email: row
                    .try_get::<Option<String>, _>("email")
                    .map_err(convert)?
                    .unwrap_or_default(),
                plan: row
                    .try_get::<Option<String>, _>("plan")
                    .map_err(convert)?
                    .unwrap_or_default(),
            },
        })
    }

    /// Whether the group exists (made by an account, or by the operator), without making it.
    pub async fn group_exists(&self, name: &str) -> Result<bool, StoreError> {
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM groups WHERE name = $1)")
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .map_err(convert)
    }

    async fn group_id(&self, name: &str) -> Result<i64, StoreError> {
        sqlx::query_scalar(
            "INSERT INTO groups (name) VALUES ($1) ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING id",
        )
        .bind(name)
        .fetch_one(&self.pool)
        .await
        .map_err(convert)
    }

    /// Creates or updates an account by name; returns its id. An update without a credential
    /// keeps the stored one (and its refresh token).
    pub async fn upsert_account(&self, input: &AccountInput) -> Result<AccountId, StoreError> {
        let group_id = self.group_id(&input.group).await?;
        let mapping = serde_json::to_value(&input.model_mapping)
            .map_err(|e| StoreError::Conflict(format!("model mapping: {e}")))?;
        // A second attempt only when another writer inserted the same name between our lookup
        // and our insert: it finds that row and updates it, as `ON CONFLICT` would have.
        for _ in 0..2 {
            if let Some(id) = self.try_upsert_account(input, group_id, &mapping).await? {
                return Ok(id);
            }
        }
        Err(StoreError::Conflict(format!(
            "account {:?} was created concurrently; try again",
            input.name
        )))
    }

    /// One upsert in one transaction; `None` when a concurrent insert of the same name won.
    ///
    /// The blobs are bound to the row's id, so the id must be known before they are sealed: an
    /// existing row is locked and updated under its own id, a new row's id is taken from the
    /// sequence first and inserted explicitly.
    async fn try_upsert_account(
        &self,
        input: &AccountInput,
        group_id: i64,
        mapping: &serde_json::Value,
    ) -> Result<Option<AccountId>, StoreError> {
        let expires_at_ms = input
            .oauth
            .as_ref()
            .map(|o| o.expires_at_ms)
            .filter(|ms| *ms > 0)
            .map(|ms| ms as f64);
        // Empty: NULL (an update keeps the stored one); reads give NULL the platform's default.
        let token_url = input
            .oauth
            .as_ref()
            .map(|o| o.token_url.clone())
            .filter(|u| !u.is_empty());
        let client_id = input
            .oauth
            .as_ref()
            .map(|o| o.client_id.clone())
            .filter(|c| !c.is_empty());
        let new_refresh_token = input
            .oauth
            .as_ref()
            .map(|o| &o.refresh_token)
            .filter(|token| !token.is_empty());
        let mut tx = self.pool.begin().await.map_err(convert)?;
        let existing = sqlx::query(
            "SELECT id, credential_key_id, refresh_token_ciphertext FROM accounts WHERE name = $1 FOR UPDATE",
        )
        .bind(&input.name)
        .fetch_optional(&mut *tx)
        .await
        .map_err(convert)?;
        let Some(existing) = existing else {
            let Some(credential) = &input.credential else {
                return Err(StoreError::NotFound(format!(
                    "account {:?} does not exist; a new account needs a credential",
                    input.name
                )));
            };
            let id: AccountId =
                sqlx::query_scalar("SELECT nextval(pg_get_serial_sequence('accounts', 'id'))")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(convert)?;
            let (key_id, blob) = self
                .keyring
                .encrypt(credential.expose(), BlobPlace::credential(id))?;
            let refresh = match new_refresh_token {
                Some(token) => Some(
                    self.keyring
                        .encrypt(token.expose(), BlobPlace::refresh_token(id))?
                        .1,
                ),
                None => None,
            };
            let params = AccountParams {
                id,
                input,
                group_id,
                blob: Some(blob),
                key_id: Some(key_id),
                refresh,
                expires_at_ms,
                token_url,
                mapping,
                client_id,
            };
            let inserted = params
                .bind(sqlx::query(INSERT_ACCOUNT))
                .fetch_optional(&mut *tx)
                .await
                .map_err(convert)?;
            if inserted.is_none() {
                // Rolled back on drop; the sequence value is simply not used.
                return Ok(None);
            }
            tx.commit().await.map_err(convert)?;
            return Ok(Some(id));
        };
        let id: AccountId = existing.try_get("id").map_err(convert)?;
        let (key_id, blob, refresh) = match &input.credential {
            None => (None, None, None),
            Some(credential) => {
                let (key_id, blob) = self
                    .keyring
                    .encrypt(credential.expose(), BlobPlace::credential(id))?;
                // One key id covers both blobs: a kept refresh token is sealed again under the
                // key the new credential uses, or it would no longer decrypt after a rotation.
                let refresh_token = match new_refresh_token {
                    Some(token) => Some(token.clone()),
                    None => {
                        let stored_key_id: String =
                            existing.try_get("credential_key_id").map_err(convert)?;
                        let stored: Option<Vec<u8>> = existing
                            .try_get("refresh_token_ciphertext")
                            .map_err(convert)?;
                        match stored {
                            Some(stored) => Some(self.keyring.decrypt(
                                &stored_key_id,
                                &stored,
                                BlobPlace::refresh_token(id),
                            )?),
                            None => None,
                        }
                    }
                };
                let refresh = match refresh_token {
                    Some(token) => Some(
                        self.keyring
                            .encrypt(token.expose(), BlobPlace::refresh_token(id))?
                            .1,
                    ),
                    None => None,
                };
                (Some(key_id), Some(blob), refresh)
            }
        };
        let params = AccountParams {
            id,
            input,
            group_id,
            blob,
            key_id,
            refresh,
            expires_at_ms,
            token_url,
            mapping,
            client_id,
        };
        // The same parameters as the INSERT: `NULL` credential columns and OAuth fields keep
        // the stored ones.
        params
            .bind(sqlx::query(
                "UPDATE accounts SET name = $2, group_id = $3, platform = $4, base_url = $5, \
                   credential_kind = $6, \
                   credential_ciphertext = COALESCE($7, credential_ciphertext), \
                   credential_key_id = COALESCE($8, credential_key_id), \
                   refresh_token_ciphertext = COALESCE($9, refresh_token_ciphertext), \
                   expires_at = COALESCE(to_timestamp($10::double precision / 1000), expires_at), \
                   token_url = COALESCE($11, token_url), \
                   priority = $12, weight = $13, concurrency_limit = $14, rpm_limit = $15, \
                   session_window_limit_usd = $16, allowed_models = $17, model_mapping = $18, \
                   proxy_url = $19, probe_model = $20, stream_usage = $21, \
                   oauth_client_id = COALESCE($22, oauth_client_id), serves = $23, \
                   updated_at = now() \
                 WHERE id = $1",
            ))
            .execute(&mut *tx)
            .await
            .map_err(convert)?;
        tx.commit().await.map_err(convert)?;
        Ok(Some(id))
    }

    pub async fn set_status(
        &self,
        id: AccountId,
        status: AccountStatus,
        reason: &str,
    ) -> Result<(), StoreError> {
        let updated = sqlx::query(
            "UPDATE accounts SET status = $2, status_reason = $3, status_changed_at = now(), updated_at = now() WHERE id = $1",
        )
        .bind(id)
        .bind(status.as_str())
        .bind(reason)
        .execute(&self.pool)
        .await
        .map_err(convert)?;
        if updated.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("account {id}")));
        }
        Ok(())
    }

    /// Writes refreshed OAuth tokens (encrypted under the active key, bound to the row).
    pub async fn store_tokens(
        &self,
        id: AccountId,
        access_token: &Secret,
        refresh_token: &Secret,
        expires_at_ms: i64,
    ) -> Result<(), StoreError> {
        let (key_id, access) = self
            .keyring
            .encrypt(access_token.expose(), BlobPlace::credential(id))?;
        let (_, refresh) = self
            .keyring
            .encrypt(refresh_token.expose(), BlobPlace::refresh_token(id))?;
        sqlx::query(
            "UPDATE accounts SET credential_ciphertext = $2, credential_key_id = $3, refresh_token_ciphertext = $4, \
             expires_at = to_timestamp($5::double precision / 1000), updated_at = now() WHERE id = $1",
        )
        .bind(id)
        .bind(access)
        .bind(key_id)
        .bind(refresh)
        .bind(expires_at_ms as f64)
        .execute(&self.pool)
        .await
        .map_err(convert)?;
        Ok(())
    }

    /// Reads one account straight from Postgres (not the snapshot): the token refresh needs the
    /// latest refresh token, which another replica may just have rotated.
    pub async fn load_account(&self, id: AccountId) -> Result<Account, StoreError> {
        let row = sqlx::query(concat!(account_select!(), " WHERE a.id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(convert)?
            .ok_or_else(|| StoreError::NotFound(format!("account {id}")))?;
        self.account_from_row(&row)
    }
}

/// The engine's view of the store: the methods above, by name.
#[async_trait::async_trait]
impl AccountSource for PostgresSource {
    async fn load_snapshot(&self) -> Result<Snapshot, StoreError> {
        PostgresSource::load_snapshot(self).await
    }

    async fn load_account(&self, id: AccountId) -> Result<Account, StoreError> {
        PostgresSource::load_account(self, id).await
    }

    async fn set_status(
        &self,
        id: AccountId,
        status: AccountStatus,
        reason: &str,
    ) -> Result<(), StoreError> {
        PostgresSource::set_status(self, id, status, reason).await
    }

    async fn store_tokens(
        &self,
        id: AccountId,
        access_token: &Secret,
        refresh_token: &Secret,
        expires_at_ms: i64,
    ) -> Result<(), StoreError> {
        PostgresSource::store_tokens(self, id, access_token, refresh_token, expires_at_ms).await
    }

    async fn insert_usage(&self, records: &[UsageInput]) -> Result<u64, StoreError> {
        PostgresSource::insert_usage(self, records).await
    }

    async fn read_usage(
        &self,
        api_key_id: i64,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<UsageTotals, StoreError> {
        PostgresSource::read_usage(self, api_key_id, from_ms, to_ms).await
    }

    async fn read_model_usage(
        &self,
        api_key_id: i64,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<poolgate_select::source::ModelUsage>, StoreError> {
        PostgresSource::read_model_usage(self, api_key_id, from_ms, to_ms).await
    }

    async fn spend_since(
        &self,
        api_key_ids: &[i64],
        since_ms: &[i64],
        to_ms: i64,
    ) -> Result<HashMap<i64, Vec<f64>>, StoreError> {
        PostgresSource::spend_since(self, api_key_ids, since_ms, to_ms).await
    }
}

/// An account's row as both statements of `upsert_account` bind it, `$1`..`$22` in this order
/// (the UPDATE keeps the stored value where a credential column or an OAuth field is `NULL`).
pub(crate) struct AccountParams<'a> {
    id: AccountId,
    input: &'a AccountInput,
    group_id: i64,
    blob: Option<Vec<u8>>,
    key_id: Option<String>,
    refresh: Option<Vec<u8>>,
    expires_at_ms: Option<f64>,
    token_url: Option<String>,
    mapping: &'a serde_json::Value,
    client_id: Option<String>,
}

impl<'a> AccountParams<'a> {
    fn bind(
        self,
        query: sqlx::query::Query<'a, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'a, sqlx::Postgres, sqlx::postgres::PgArguments> {
        let input = self.input;
        query
            .bind(self.id)
            .bind(&input.name)
            .bind(self.group_id)
            .bind(input.platform.as_str())
            .bind(&input.base_url)
            .bind(input.credential_kind.as_str())
            .bind(self.blob)
            .bind(self.key_id)
            .bind(self.refresh)
            .bind(self.expires_at_ms)
            .bind(self.token_url)
            .bind(input.priority)
            .bind(input.weight.max(1))
            .bind(input.concurrency_limit)
            .bind(input.rpm_limit)
            .bind(input.session_window_limit_usd)
            .bind(&input.allowed_models)
            .bind(self.mapping)
            .bind(&input.proxy_url)
            .bind(&input.probe_model)
            .bind(input.stream_usage)
            .bind(self.client_id)
            .bind(
                input
                    .serves
                    .iter()
                    .map(|s| s.as_str().to_owned())
                    .collect::<Vec<_>>(),
            )
    }
}
