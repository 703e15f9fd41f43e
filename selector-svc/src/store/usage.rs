//! The usage ledger and prices in Postgres: a model's price, usage batches in, a key's usage
//! read back, and the spend sums the budget rebuild seeds admission with.

use std::collections::HashMap;

use sqlx::Row;

use poolgate_core::account::Price;
use poolgate_core::price::PriceSource;
pub use poolgate_select::source::{ModelUsage, StoreError, UsageInput, UsageTotals};

use super::*;

impl PostgresSource {
    pub async fn set_price(&self, model: &str, price: Price) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO model_prices (model, input_per_mtok, output_per_mtok, cache_write_per_mtok, cache_read_per_mtok, per_search_unit) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (model) DO UPDATE SET input_per_mtok = $2, \
             output_per_mtok = $3, cache_write_per_mtok = $4, cache_read_per_mtok = $5, \
             per_search_unit = $6",
        )
        .bind(model)
        .bind(price.input_per_mtok)
        .bind(price.output_per_mtok)
        .bind(price.cache_write_per_mtok)
        .bind(price.cache_read_per_mtok)
        .bind(price.per_search_unit)
        .execute(&self.pool)
        .await
        .map_err(convert)?;
        Ok(())
    }

    /// Removes the operator's price of a model (the catalogue's applies again); `NotFound` when
    /// there is none.
    pub async fn remove_price(&self, model: &str) -> Result<(), StoreError> {
        let done = sqlx::query("DELETE FROM model_prices WHERE model = $1")
            .bind(model)
            .execute(&self.pool)
            .await
            .map_err(convert)?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!(
                "no operator price for {model}"
            )));
        }
        Ok(())
    }

    /// One key's usage in `[from_ms, to_ms)` per model and price source, ascending by model (a
    /// source the ledger holds that this build does not know reads as not said). A range from the
    /// beginning of time (`from_ms <= 0`, the `total` period) includes what retention folded
    /// ([`fold_usage`](Self::fold_usage)).
    pub async fn read_model_usage(
        &self,
        api_key_id: i64,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<ModelUsage>, StoreError> {
        let rows = sqlx::query(
            "SELECT model, price_source, sum(requests)::bigint AS requests, \
             COALESCE(sum(input_tokens), 0)::bigint AS input_tokens, \
             COALESCE(sum(output_tokens), 0)::bigint AS output_tokens, \
             COALESCE(sum(cost_usd), 0) AS cost_usd FROM ( \
               SELECT model, price_source, 1 AS requests, input_tokens, output_tokens, cost_usd \
               FROM usage_records WHERE api_key_id = $1 \
               AND at >= to_timestamp($2::double precision / 1000) AND at < to_timestamp($3::double precision / 1000) \
               UNION ALL \
               SELECT model, NULLIF(price_source, ''), requests, input_tokens, output_tokens, cost_usd \
               FROM usage_rollups WHERE api_key_id = $1 AND $4 \
             ) u GROUP BY model, price_source ORDER BY model, price_source NULLS FIRST",
        )
        .bind(api_key_id)
        .bind(from_ms as f64)
        .bind(to_ms as f64)
        .bind(from_ms <= 0)
        .fetch_all(&self.pool)
        .await
        .map_err(convert)?;
        rows.into_iter()
            .map(|row| {
                let source: Option<String> = row.try_get("price_source").map_err(convert)?;
                Ok(ModelUsage {
                    model: row.try_get("model").map_err(convert)?,
                    price_source: source.as_deref().and_then(PriceSource::parse),
                    usage: poolgate_core::keys::PeriodUsage {
                        requests: row.try_get("requests").map_err(convert)?,
                        input_tokens: row.try_get("input_tokens").map_err(convert)?,
                        output_tokens: row.try_get("output_tokens").map_err(convert)?,
                        cost_usd: row.try_get("cost_usd").map_err(convert)?,
                    },
                })
            })
            .collect()
    }

    /// Inserts a batch of usage records in one statement.
    pub async fn insert_usage(&self, records: &[UsageInput]) -> Result<u64, StoreError> {
        if records.is_empty() {
            return Ok(0);
        }
        let mut builder = sqlx::QueryBuilder::new(
            "INSERT INTO usage_records (at, api_key_id, user_name, account_id, model, input_tokens, \
             output_tokens, cache_write_tokens, cache_read_tokens, cost_usd, status, latency_ms, price_source) ",
        );
        builder.push_values(records, |mut row, record| {
            row.push("COALESCE(to_timestamp(")
                .push_bind_unseparated(record.at_ms.map(|ms| ms as f64 / 1000.0))
                .push_unseparated("), now())")
                .push_bind(record.api_key_id)
                .push_bind(&record.user)
                .push_bind(record.account_id)
                .push_bind(&record.model)
                .push_bind(record.input_tokens)
                .push_bind(record.output_tokens)
                .push_bind(record.cache_write_tokens)
                .push_bind(record.cache_read_tokens)
                .push_bind(record.cost_usd)
                .push_bind(record.status)
                .push_bind(record.latency_ms)
                .push_bind(record.price_source.map(|source| source.as_str()));
        });
        let done = builder.build().execute(&self.pool).await.map_err(convert)?;
        Ok(done.rows_affected())
    }

    pub async fn read_usage(
        &self,
        api_key_id: i64,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<UsageTotals, StoreError> {
        let row = sqlx::query(
            "SELECT COALESCE(sum(requests), 0)::bigint AS requests, \
             COALESCE(sum(input_tokens), 0)::bigint AS input_tokens, \
             COALESCE(sum(output_tokens), 0)::bigint AS output_tokens, \
             COALESCE(sum(cost_usd), 0) AS cost_usd FROM ( \
               SELECT 1 AS requests, input_tokens, output_tokens, cost_usd \
               FROM usage_records WHERE api_key_id = $1 \
               AND at >= to_timestamp($2::double precision / 1000) AND at < to_timestamp($3::double precision / 1000) \
               UNION ALL \
               SELECT requests, input_tokens, output_tokens, cost_usd \
               FROM usage_rollups WHERE api_key_id = $1 AND $4 \
             ) u",
        )
        .bind(api_key_id)
        .bind(from_ms as f64)
        .bind(to_ms as f64)
        .bind(from_ms <= 0)
        .fetch_one(&self.pool)
        .await
        .map_err(convert)?;
        Ok(UsageTotals {
            requests: row.try_get("requests").map_err(convert)?,
            input_tokens: row.try_get("input_tokens").map_err(convert)?,
            output_tokens: row.try_get("output_tokens").map_err(convert)?,
            cost_usd: row.try_get("cost_usd").map_err(convert)?,
        })
    }

    /// The spend (USD) of each key in `api_key_ids` in `[since, to_ms)` for each of `since_ms`
    /// (in that order), summed in one query over the `(api_key_id, at)` index: the usage
    /// ledger's side of the budget rebuild (docs/DESIGN.md §4). A key without usage has zeros.
    pub async fn spend_since(
        &self,
        api_key_ids: &[i64],
        since_ms: &[i64],
        to_ms: i64,
    ) -> Result<HashMap<i64, Vec<f64>>, StoreError> {
        let mut spend: HashMap<i64, Vec<f64>> = api_key_ids
            .iter()
            .map(|&id| (id, vec![0.0; since_ms.len()]))
            .collect();
        if api_key_ids.is_empty() || since_ms.is_empty() {
            return Ok(spend);
        }
        let since: Vec<f64> = since_ms.iter().map(|&ms| ms as f64).collect();
        let rows = sqlx::query(
            "SELECT k.id AS api_key_id, s.n, COALESCE(sum(u.cost_usd), 0) AS cost_usd \
             FROM unnest($1::bigint[]) AS k(id) \
             CROSS JOIN unnest($2::double precision[]) WITH ORDINALITY AS s(since, n) \
             JOIN usage_records u ON u.api_key_id = k.id \
                 AND u.at >= to_timestamp(s.since / 1000) \
                 AND u.at < to_timestamp($3::double precision / 1000) \
             GROUP BY k.id, s.n",
        )
        .bind(api_key_ids)
        .bind(&since)
        .bind(to_ms as f64)
        .fetch_all(&self.pool)
        .await
        .map_err(convert)?;
        for row in rows {
            let id: i64 = row.try_get("api_key_id").map_err(convert)?;
            let n: i64 = row.try_get("n").map_err(convert)?;
            let cost: f64 = row.try_get("cost_usd").map_err(convert)?;
            let slot = usize::try_from(n - 1)
                .ok()
                .and_then(|index| spend.get_mut(&id)?.get_mut(index));
            if let Some(slot) = slot {
                *slot = cost;
            }
        }
        // A period from the beginning of time (the total) includes what retention folded.
        let from_start: Vec<usize> = since_ms
            .iter()
            .enumerate()
            .filter(|(_, since)| **since <= 0)
            .map(|(index, _)| index)
            .collect();
        if !from_start.is_empty() {
            let rows = sqlx::query(
                "SELECT api_key_id, sum(cost_usd) AS cost_usd FROM usage_rollups \
                 WHERE api_key_id = ANY($1::bigint[]) GROUP BY api_key_id",
            )
            .bind(api_key_ids)
            .fetch_all(&self.pool)
            .await
            .map_err(convert)?;
            for row in rows {
                let id: i64 = row.try_get("api_key_id").map_err(convert)?;
                let cost: f64 = row.try_get("cost_usd").map_err(convert)?;
                if let Some(slots) = spend.get_mut(&id) {
                    for index in &from_start {
                        if let Some(slot) = slots.get_mut(*index) {
                            *slot += cost;
                        }
                    }
                }
            }
        }
        Ok(spend)
    }

    /// Folds up to `batch` usage records older than `before_ms` into their keys' all-time totals
    /// (`usage_rollups`, per model and price source) and deletes them, in one statement: a record
    /// is either still in the ledger or in a total, never both and never neither, whichever
    /// selector folds it (`SKIP LOCKED`: two replicas take different rows). Returns how many
    /// records it folded; the retention task calls it until a batch comes back short.
    pub async fn fold_usage(&self, before_ms: i64, batch: i64) -> Result<u64, StoreError> {
        let row = sqlx::query(
            "WITH moved AS ( \
               DELETE FROM usage_records WHERE id IN ( \
                 SELECT id FROM usage_records WHERE at < to_timestamp($1::double precision / 1000) \
                 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) \
               RETURNING api_key_id, at, model, price_source, input_tokens, output_tokens, cost_usd \
             ), folded AS ( \
               INSERT INTO usage_rollups AS r (api_key_id, model, price_source, requests, \
                 input_tokens, output_tokens, cost_usd, folded_through) \
               SELECT COALESCE(api_key_id, 0), model, COALESCE(price_source, ''), count(*), \
                 sum(input_tokens), sum(output_tokens), sum(cost_usd), max(at) \
               FROM moved GROUP BY 1, 2, 3 \
               ON CONFLICT (api_key_id, model, price_source) DO UPDATE SET \
                 requests = r.requests + EXCLUDED.requests, \
                 input_tokens = r.input_tokens + EXCLUDED.input_tokens, \
                 output_tokens = r.output_tokens + EXCLUDED.output_tokens, \
                 cost_usd = r.cost_usd + EXCLUDED.cost_usd, \
                 folded_through = GREATEST(r.folded_through, EXCLUDED.folded_through) \
               RETURNING 1 \
             ) SELECT (SELECT count(*) FROM moved) AS moved, (SELECT count(*) FROM folded) AS rows",
        )
        .bind(before_ms as f64)
        .bind(batch.max(1))
        .fetch_one(&self.pool)
        .await
        .map_err(convert)?;
        let moved: i64 = row.try_get("moved").map_err(convert)?;
        Ok(u64::try_from(moved).unwrap_or(0))
    }
}
