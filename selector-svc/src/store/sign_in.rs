//! Signing accounts in (`login`, `import`; docs/DESIGN.md §5, "Signing accounts in"): the
//! tokens go into the account named, or the one of the same platform and identity (migration
//! 0010's `upstream_id`), or a new account; one transaction, so a refused sign-in changes
//! nothing and two sign-ins of one identity never make two accounts (the unique index).

use poolgate_core::AccountId;
use poolgate_core::account::{AccountStatus, DEFAULT_GROUP, SignIn, SignedIn, default_base_url};
use poolgate_select::crypto::BlobPlace;
use poolgate_select::source::{StoreError, sign_in_mismatch};

use super::{AccountInput, AccountParams, INSERT_ACCOUNT, PostgresSource, convert};

impl PostgresSource {
    /// [`poolgate_select::source::AdminStore::sign_in`] on Postgres.
    pub async fn sign_in(&self, sign_in: &SignIn) -> Result<SignedIn, StoreError> {
        if let Some((field, message)) = sign_in.problem() {
            return Err(StoreError::Invalid {
                field: field.into(),
                message,
            });
        }
        let group = sign_in.group.as_deref().unwrap_or(DEFAULT_GROUP);
        let mut tx = self.pool.begin().await.map_err(convert)?;
        let target: Option<AccountId> = match sign_in.account_id {
            Some(id) => Some(
                sqlx::query_scalar("SELECT id FROM accounts WHERE id = $1 FOR UPDATE")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(convert)?
                    .ok_or_else(|| StoreError::NotFound(format!("account {id}")))?,
            ),
            None => sqlx::query_scalar(
                "SELECT id FROM accounts WHERE platform = $1 AND upstream_id = $2 FOR UPDATE",
            )
            .bind(sign_in.platform.as_str())
            .bind(&sign_in.identity.upstream_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(convert)?,
        };
        let (id, created, reactivated) = match target {
            Some(id) => {
                let row = sqlx::query(concat!(account_select!(), " WHERE a.id = $1"))
                    .bind(id)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(convert)?;
                let account = self.account_from_row(&row)?;
                if let Some(problem) = sign_in_mismatch(&account, sign_in) {
                    return Err(StoreError::Invalid {
                        field: "account".into(),
                        message: problem,
                    });
                }
                let reactivated = account.status == AccountStatus::Error;
                let (key_id, blob) = self
                    .keyring
                    .encrypt(sign_in.access_token.expose(), BlobPlace::credential(id))?;
                let refresh = if sign_in.refresh_token.is_empty() {
                    None
                } else {
                    Some(
                        self.keyring
                            .encrypt(sign_in.refresh_token.expose(), BlobPlace::refresh_token(id))?
                            .1,
                    )
                };
                sqlx::query(
                    "UPDATE accounts SET credential_ciphertext = $2, credential_key_id = $3, \
                       refresh_token_ciphertext = $4, \
                       expires_at = to_timestamp(NULLIF($5, 0)::double precision / 1000), \
                       token_url = $6, oauth_client_id = $7, \
                       upstream_id = $8, email = NULLIF($9, ''), plan = NULLIF($10, ''), \
                       status = CASE WHEN status = 'error' THEN 'active' ELSE status END, \
                       status_reason = CASE WHEN status = 'error' THEN '' ELSE status_reason END, \
                       status_changed_at = CASE WHEN status = 'error' THEN now() ELSE status_changed_at END, \
                       updated_at = now() \
                     WHERE id = $1",
                )
                .bind(id)
                .bind(blob)
                .bind(key_id)
                .bind(refresh)
                .bind(sign_in.expires_at_ms)
                // Exactly what the sign-in used (NULL: the platform's default): the new tokens
                // are refreshed where they were issued.
                .bind(Some(&sign_in.token_url).filter(|u| !u.is_empty()))
                .bind(Some(&sign_in.client_id).filter(|c| !c.is_empty()))
                .bind(&sign_in.identity.upstream_id)
                .bind(&sign_in.identity.email)
                .bind(&sign_in.identity.plan)
                .execute(&mut *tx)
                .await
                .map_err(|e| identity_taken(convert(e), sign_in))?;
                (id, false, reactivated)
            }
            None => {
                let name = sign_in
                    .name
                    .clone()
                    .unwrap_or_else(|| sign_in.default_name());
                let taken: Option<AccountId> =
                    sqlx::query_scalar("SELECT id FROM accounts WHERE name = $1")
                        .bind(&name)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(convert)?;
                if let Some(other) = taken {
                    return Err(StoreError::Conflict(format!(
                        "the name {name:?} is taken by account {other}; give the new account \
                         another name"
                    )));
                }
                // The group is made with the account, inside the transaction: a refused sign-in
                // leaves none behind.
                let group_id: i64 = sqlx::query_scalar(
                    "INSERT INTO groups (name) VALUES ($1) ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING id",
                )
                .bind(group)
                .fetch_one(&mut *tx)
                .await
                .map_err(convert)?;
                let id: AccountId =
                    sqlx::query_scalar("SELECT nextval(pg_get_serial_sequence('accounts', 'id'))")
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(convert)?;
                let settings = &sign_in.settings;
                let oauth = sign_in
                    .kind
                    .is_oauth()
                    .then(|| poolgate_core::account::OAuthState {
                        refresh_token: sign_in.refresh_token.clone(),
                        expires_at_ms: sign_in.expires_at_ms,
                        token_url: sign_in.token_url.clone(),
                        client_id: sign_in.client_id.clone(),
                    });
                let input = AccountInput {
                    name: name.clone(),
                    group: group.to_owned(),
                    platform: sign_in.platform,
                    base_url: sign_in
                        .base_url
                        .clone()
                        .unwrap_or_else(|| {
                            default_base_url(sign_in.platform, sign_in.kind).to_owned()
                        })
                        .trim_end_matches('/')
                        .to_owned(),
                    credential_kind: sign_in.kind,
                    credential: Some(sign_in.access_token.clone()),
                    oauth,
                    priority: settings.priority.unwrap_or(0),
                    weight: 1,
                    concurrency_limit: settings.concurrency_limit.unwrap_or(0),
                    rpm_limit: settings.rpm_limit.unwrap_or(0),
                    session_window_limit_usd: 0.0,
                    allowed_models: Vec::new(),
                    model_mapping: settings.model_mapping.clone().unwrap_or_default(),
                    proxy_url: settings.proxy_url.clone().filter(|p| !p.is_empty()),
                    probe_model: None,
                    stream_usage: true,
                    serves: Vec::new(),
                };
                let (key_id, blob) = self
                    .keyring
                    .encrypt(sign_in.access_token.expose(), BlobPlace::credential(id))?;
                let refresh = if sign_in.refresh_token.is_empty() {
                    None
                } else {
                    Some(
                        self.keyring
                            .encrypt(sign_in.refresh_token.expose(), BlobPlace::refresh_token(id))?
                            .1,
                    )
                };
                let mapping = serde_json::to_value(&input.model_mapping)
                    .map_err(|e| StoreError::Conflict(format!("model mapping: {e}")))?;
                let params = AccountParams {
                    id,
                    input: &input,
                    group_id,
                    blob: Some(blob),
                    key_id: Some(key_id),
                    refresh,
                    expires_at_ms: Some(sign_in.expires_at_ms)
                        .filter(|ms| *ms > 0)
                        .map(|ms| ms as f64),
                    token_url: Some(sign_in.token_url.clone()).filter(|u| !u.is_empty()),
                    mapping: &mapping,
                    client_id: Some(sign_in.client_id.clone()).filter(|c| !c.is_empty()),
                };
                let inserted: Option<sqlx::postgres::PgRow> = params
                    .bind(sqlx::query(INSERT_ACCOUNT))
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(convert)?;
                if inserted.is_none() {
                    return Err(StoreError::Conflict(format!(
                        "the name {name:?} was taken meanwhile; try again"
                    )));
                }
                sqlx::query(
                    "UPDATE accounts SET upstream_id = $2, email = NULLIF($3, ''), \
                       plan = NULLIF($4, '') WHERE id = $1",
                )
                .bind(id)
                .bind(&sign_in.identity.upstream_id)
                .bind(&sign_in.identity.email)
                .bind(&sign_in.identity.plan)
                .execute(&mut *tx)
                .await
                .map_err(|e| identity_taken(convert(e), sign_in))?;
                (id, true, false)
            }
        };
        tx.commit().await.map_err(convert)?;
        let row = sqlx::query(concat!(account_select!(), " WHERE a.id = $1"))
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .map_err(convert)?;
        Ok(SignedIn {
            account: self.account_from_row(&row)?,
            created,
            reactivated,
        })
    }
}

/// The unique index's refusal, in words: another account already is this identity (signed in
/// under `--account` of a different one, or created concurrently).
fn identity_taken(error: StoreError, sign_in: &SignIn) -> StoreError {
    match error {
        StoreError::Conflict(constraint) if constraint.contains("upstream_id") => {
            StoreError::Conflict(format!(
                "another account is already {} ({}); sign that one in again instead",
                sign_in.identity.upstream_id, sign_in.identity.email
            ))
        }
        other => other,
    }
}
