//! The operator's rows and the selector's admin protos, converted once: the gRPC client reads the
//! selector's answers with these, the selector's admin service writes its blocks with
//! [`block_view`], and the engine's own rows (`crate::engine`) go through the same readers, so
//! both modes show the same. Answers are read strictly: a value the CLI cannot read is an
//! unreadable answer, never a guess.

use poolgate_core::account::{Account, ApiKeyRecord, Platform};
use poolgate_proto::convert::keys::usage_from_wire;
use poolgate_proto::convert::{self, EnumField, WindowsAnswer};
use poolgate_proto::selector::v1 as pb;

use crate::view::{UsageReport, key_row, price_row, status_view, window_rows};
use crate::{
    AccountRow, BlockRow, KeyRow, ModelUsageRow, OperatorError, PriceList, PriceRow, SignedInRow,
    StatusView, UsageRow, WindowRow,
};
use poolgate_core::price::{ListedPrice, PriceSource};
use poolgate_select::source::ModelUsage;

fn unreadable(error: convert::ConvertError) -> OperatorError {
    OperatorError::Unreadable(error.to_string())
}

/// The selector's account view as the shared row.
pub fn account_row(view: &pb::AccountView) -> Result<AccountRow, OperatorError> {
    let platform = Platform::decode("platform", view.platform).map_err(unreadable)?;
    #[allow(deprecated)]
    let kind = convert::credential_kind(view.kind, &view.credential_kind).map_err(unreadable)?;
    Ok(AccountRow {
        id: view.id,
        name: view.name.clone(),
        group: view.group.clone(),
        platform: platform.as_str().to_owned(),
        credential_kind: kind.as_str().to_owned(),
        credential_masked: view.credential_masked.clone(),
        status: view.status.clone(),
        status_reason: view.status_reason.clone(),
        priority: view.priority,
        weight: view.weight,
        concurrency_limit: view.concurrency_limit,
        rpm_limit: view.rpm_limit,
        session_window_limit_usd: view.session_window_limit_usd,
        upstream_id: view.upstream_id.clone(),
        email: view.email.clone(),
        plan: view.plan.clone(),
        token_expires_at_ms: view.token_expires_at_ms,
        refreshable: view.refreshable,
        // Values newer than this build are left out; a list of only such values is not the
        // platform's default, and says so.
        serves: match convert::serves_from_wire(&view.serves) {
            Some(serves) => serves
                .iter()
                .map(|service| service.as_str().to_owned())
                .collect(),
            None => vec!["unknown".to_owned()],
        },
    })
}

/// `SignInAccount`'s answer as the CLI shows it.
pub fn signed_in_row(answer: &pb::SignInAccountResponse) -> Result<SignedInRow, OperatorError> {
    let account = answer
        .account
        .as_ref()
        .ok_or_else(|| OperatorError::Unreadable("the answer carries no account".into()))?;
    Ok(SignedInRow {
        account: account_row(account)?,
        created: answer.created,
        reactivated: answer.reactivated,
    })
}

/// An engine's account as its row, through the view the selector answers with, so the engine's
/// rows and the client's are built by one function.
pub fn row_of_account(account: &Account) -> Result<AccountRow, OperatorError> {
    account_row(&pb::AccountView::from(account))
}

/// A key of the selector's list as the CLI shows it; one it cannot read is unreadable, never a
/// key without limits.
pub fn api_key_row(mut view: pb::ApiKeyView) -> Result<KeyRow, OperatorError> {
    let usage = usage_from_wire(std::mem::take(&mut view.usage)).map_err(unreadable)?;
    let record = ApiKeyRecord::try_from(view).map_err(unreadable)?;
    Ok(key_row(&record, &usage))
}

/// `ListBlocks`' answer as rows.
pub fn block_rows(answer: pb::ListBlocksResponse) -> Result<Vec<BlockRow>, OperatorError> {
    answer.blocks.into_iter().map(block_row).collect()
}

/// A block as `ListBlocks` answers it.
pub fn block_view(row: BlockRow) -> pb::BlockView {
    pb::BlockView {
        account_id: row.account_id,
        account_name: row.account_name,
        kind: row.kind,
        class: row.class,
        status: u32::from(row.status),
        reason: row.reason,
        remaining_ms: row.remaining_ms,
    }
}

