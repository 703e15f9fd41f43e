//! The status page's view of this selector (`--admin-http-listen`): an [`AdminEndpoint`] that
//! calls the selector's own admin gRPC service in process — the generated service trait's
//! methods on the same `AdminGrpc` value the gRPC server mounts, without the network — so the
//! page reads exactly what `selector-svc admin` reads (one admin surface). The answers go through
//! the operator crate's conversions, as the CLI's do. It only reads: the page offers no write, and
//! the write verbs are refused here.

use std::sync::Arc;

use async_trait::async_trait;
use poolgate_operator::grpc::{account_row, api_key_row};
use poolgate_operator::view::{UsageReport, status_view, window_rows};
use poolgate_operator::{
    AccountRow, AdminEndpoint, BlockRow, KeyRow, OperatorError, StatusView, UsageRow, WindowRow,
};
use poolgate_proto::convert;
use poolgate_proto::selector::v1 as pb;
use poolgate_proto::selector::v1::selector_admin_server::SelectorAdmin;
use tonic::Request;

use crate::grpc::AdminGrpc;

/// The selector's admin service, called in process.
pub struct InProcessAdmin {
    admin: Arc<AdminGrpc>,
}

impl InProcessAdmin {
    /// Over the service value the gRPC server mounts.
    pub fn new(admin: Arc<AdminGrpc>) -> Self {
        InProcessAdmin { admin }
    }
}

fn unreadable(error: convert::ConvertError) -> OperatorError {
    OperatorError::Unreadable(error.to_string())
}

fn read_only() -> OperatorError {
    OperatorError::Invalid("the status page is read-only".into())
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

#[async_trait]
impl AdminEndpoint for InProcessAdmin {
    async fn accounts(&self, group: Option<&str>) -> Result<Vec<AccountRow>, OperatorError> {
        let answer = self
            .admin
            .list_accounts(Request::new(pb::ListAccountsRequest {
                group: group.unwrap_or_default().to_owned(),
            }))
            .await?;
        answer.get_ref().accounts.iter().map(account_row).collect()
    }

    async fn blocks(&self) -> Result<Vec<BlockRow>, OperatorError> {
        let answer = self
            .admin
            .list_blocks(Request::new(pb::ListBlocksRequest {}))
            .await?;
        answer
            .into_inner()
            .blocks
            .into_iter()
            .map(block_row)
            .collect()
    }

    async fn windows(
        &self,
        account_id: Option<i64>,
        group: Option<&str>,
    ) -> Result<Vec<WindowRow>, OperatorError> {
        let answer = self
            .admin
            .list_windows(Request::new(convert::windows_query(account_id, group)))
            .await?;
        let read = convert::read_windows_answer(answer.into_inner()).map_err(unreadable)?;
        Ok(window_rows(
            read.now_ms,
            read.accounts.iter().map(|account| {
                (
                    account.account_id,
                    account.account_name.as_str(),
                    account.readings.as_slice(),
                )
            }),
        ))
    }

    async fn restore(&self, _account_id: i64) -> Result<AccountRow, OperatorError> {
        Err(read_only())
    }

    async fn clear_block(&self, _account_id: i64) -> Result<(), OperatorError> {
        Err(read_only())
    }

    async fn usage(
        &self,
        from_ms: i64,
        to_ms: i64,
        api_key_id: Option<i64>,
    ) -> Result<UsageReport, OperatorError> {
        let listed = self
            .admin
            .list_api_keys(Request::new(pb::ListApiKeysRequest {}))
            .await?
            .into_inner()
            .keys;
        let keys: Vec<_> = listed
            .into_iter()
            .filter(|key| api_key_id.is_none_or(|id| key.id == id))
            .collect();
        if let (Some(id), true) = (api_key_id, keys.is_empty()) {
            return Err(OperatorError::NotFound(format!("no client key {id}")));
        }
        // 0 / 0 means "the last 24 h" to the selector: a window always has a start past 0.
        let (from, to) = (from_ms.max(1) as u64, to_ms.max(2) as u64);
        let mut rows = Vec::with_capacity(keys.len());
        for key in keys {
            let totals = self
                .admin
                .read_usage(Request::new(pb::ReadUsageRequest {
                    api_key_id: key.id,
                    from_ms: from,
                    to_ms: to,
                }))
                .await?
                .into_inner();
            rows.push(UsageRow {
                api_key_id: key.id,
                user: key.user,
                requests: totals.requests,
                input_tokens: totals.input_tokens,
                output_tokens: totals.output_tokens,
                cost_usd: totals.cost_usd,
            });
        }
        rows.sort_by_key(|row| row.api_key_id);
        Ok(UsageReport {
            from_ms,
            to_ms,
            keys: rows,
        })
    }

    async fn keys(&self) -> Result<Vec<KeyRow>, OperatorError> {
        let answer = self
            .admin
            .list_api_keys(Request::new(pb::ListApiKeysRequest {}))
            .await?;
        let mut rows = answer
            .into_inner()
            .keys
            .into_iter()
            .map(api_key_row)
            .collect::<Result<Vec<_>, _>>()?;
        rows.sort_by_key(|row| row.id);
        Ok(rows)
    }

    async fn set_key_disabled(
        &self,
        _api_key_id: i64,
        _disabled: bool,
    ) -> Result<KeyRow, OperatorError> {
        Err(read_only())
    }

    async fn status(&self) -> Result<StatusView, OperatorError> {
        let answer = self
            .admin
            .read_status(Request::new(pb::ReadStatusRequest {}))
            .await?;
        let report = convert::read_status_answer(answer.into_inner()).map_err(unreadable)?;
        Ok(status_view(&report))
    }
}
