//! The admin API over the selection engine in process, written once ([`EngineAdmin`]): the
//! standalone relay's admin endpoint and status page serve it as their [`AdminEndpoint`], and the
//! selector's admin gRPC service decodes a request, calls its domain methods and encodes the
//! answer, as its status page serves it too. The engine's errors become [`OperatorError`]s in one
//! function ([`operator_error`]); the gRPC service maps them to its status codes with its own one.
//!
//! Two levels: the domain methods (`account_list`, `key_list`, …, answering in the engine's
//! types and errors, as much as the gRPC answers carry) and the [`AdminEndpoint`] rows built from
//! them with the same functions the gRPC client reads the selector's answers with, so both modes
//! show the same.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use poolgate_core::AccountId;
use poolgate_core::account::{Account, ApiKeyRecord, Price, SignIn, SignedIn};
use poolgate_core::keys::{KeyUpdate, PeriodUsage, UsagePeriod};
use poolgate_core::price::{ListedPrice, PriceSource, check_price};
use poolgate_core::status::StatusReport;
use poolgate_proto::convert::{AccountReadings, WindowsAnswer};
use poolgate_select::engine::{Selector, SelectorError};
use poolgate_select::prices::catalogue;
use poolgate_select::snapshot::Snapshot;
use poolgate_select::source::{AdminStore, ModelUsage, UsageTotals};

use crate::grpc::{
    list_prices_answer, model_usage_rows, model_usage_views, price_list_of, price_row_of,
    row_of_account, rows_of_windows, usage_keys, usage_report,
};
use crate::view::{UsageReport, key_row, status_view};
use crate::{
    AccountRow, AdminEndpoint, BlockRow, KeyRow, OperatorError, PriceList, PriceRow, SignedInRow,
    StatusView, UsageRow, WindowRow,
};

/// A key's usage per period of the deployment's budget calendar (`Selector::key_usage`).
pub type KeyUsage = Vec<(UsagePeriod, i64, PeriodUsage)>;

/// The operator's verbs over one selection engine and the store its config comes from.
pub struct EngineAdmin {
    selector: Arc<Selector>,
    /// The keys' reads and writes (Postgres on a selector, the config file in standalone).
    store: Arc<dyn AdminStore>,
}

impl EngineAdmin {
    pub fn new(selector: Arc<Selector>, store: Arc<dyn AdminStore>) -> Self {
        EngineAdmin { selector, store }
    }

    /// A key's new expiry (created or changed) is not in the past on the engine's clock.
    pub fn check_new_expiry(&self, expires_at_ms: Option<i64>) -> Result<(), SelectorError> {
        poolgate_core::keys::check_new_expiry(expires_at_ms, self.selector.clock().wall_ms())
            .map_err(|problem| SelectorError::invalid("expires_at_ms", problem))
    }

    /// The engine the verbs run on (the selector's configuration RPCs reload it).
    pub fn selector(&self) -> &Arc<Selector> {
        &self.selector
    }

    /// The configured accounts, ascending by id: only `group`'s when given.
    pub fn account_list(&self, group: Option<&str>) -> Vec<Arc<Account>> {
        let snapshot = self.selector.snapshot().get();
        let mut accounts: Vec<Arc<Account>> = snapshot
            .accounts()
            .filter(|account| group.is_none_or(|group| account.group == group))
            .cloned()
            .collect();
        accounts.sort_by_key(|account| account.id);
        accounts
    }

    /// Every block on every account, ascending by account, with the account's name.
    pub async fn block_list(&self) -> Result<Vec<BlockRow>, SelectorError> {
        let blocks = self.selector.blocks().await?;
        let snapshot = self.selector.snapshot().get();
        Ok(blocks
            .into_iter()
            .map(|block| BlockRow {
                account_name: snapshot
                    .account(block.account_id)
                    .map(|account| account.name.clone())
                    .unwrap_or_default(),
                account_id: block.account_id,
                kind: block.kind.to_owned(),
                class: block.class,
                status: block.status,
                reason: block.reason,
                remaining_ms: block.remaining_ms,
            })
            .collect())
    }

    /// The stored usage-window readings (`Selector::windows`) and the clock they are read at,
    /// taken after the read: a reading stored just now is never ahead of it.
    pub async fn window_list(
        &self,
        account: Option<AccountId>,
        group: Option<&str>,
    ) -> Result<WindowsAnswer, SelectorError> {
        let accounts = self.selector.windows(account, group).await?;
        Ok(WindowsAnswer {
            now_ms: self.selector.clock().wall_ms(),
            accounts: accounts
                .into_iter()
                .map(|(account, readings)| AccountReadings {
                    account_id: account.id,
                    account_name: account.name.clone(),
                    readings,
                })
                .collect(),
        })
    }