fn block_row(view: pb::BlockView) -> Result<BlockRow, OperatorError> {
    let status = u16::try_from(view.status).map_err(|_| {
        OperatorError::Unreadable(format!("invalid status: {} is no HTTP status", view.status))
    })?;
    Ok(BlockRow {
        account_id: view.account_id,
        account_name: view.account_name,
        kind: view.kind,
        class: view.class,
        status,
        reason: view.reason,
        remaining_ms: view.remaining_ms,
    })
}

/// Accounts' readings as rows, read at the answer's clock.
pub fn rows_of_windows(answer: &WindowsAnswer) -> Vec<WindowRow> {
    window_rows(
        answer.now_ms,
        answer.accounts.iter().map(|account| {
            (
                account.account_id,
                account.account_name.as_str(),
                account.readings.as_slice(),
            )
        }),
    )
}

/// `ListWindows`' answer as rows.
pub fn window_rows_of(answer: pb::ListWindowsResponse) -> Result<Vec<WindowRow>, OperatorError> {
    let read = convert::read_windows_answer(answer).map_err(unreadable)?;
    Ok(rows_of_windows(&read))
}

/// `ListApiKeys`' answer as rows, by id.
pub fn key_rows(answer: pb::ListApiKeysResponse) -> Result<Vec<KeyRow>, OperatorError> {
    let mut rows = answer
        .keys
        .into_iter()
        .map(api_key_row)
        .collect::<Result<Vec<_>, _>>()?;
    rows.sort_by_key(|row| row.id);
    Ok(rows)
}

/// `ReadStatus`' answer as the status view.
pub fn status_of(answer: pb::ReadStatusResponse) -> Result<StatusView, OperatorError> {
    let report = convert::read_status_answer(answer).map_err(unreadable)?;
    Ok(status_view(&report))
}

/// The keys a usage report covers: every listed key, or the one asked for (`NotFound` when it
/// is not listed).
pub fn usage_keys<T>(
    listed: Vec<T>,
    id: impl Fn(&T) -> i64,
    api_key_id: Option<i64>,
) -> Result<Vec<T>, OperatorError> {
    let Some(wanted) = api_key_id else {
        return Ok(listed);
    };
    let keys: Vec<T> = listed.into_iter().filter(|key| id(key) == wanted).collect();
    if keys.is_empty() {
        return Err(OperatorError::NotFound(format!("no client key {wanted}")));
    }
    Ok(keys)
}

/// The `ReadUsage` request for one key; 0 / 0 means "the last 24 h" to the selector (a window
/// always has a start past 0).
pub fn usage_request(api_key_id: i64, from_ms: i64, to_ms: i64) -> pb::ReadUsageRequest {
    pb::ReadUsageRequest {
        api_key_id,
        from_ms: from_ms.max(1) as u64,
        to_ms: to_ms.max(2) as u64,
    }
}

/// One key's `ReadUsage` answer as its row; a price source the CLI cannot read is an unreadable
/// answer.
pub fn usage_row(
    key: pb::ApiKeyView,
    totals: pb::ReadUsageResponse,
) -> Result<UsageRow, OperatorError> {
    Ok(UsageRow {
        api_key_id: key.id,
        user: key.user,
        requests: totals.requests,
        input_tokens: totals.input_tokens,
        output_tokens: totals.output_tokens,
        cost_usd: totals.cost_usd,
        models: model_usage_rows(totals.models)?,
    })
}

/// The ledger's per-model usage as `ReadUsage` answers it.
pub fn model_usage_views(models: &[ModelUsage]) -> Vec<pb::ModelUsage> {
    poolgate_proto::convert::keys::model_usage_to_wire(models)
}

/// `ReadUsage`'s per-model usage as rows: unset is `unknown` (records an older relay wrote), a
/// source this build does not know is unreadable.
pub fn model_usage_rows(models: Vec<pb::ModelUsage>) -> Result<Vec<ModelUsageRow>, OperatorError> {
    models
        .into_iter()
        .map(|usage| {
            let price_source = if usage.price_source == 0 {
                "unknown".to_owned()
            } else {
                PriceSource::decode("models.price_source", usage.price_source)
                    .map_err(unreadable)?
                    .as_str()
                    .to_owned()
            };
            Ok(ModelUsageRow {
                model: usage.model,
                price_source,
                requests: usage.requests,
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cost_usd: usage.cost_usd,
            })
        })
        .collect()
}

