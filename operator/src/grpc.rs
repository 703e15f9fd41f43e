//! The selector's admin gRPC API as an [`AdminEndpoint`]: the generated client of
//! `poolgate.selector.v1.SelectorAdmin`, the admin token as `authorization: Bearer` metadata and
//! the service token as `x-poolgate-service-token`. Answers are read strictly (an enum the CLI
//! cannot read is an unreadable answer, never a guess). The selector's configuration verbs use
//! the same connection through [`SelectorAdmin::client`].

use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::account::Platform;
use poolgate_proto::convert::keys::usage_from_wire;
use poolgate_proto::convert::{self, EnumField};
use poolgate_proto::selector::v1 as pb;
use poolgate_proto::selector::v1::selector_admin_client::SelectorAdminClient;
use poolgate_rpc::service_auth::WithToken;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::view::{UsageReport, key_row, status_view, window_rows};
use crate::{
    AccountRow, AdminEndpoint, BlockRow, KeyRow, OperatorError, StatusView, UsageRow, WindowRow,
};

/// The admin client with both tokens on every call.
pub type AdminClient = SelectorAdminClient<InterceptedService<WithToken<Channel>, Bearer>>;

/// Adds the admin token (`authorization: Bearer …`, marked sensitive) to every call.
#[derive(Clone)]
pub struct Bearer(AsciiMetadataValue);

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

/// A connection to one selector's admin API.
#[derive(Clone)]
pub struct SelectorAdmin {
    client: AdminClient,
}

impl SelectorAdmin {
    /// Connects to `endpoint` (`http://127.0.0.1:50062`).
    pub async fn connect(
        endpoint: &str,
        admin_token: &str,
        service_token: Option<&str>,
    ) -> Result<Self, OperatorError> {
        let mut bearer: AsciiMetadataValue =
            MetadataValue::try_from(format!("Bearer {admin_token}")).map_err(|_| {
                OperatorError::Invalid("the admin token is not a valid header value".into())
            })?;
        bearer.set_sensitive(true);
        let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
            .map_err(|error| OperatorError::Invalid(format!("endpoint {endpoint}: {error}")))?
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .map_err(|error| OperatorError::Unreachable(format!("{endpoint}: {error}")))?;
        let channel = WithToken::new(channel, service_token);
        Ok(SelectorAdmin {
            client: SelectorAdminClient::with_interceptor(channel, Bearer(bearer)),
        })
    }

    /// The generated client on this connection, for the RPCs beyond the shared verbs.
    pub fn client(&self) -> AdminClient {
        self.client.clone()
    }
}

impl From<tonic::Status> for OperatorError {
    fn from(status: tonic::Status) -> Self {
        let detail = format!("{:?}: {}", status.code(), status.message());
        match status.code() {
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                OperatorError::Unauthenticated(detail)
            }
            tonic::Code::NotFound => OperatorError::NotFound(detail),
            tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => {
                OperatorError::Invalid(detail)
            }
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => {
                OperatorError::Unavailable(detail)
            }
            _ => OperatorError::Failed(detail),
        }
    }
}

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
    })
}

/// A key of the selector's list as the CLI shows it; one it cannot read is unreadable, never a
/// key without limits.
pub fn api_key_row(mut view: pb::ApiKeyView) -> Result<KeyRow, OperatorError> {
    let usage = usage_from_wire(std::mem::take(&mut view.usage)).map_err(unreadable)?;
    let record = poolgate_core::account::ApiKeyRecord::try_from(view).map_err(unreadable)?;
    Ok(key_row(&record, &usage))
}

// Readers of the admin API's answers, shared by every caller of the service: this client and the
// selector's status page, which calls the same service in process.

/// `ListBlocks`' answer as rows.
pub fn block_rows(answer: pb::ListBlocksResponse) -> Result<Vec<BlockRow>, OperatorError> {
    answer.blocks.into_iter().map(block_row).collect()
}