    /// Back to `active`, blocks cleared (`Selector::restore`); the account after.
    pub async fn restore_account(&self, id: AccountId) -> Result<Arc<Account>, SelectorError> {
        self.selector.restore(id).await
    }

    /// Clears a configured account's blocks and breaker; an account the engine does not serve
    /// is `NotFound`.
    pub async fn clear_account_blocks(&self, id: AccountId) -> Result<(), SelectorError> {
        if self.selector.snapshot().get().account(id).is_none() {
            return Err(SelectorError::NotFound(format!("no account {id}")));
        }
        self.selector.clear_blocks(id).await
    }

    /// Every client key the store lists, ascending by id, each with its usage per budget period.
    pub async fn key_list(&self) -> Result<Vec<(ApiKeyRecord, KeyUsage)>, SelectorError> {
        let records = self.store.list_api_keys().await?;
        // One ledger read per period per key, in the calendar admission counts budgets in.
        let mut keys = Vec::with_capacity(records.len());
        for record in records {
            let usage = self.selector.key_usage(record.id).await?;
            keys.push((record, usage));
        }
        Ok(keys)
    }

    /// Changes a client key as `update` gives (its disable, access, limits), served at once (the
    /// engine reloads); the key after, with its usage.
    pub async fn update_key(
        &self,
        api_key_id: i64,
        update: &KeyUpdate,
    ) -> Result<(ApiKeyRecord, KeyUsage), SelectorError> {
        self.check_new_expiry(update.expires_at_ms.flatten())?;
        let record = self.store.update_api_key(api_key_id, update).await?;
        self.selector.reload().await?;
        let usage = self.selector.key_usage(record.id).await?;
        Ok((record, usage))
    }