/// A `PriceView` as its row, read strictly.
pub fn price_row_of(view: pb::PriceView) -> Result<PriceRow, OperatorError> {
    ListedPrice::try_from(view)
        .map(|listed| price_row(&listed))
        .map_err(unreadable)
}

/// `ListPrices`' answer as the `prices` listing.
pub fn price_list_of(answer: pb::ListPricesResponse) -> Result<PriceList, OperatorError> {
    Ok(PriceList {
        prices: answer
            .prices
            .into_iter()
            .map(price_row_of)
            .collect::<Result<_, _>>()?,
        catalogue_as_of: answer.catalogue_as_of,
    })
}

/// The engine's price listing as `ListPrices` answers it.
pub fn list_prices_answer(prices: &[ListedPrice], as_of: &str) -> pb::ListPricesResponse {
    pb::ListPricesResponse {
        prices: prices.iter().map(pb::PriceView::from).collect(),
        catalogue_as_of: as_of.to_owned(),
    }
}

/// The report over the rows, by key id.
pub fn usage_report(from_ms: i64, to_ms: i64, mut rows: Vec<UsageRow>) -> UsageReport {
    rows.sort_by_key(|row| row.api_key_id);
    UsageReport {
        from_ms,
        to_ms,
        keys: rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_account_view_the_cli_cannot_read_is_unreadable_not_a_guess() {
        let view = pb::AccountView {
            id: 1,
            platform: pb::Platform::Anthropic as i32,
            kind: pb::CredentialKind::Oauth as i32,
            status: "active".into(),
            priority: 2,
            weight: 3,
            concurrency_limit: 4,
            rpm_limit: 50,
            session_window_limit_usd: 7.5,
            ..Default::default()
        };
        let row = account_row(&view).expect("readable");
        assert_eq!(
            (row.platform.as_str(), row.credential_kind.as_str()),
            ("anthropic", "oauth")
        );
        assert_eq!(
            (
                row.priority,
                row.weight,
                row.concurrency_limit,
                row.rpm_limit,
                row.session_window_limit_usd
            ),
            (2, 3, 4, 50, 7.5),
            "the limits come through"
        );
        let unknown = pb::AccountView {
            platform: 99,
            ..view.clone()
        };
        assert!(matches!(
            account_row(&unknown),
            Err(OperatorError::Unreadable(_))
        ));
        let unset = pb::AccountView {
            platform: pb::Platform::Unspecified as i32,
            ..view
        };
        assert!(matches!(
            account_row(&unset),
            Err(OperatorError::Unreadable(_))
        ));
        let block = pb::BlockView {
            status: 70_000,
            ..Default::default()
        };
        assert!(matches!(
            block_row(block),
            Err(OperatorError::Unreadable(_))
        ));
    }

    #[test]
    fn an_accounts_serves_list_is_shown_as_set_and_a_newer_one_is_not_read_as_the_default() {
        let view = |serves: Vec<i32>| pb::AccountView {
            id: 1,
            platform: pb::Platform::Openai as i32,
            kind: pb::CredentialKind::ApiKey as i32,
            status: "active".into(),
            serves,
            ..Default::default()
        };
        let serves = |wire: Vec<i32>| account_row(&view(wire)).expect("readable").serves;
        assert_eq!(
            serves(vec![pb::Service::Embeddings as i32]),
            vec!["embeddings"]
        );
        assert!(serves(Vec::new()).is_empty(), "empty: the platform's own");
        assert_eq!(
            serves(vec![pb::Service::Chat as i32, 99]),
            vec!["chat"],
            "a newer value is left out"
        );
        assert_eq!(serves(vec![99]), vec!["unknown"]);
    }

    #[test]
    fn a_block_reads_back_as_the_row_it_was_written_from() {
        let row = BlockRow {
            account_id: 3,
            account_name: "a".into(),
            kind: "hard".into(),
            class: "quota_gone".into(),
            status: 402,
            reason: "credit balance too low".into(),
            remaining_ms: 5_000,
        };
        assert_eq!(block_row(block_view(row.clone())).expect("readable"), row);
    }
}
