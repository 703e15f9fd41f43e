//! Client keys in Postgres: creating one (the key shown once, its hash stored), listing,
//! partial updates of its access and limits, revoking, and reading a key's row; the operator's
//! key verbs of the engine's admin API (`AdminStore`) over them.

use sqlx::Row;
use sqlx::postgres::PgRow;

use poolgate_core::account::{ApiKeyRecord, Secret};
use poolgate_core::keys::{KeyAccess, known_endpoints};
use poolgate_core::lease::KeyLimits;
use poolgate_core::money::{micros_to_usd, usd_to_micros};
use poolgate_proto::convert::keys::{KeyUpdate, endpoint_names, parse_key_status};
use poolgate_select::crypto::{api_key_hash, api_key_prefix, new_api_key};
use poolgate_select::source::AdminStore;
pub use poolgate_select::source::StoreError;

use super::*;

impl PostgresSource {
    /// Creates a client API key without limits; returns (id, the key — shown once).
    pub async fn create_api_key(
        &self,
        name: &str,
        user: &str,
        group: &str,
        user_rpm_limit: i32,
    ) -> Result<(i64, Secret), StoreError> {
        self.create_api_key_with_access(name, user, group, user_rpm_limit, &KeyAccess::default())
            .await
    }

    /// Creates a client API key that may reach what `access` allows (its `disabled` is ignored:
    /// a key is born active), without limits; returns (id, the key — shown once).
    pub async fn create_api_key_with_access(
        &self,
        name: &str,
        user: &str,
        group: &str,
        user_rpm_limit: i32,
        access: &KeyAccess,
    ) -> Result<(i64, Secret), StoreError> {
        self.create_api_key_with_limits(
            name,
            user,
            group,
            user_rpm_limit,
            access,
            &KeyLimits::default(),
        )
        .await
    }

    /// Creates a client API key with what it may reach and its own limits (`limits.api_key_id`
    /// is ignored: the new row's id is the key's); returns (id, the key — shown once).
    pub async fn create_api_key_with_limits(
        &self,
        name: &str,
        user: &str,
        group: &str,
        user_rpm_limit: i32,
        access: &KeyAccess,
        limits: &KeyLimits,
    ) -> Result<(i64, Secret), StoreError> {
        let group_id = self.group_id(group).await?;
        let key = new_api_key();
        let id = sqlx::query_scalar(
            "INSERT INTO api_keys (name, key_hash, key_prefix, user_name, group_id, user_rpm_limit, \
             expires_at, allowed_models, allowed_endpoints, concurrency_limit, tpm_limit, \
             budget_total_usd, budget_day_usd, budget_week_usd, budget_month_usd) \
             VALUES ($1, $2, $3, $4, $5, $6, to_timestamp($7::double precision / 1000), $8, $9, \
             $10, $11, $12, $13, $14, $15) \
             RETURNING id",
        )
        .bind(name)
        .bind(api_key_hash(key.expose()))
        .bind(api_key_prefix(key.expose()))
        .bind(user)
        .bind(group_id)
        .bind(user_rpm_limit)
        .bind(access.expires_at_ms.map(|ms| ms as f64))
        .bind(&access.allowed_models)
        .bind(endpoint_names(&access.allowed_endpoints))
        .bind(limits.concurrency_limit.max(0))
        .bind(limits.tpm_limit.max(0))
        .bind(micros_to_usd(limits.budget_total_micros.max(0)))
        .bind(micros_to_usd(limits.budget_day_micros.max(0)))
        .bind(micros_to_usd(limits.budget_week_micros.max(0)))
        .bind(micros_to_usd(limits.budget_month_micros.max(0)))
        .fetch_one(&self.pool)
        .await
        .map_err(convert)?;
        Ok((id, key))
    }