    /// One client key's usage totals in `[from_ms, to_ms)`.
    pub async fn usage_totals(
        &self,
        api_key_id: i64,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<UsageTotals, SelectorError> {
        if to_ms <= from_ms {
            return Err(SelectorError::invalid("to_ms", "must be after from_ms"));
        }
        Ok(self
            .selector
            .source()
            .read_usage(api_key_id, from_ms, to_ms)
            .await?)
    }

    /// Puts a sign-in's tokens into the pool through the store ([`AdminStore::sign_in`]),
    /// served at once (the engine reloads); an account that came back from `error` has its
    /// blocks and breaker cleared, as `restore` does.
    pub async fn sign_in_account(&self, sign_in: &SignIn) -> Result<SignedIn, SelectorError> {
        if let Some((field, message)) = sign_in.problem() {
            return Err(SelectorError::invalid(field, message));
        }
        let signed_in = self.store.sign_in(sign_in).await?;
        self.selector.reload().await?;
        if signed_in.reactivated {
            self.selector.clear_blocks(signed_in.account.id).await?;
        }
        tracing::info!(
            account_id = signed_in.account.id,
            created = signed_in.created,
            reactivated = signed_in.reactivated,
            "account signed in"
        );
        Ok(signed_in)
    }

    /// The pool at a glance (`Selector::status`).
    pub async fn status_report(&self) -> Result<StatusReport, SelectorError> {
        self.selector.status().await
    }

    /// One client key's usage in `[from_ms, to_ms)` per model and the price it was charged at.
    pub async fn model_usage(
        &self,
        api_key_id: i64,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<ModelUsage>, SelectorError> {
        Ok(self
            .selector
            .source()
            .read_model_usage(api_key_id, from_ms, to_ms)
            .await?)
    }

    /// Every price a model may be charged at, ascending by model: the operator's (each over the
    /// catalogue's, if any) and the shipped catalogue's (docs/DESIGN.md §6, "Prices"); and the
    /// day the catalogue was read.
    pub fn price_list(&self) -> (Vec<ListedPrice>, &'static str) {
        let snapshot = self.selector.snapshot().get();
        let catalogue = catalogue();
        let mut listed: BTreeMap<String, ListedPrice> = catalogue
            .models()
            .iter()
            .map(|entry| {
                (
                    entry.model.clone(),
                    ListedPrice {
                        model: entry.model.clone(),
                        price: Some(entry.price),
                        source: PriceSource::Catalogue,
                        catalogue: None,
                    },
                )
            })
            .collect();
        for model in snapshot.operator_prices().keys() {
            listed.insert(model.clone(), listed_price(&snapshot, model));
        }
        (listed.into_values().collect(), catalogue.as_of())
    }

    /// Sets the operator's price of `model` (checked: the field named), served at once; the
    /// model's listing after.
    pub async fn set_price(&self, model: &str, price: Price) -> Result<ListedPrice, SelectorError> {
        check_price(model, &price)
            .map_err(|(field, problem)| SelectorError::invalid(field, problem))?;
        self.store.set_price(model, Some(price)).await?;
        self.selector.reload().await?;
        Ok(listed_price(&self.selector.snapshot().get(), model))
    }

    /// Removes the operator's price of `model` (the catalogue's applies again, or none); the
    /// model's listing after. No operator price: `NotFound`.
    pub async fn remove_price(&self, model: &str) -> Result<ListedPrice, SelectorError> {
        if model.is_empty() {
            return Err(SelectorError::invalid("model", "must not be empty"));
        }
        self.store.set_price(model, None).await?;
        self.selector.reload().await?;
        Ok(listed_price(&self.selector.snapshot().get(), model))
    }
}

/// A model's listing in a snapshot: the operator's price (with the catalogue's it overrides),
/// else the catalogue's, else none.
fn listed_price(snapshot: &Snapshot, model: &str) -> ListedPrice {
    let in_catalogue = catalogue().get(model).map(|entry| entry.price);
    match snapshot.operator_prices().get(model) {
        Some(price) => ListedPrice {
            model: model.to_owned(),
            price: Some(*price),
            source: PriceSource::Operator,
            catalogue: in_catalogue,
        },
        None => ListedPrice {
            model: model.to_owned(),
            price: in_catalogue,
            source: if in_catalogue.is_some() {
                PriceSource::Catalogue
            } else {
                PriceSource::None
            },
            catalogue: None,
        },
    }
}

/// An engine error as the operator's: `not_found` names what was missing as the verb asked for
/// it (`no account 7`); a refused argument keeps its field; anything else is the backend.
pub fn operator_error(error: SelectorError, not_found: impl FnOnce() -> String) -> OperatorError {
    match error {
        SelectorError::NotFound(_) => OperatorError::NotFound(not_found()),
        SelectorError::InvalidArgument { .. } => OperatorError::Invalid(error.to_string()),
        // A name or an identity another account has: the operator's input, as a bad field is.
        SelectorError::Conflict(what) => OperatorError::Invalid(what),
        other => OperatorError::Unavailable(format!("backend unavailable: {other}")),
    }
}

fn no_account(id: AccountId) -> impl FnOnce() -> String {
    move || format!("no account {id}")
}

fn no_key(id: i64) -> impl FnOnce() -> String {
    move || format!("no client key {id}")
}

fn engine_error(error: SelectorError) -> OperatorError {
    operator_error(error, || "not found".into())
}

/// An account's row, built as the gRPC client builds it from the selector's answer.
fn row(account: &Account) -> Result<AccountRow, OperatorError> {
    row_of_account(account)
}

#[async_trait]
impl AdminEndpoint for EngineAdmin {
    async fn accounts(&self, group: Option<&str>) -> Result<Vec<AccountRow>, OperatorError> {
        self.account_list(group)
            .iter()
            .map(|account| row(account))
            .collect()
    }

    async fn blocks(&self) -> Result<Vec<BlockRow>, OperatorError> {
        self.block_list().await.map_err(engine_error)
    }

    async fn windows(
        &self,
        account_id: Option<i64>,
        group: Option<&str>,
    ) -> Result<Vec<WindowRow>, OperatorError> {
        // Only an account asked for can be unknown.
        let answer = self
            .window_list(account_id, group)
            .await
            .map_err(|e| operator_error(e, no_account(account_id.unwrap_or_default())))?;
        Ok(rows_of_windows(&answer))
    }

    async fn restore(&self, account_id: i64) -> Result<AccountRow, OperatorError> {
        let account = self
            .restore_account(account_id)
            .await
            .map_err(|e| operator_error(e, no_account(account_id)))?;
        row(&account)
    }

    async fn clear_block(&self, account_id: i64) -> Result<(), OperatorError> {
        self.clear_account_blocks(account_id)
            .await
            .map_err(|e| operator_error(e, no_account(account_id)))
    }

    async fn usage(
        &self,
        from_ms: i64,
        to_ms: i64,
        api_key_id: Option<i64>,
    ) -> Result<UsageReport, OperatorError> {
        if to_ms <= from_ms {
            return Err(engine_error(SelectorError::invalid(
                "to_ms",
                "must be after from_ms",
            )));
        }
        let listed = self
            .store
            .list_api_keys()
            .await
            .map_err(|e| engine_error(e.into()))?;
        let mut rows = Vec::new();
        for key in usage_keys(listed, |key| key.id, api_key_id)? {
            let totals = self
                .usage_totals(key.id, from_ms, to_ms)
                .await
                .map_err(engine_error)?;
            let models = self
                .model_usage(key.id, from_ms, to_ms)
                .await
                .map_err(engine_error)?;
            rows.push(UsageRow {
                api_key_id: key.id,
                user: key.user,
                requests: totals.requests.max(0) as u64,
                input_tokens: totals.input_tokens.max(0) as u64,
                output_tokens: totals.output_tokens.max(0) as u64,
                cost_usd: totals.cost_usd,
                models: model_usage_rows(model_usage_views(&models))?,
            });
        }
        Ok(usage_report(from_ms, to_ms, rows))
    }

    async fn keys(&self) -> Result<Vec<KeyRow>, OperatorError> {
        let keys = self.key_list().await.map_err(engine_error)?;
        Ok(keys
            .iter()
            .map(|(record, usage)| key_row(record, usage))
            .collect())
    }

    async fn set_key_disabled(
        &self,
        api_key_id: i64,
        disabled: bool,
    ) -> Result<KeyRow, OperatorError> {
        let update = KeyUpdate {
            disabled: Some(disabled),
            ..KeyUpdate::default()
        };
        let (record, usage) = self
            .update_key(api_key_id, &update)
            .await
            .map_err(|e| operator_error(e, no_key(api_key_id)))?;
        Ok(key_row(&record, &usage))
    }

    async fn status(&self) -> Result<StatusView, OperatorError> {
        let report = self.status_report().await.map_err(engine_error)?;
        Ok(status_view(&report))
    }

    async fn sign_in(&self, sign_in: &SignIn) -> Result<SignedInRow, OperatorError> {
        let account_id = sign_in.account_id.unwrap_or_default();
        let signed_in = self
            .sign_in_account(sign_in)
            .await
            .map_err(|e| operator_error(e, no_account(account_id)))?;
        Ok(SignedInRow {
            account: row(&signed_in.account)?,
            created: signed_in.created,
            reactivated: signed_in.reactivated,
        })
    }

    async fn prices(&self) -> Result<PriceList, OperatorError> {
        let (prices, as_of) = self.price_list();
        price_list_of(list_prices_answer(&prices, as_of))
    }

    async fn set_price(&self, model: &str, price: Price) -> Result<PriceRow, OperatorError> {
        let listed = EngineAdmin::set_price(self, model, price)
            .await
            .map_err(engine_error)?;
        price_row_of((&listed).into())
    }

    async fn remove_price(&self, model: &str) -> Result<PriceRow, OperatorError> {
        let listed = EngineAdmin::remove_price(self, model)
            .await
            .map_err(|e| operator_error(e, || format!("no operator price for {model}")))?;
        price_row_of((&listed).into())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use poolgate_core::account::{AccountStatus, CredentialKind, Platform, Secret};

    use super::*;

    #[test]
    fn the_row_carries_the_accounts_limits_and_masks_its_credential() {
        let account = Account {
            serves: Vec::new(),
            id: 4,
            name: "a".into(),
            group: "g".into(),
            platform: Platform::Anthropic,
            base_url: "http://127.0.0.1".into(),
            credential_kind: CredentialKind::ApiKey,
            credential: Secret::new("sk-ant-0123456789abcdef"),
            oauth: None,
            status: AccountStatus::Active,
            status_reason: String::new(),
            priority: 1,
            weight: 2,
            concurrency_limit: 3,
            rpm_limit: 60,
            session_window_limit_usd: 12.5,
            allowed_models: vec![],
            model_mapping: HashMap::new(),
            proxy_url: None,
            probe_model: None,
            stream_usage: true,
            identity: Default::default(),
        };
        let row = row(&account).expect("a row");
        assert_eq!(
            (
                row.priority,
                row.weight,
                row.concurrency_limit,
                row.rpm_limit,
                row.session_window_limit_usd
            ),
            (1, 2, 3, 60, 12.5)
        );
        assert_eq!(row.credential_masked, account.credential.masked());
        assert!(!row.credential_masked.contains("0123456789"));
    }

    #[test]
    fn a_missing_thing_is_named_as_the_verb_asked_for_it_and_the_rest_is_the_backend() {
        let error = operator_error(SelectorError::NotFound("account 7".into()), no_account(7));
        assert_eq!(error, OperatorError::NotFound("no account 7".into()));
        let error = operator_error(SelectorError::invalid("to_ms", "must be after"), no_key(1));
        assert_eq!(
            error,
            OperatorError::Invalid("invalid to_ms: must be after".into())
        );
        let error = engine_error(SelectorError::Unavailable("redis".into()));
        assert!(matches!(error, OperatorError::Unavailable(_)), "{error:?}");
    }
}
