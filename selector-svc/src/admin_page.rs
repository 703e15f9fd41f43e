//! The status page's view of this selector (`--admin-http-listen`): an [`AdminEndpoint`] that
//! calls the selector's own admin gRPC service in process — the generated service trait's
//! methods on the same `AdminGrpc` value the gRPC server mounts, without the network — so the
//! page reads exactly what `selector-svc admin` reads (one admin surface). The answers go through
//! the operator crate's conversions, as the CLI's do. It only reads: the page offers no write, and
//! the write verbs are refused here.

use std::sync::Arc;

use async_trait::async_trait;
use poolgate_operator::grpc::{
    account_row, block_rows, key_rows, status_of, usage_keys, usage_report, usage_request,
    usage_row, window_rows_of,
};
use poolgate_operator::view::UsageReport;
use poolgate_operator::{
    AccountRow, AdminEndpoint, BlockRow, KeyRow, OperatorError, StatusView, WindowRow,
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

fn read_only() -> OperatorError {
    OperatorError::Invalid("the status page is read-only".into())
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
        block_rows(answer.into_inner())
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
        window_rows_of(answer.into_inner())
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
        let mut rows = Vec::new();
        for key in usage_keys(listed, api_key_id)? {
            let totals = self
                .admin
                .read_usage(Request::new(usage_request(key.id, from_ms, to_ms)))
                .await?
                .into_inner();
            rows.push(usage_row(key, totals));
        }
        Ok(usage_report(from_ms, to_ms, rows))
    }

    async fn keys(&self) -> Result<Vec<KeyRow>, OperatorError> {
        let answer = self
            .admin
            .list_api_keys(Request::new(pb::ListApiKeysRequest {}))
            .await?;
        key_rows(answer.into_inner())
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
        status_of(answer.into_inner())
    }
}