/// `ListWindows`' answer as rows.
pub fn window_rows_of(answer: pb::ListWindowsResponse) -> Result<Vec<WindowRow>, OperatorError> {
    let read = convert::read_windows_answer(answer).map_err(unreadable)?;
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
pub fn usage_keys(
    listed: Vec<pb::ApiKeyView>,
    api_key_id: Option<i64>,
) -> Result<Vec<pb::ApiKeyView>, OperatorError> {
    let Some(id) = api_key_id else {
        return Ok(listed);
    };
    let keys: Vec<_> = listed.into_iter().filter(|key| key.id == id).collect();
    if keys.is_empty() {
        return Err(OperatorError::NotFound(format!("no client key {id}")));
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

/// One key's `ReadUsage` answer as its row.
pub fn usage_row(key: pb::ApiKeyView, totals: pb::ReadUsageResponse) -> UsageRow {
    UsageRow {
        api_key_id: key.id,
        user: key.user,
        requests: totals.requests,
        input_tokens: totals.input_tokens,
        output_tokens: totals.output_tokens,
        cost_usd: totals.cost_usd,
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
impl AdminEndpoint for SelectorAdmin {
    async fn accounts(&self, group: Option<&str>) -> Result<Vec<AccountRow>, OperatorError> {
        let answer = self
            .client()
            .list_accounts(pb::ListAccountsRequest {
                group: group.unwrap_or_default().to_owned(),
            })
            .await?;
        answer.get_ref().accounts.iter().map(account_row).collect()
    }

    async fn blocks(&self) -> Result<Vec<BlockRow>, OperatorError> {
        let answer = self.client().list_blocks(pb::ListBlocksRequest {}).await?;
        block_rows(answer.into_inner())
    }

    async fn windows(
        &self,
        account_id: Option<i64>,
        group: Option<&str>,
    ) -> Result<Vec<WindowRow>, OperatorError> {
        let answer = self
            .client()
            .list_windows(convert::windows_query(account_id, group))
            .await?;
        window_rows_of(answer.into_inner())
    }

    async fn restore(&self, account_id: i64) -> Result<AccountRow, OperatorError> {
        let answer = self
            .client()
            .restore_account(pb::RestoreAccountRequest { account_id })
            .await?;
        account_row(answer.get_ref())
    }

    async fn clear_block(&self, account_id: i64) -> Result<(), OperatorError> {
        self.client()
            .clear_block(pb::ClearBlockRequest { account_id })
            .await?;
        Ok(())
    }

    async fn usage(
        &self,
        from_ms: i64,
        to_ms: i64,
        api_key_id: Option<i64>,
    ) -> Result<UsageReport, OperatorError> {
        let mut client = self.client();
        let listed = client
            .list_api_keys(pb::ListApiKeysRequest {})
            .await?
            .into_inner()
            .keys;
        let mut rows = Vec::new();
        for key in usage_keys(listed, api_key_id)? {
            let totals = client
                .read_usage(usage_request(key.id, from_ms, to_ms))
                .await?
                .into_inner();
            rows.push(usage_row(key, totals));
        }
        Ok(usage_report(from_ms, to_ms, rows))
    }

    async fn keys(&self) -> Result<Vec<KeyRow>, OperatorError> {
        let answer = self
            .client()
            .list_api_keys(pb::ListApiKeysRequest {})
            .await?;
        key_rows(answer.into_inner())
    }

    async fn set_key_disabled(
        &self,
        api_key_id: i64,
        disabled: bool,
    ) -> Result<KeyRow, OperatorError> {
        let answer = self
            .client()
            .update_api_key(pb::UpdateApiKeyRequest {
                id: api_key_id,
                disabled: Some(disabled),
                ..Default::default()
            })
            .await?;
        api_key_row(answer.into_inner())
    }

    async fn status(&self) -> Result<StatusView, OperatorError> {
        let answer = self.client().read_status(pb::ReadStatusRequest {}).await?;
        status_of(answer.into_inner())
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
    fn grpc_codes_map_to_what_an_operator_acts_on() {
        let error = OperatorError::from(tonic::Status::not_found("no account 9"));
        assert_eq!(error.to_string(), "not found (NotFound: no account 9)");
        assert!(matches!(
            OperatorError::from(tonic::Status::unauthenticated("admin token")),
            OperatorError::Unauthenticated(_)
        ));
    }
}