    /// Every client key, revoked ones included (`active: false`), ascending by id.
    pub async fn list_api_keys(&self) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let rows = sqlx::query(concat!(api_key_select!("api_keys"), " ORDER BY k.id"))
            .fetch_all(&self.pool)
            .await
            .map_err(convert)?;
        rows.iter().map(api_key_from_row).collect()
    }

    /// Changes what a key may reach and its limits, only what `update` gives, in one statement;
    /// the key after.
    /// A revoked key is gone: `NotFound`, as an unknown one. The `api_keys` trigger notifies
    /// every selector, which reloads within a second.
    pub async fn update_api_key(
        &self,
        id: i64,
        update: &KeyUpdate,
    ) -> Result<ApiKeyRecord, StoreError> {
        let row = sqlx::query(concat!(
            "WITH updated AS (UPDATE api_keys SET \
             status = CASE WHEN $2::boolean IS NULL THEN status \
                           WHEN $2 THEN 'disabled' ELSE 'active' END, \
             expires_at = CASE WHEN $3 THEN to_timestamp($4::double precision / 1000) \
                               ELSE expires_at END, \
             allowed_models = COALESCE($5::text[], allowed_models), \
             allowed_endpoints = COALESCE($6::text[], allowed_endpoints), \
             concurrency_limit = COALESCE($7::integer, concurrency_limit), \
             tpm_limit = COALESCE($8::bigint, tpm_limit), \
             budget_total_usd = COALESCE($9::double precision, budget_total_usd), \
             budget_day_usd = COALESCE($10::double precision, budget_day_usd), \
             budget_week_usd = COALESCE($11::double precision, budget_week_usd), \
             budget_month_usd = COALESCE($12::double precision, budget_month_usd) \
             WHERE id = $1 AND status <> 'revoked' RETURNING *) ",
            api_key_select!("updated")
        ))
        .bind(id)
        .bind(update.disabled)
        .bind(update.expires_at_ms.is_some())
        .bind(update.expires_at_ms.flatten().map(|ms| ms as f64))
        .bind(update.allowed_models.as_ref())
        .bind(update.allowed_endpoints.as_deref().map(endpoint_names))
        .bind(update.concurrency_limit)
        .bind(update.tpm_limit)
        .bind(update.budget_total_micros.map(micros_to_usd))
        .bind(update.budget_day_micros.map(micros_to_usd))
        .bind(update.budget_week_micros.map(micros_to_usd))
        .bind(update.budget_month_micros.map(micros_to_usd))
        .fetch_optional(&self.pool)
        .await
        .map_err(convert)?
        .ok_or_else(|| StoreError::NotFound(format!("api key {id}")))?;
        api_key_from_row(&row)
    }

    pub async fn revoke_api_key(&self, id: i64) -> Result<(), StoreError> {
        let updated = sqlx::query("UPDATE api_keys SET status = 'revoked' WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(convert)?;
        if updated.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("api key {id}")));
        }
        Ok(())
    }
}

pub(super) fn api_key_from_row(row: &PgRow) -> Result<ApiKeyRecord, StoreError> {
    let id: i64 = row.try_get("id").map_err(convert)?;
    let status: String = row.try_get("status").map_err(convert)?;
    // The schema's check allows no other; a newer schema's status is not guessed at.
    let (active, disabled) = parse_key_status(&status)
        .ok_or_else(|| StoreError::Conflict(format!("api key {id}: status {status}")))?;
    let endpoints: Vec<String> = row.try_get("allowed_endpoints").map_err(convert)?;
    let (allowed_endpoints, only_newer) = known_endpoints(&endpoints);
    let access = KeyAccess {
        expires_at_ms: row.try_get("expires_at_ms").map_err(convert)?,
        // A list of only endpoints a newer release added reaches nothing this release serves;
        // read as no list it would reach everything, so the key is held disabled instead.
        disabled: disabled || only_newer,
        allowed_models: row.try_get("allowed_models").map_err(convert)?,
        allowed_endpoints,
    };
    Ok(ApiKeyRecord {
        id,
        name: row.try_get("name").map_err(convert)?,
        prefix: row.try_get("key_prefix").map_err(convert)?,
        user: row.try_get("user_name").map_err(convert)?,
        group: row.try_get("group_name").map_err(convert)?,
        user_rpm_limit: row.try_get("user_rpm_limit").map_err(convert)?,
        limits: key_limits_from_row(id, row)?,
        active,
        access,
    })
}

/// A key's limits (migration 0007): the budgets are stored in USD and counted in micro-USD. A
/// stored value the schema's checks should have refused is a conflict, never a key without
/// limits.
fn key_limits_from_row(id: i64, row: &PgRow) -> Result<KeyLimits, StoreError> {
    let budget = |column: &str| -> Result<i64, StoreError> {
        let usd: f64 = row.try_get(column).map_err(convert)?;
        usd_to_micros(usd)
            .ok_or_else(|| StoreError::Conflict(format!("api key {id}: {column} {usd}")))
    };
    Ok(KeyLimits {
        api_key_id: id,
        concurrency_limit: row.try_get("concurrency_limit").map_err(convert)?,
        tpm_limit: row.try_get("tpm_limit").map_err(convert)?,
        budget_total_micros: budget("budget_total_usd")?,
        budget_day_micros: budget("budget_day_usd")?,
        budget_week_micros: budget("budget_week_usd")?,
        budget_month_micros: budget("budget_month_usd")?,
    })
}

/// The engine's admin API's key verbs: the methods above, by name.
#[async_trait::async_trait]
impl AdminStore for PostgresSource {
    async fn list_api_keys(&self) -> Result<Vec<ApiKeyRecord>, StoreError> {
        PostgresSource::list_api_keys(self).await
    }

    async fn update_api_key(
        &self,
        api_key_id: i64,
        update: &KeyUpdate,
    ) -> Result<ApiKeyRecord, StoreError> {
        PostgresSource::update_api_key(self, api_key_id, update).await
    }

    async fn sign_in(
        &self,
        sign_in: &poolgate_core::account::SignIn,
    ) -> Result<poolgate_core::account::SignedIn, StoreError> {
        PostgresSource::sign_in(self, sign_in).await
    }

    async fn set_price(
        &self,
        model: &str,
        price: Option<poolgate_core::account::Price>,
    ) -> Result<(), StoreError> {
        match price {
            Some(price) => PostgresSource::set_price(self, model, price).await,
            None => PostgresSource::remove_price(self, model).await,
        }
    }
}
