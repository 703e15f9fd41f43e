//! The selector's admin gRPC API as an [`AdminEndpoint`]: the generated client of
//! `poolgate.selector.v1.SelectorAdmin`, the admin token as `authorization: Bearer` metadata and
//! the service token as `x-poolgate-service-token`; the answers read into rows by [`rows`], the
//! conversions the selector's admin service shares. The selector's configuration verbs use the
//! same connection through [`SelectorAdmin::client`].

mod rows;

use std::time::Duration;

use crate::SignedInRow;
use async_trait::async_trait;
use poolgate_core::account::SignIn;
use poolgate_proto::convert;
use poolgate_proto::selector::v1 as pb;
use poolgate_proto::selector::v1::selector_admin_client::SelectorAdminClient;
use poolgate_rpc::service_auth::WithToken;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub use rows::{
    account_row, api_key_row, block_rows, block_view, key_rows, list_prices_answer,
    model_usage_rows, model_usage_views, price_list_of, price_row_of, row_of_account,
    rows_of_windows, status_of, usage_keys, usage_report, usage_request, usage_row, window_rows_of,
};

use crate::view::UsageReport;
use crate::{
    AccountRow, AdminEndpoint, BlockRow, KeyRow, OperatorError, PriceList, PriceRow, StatusView,
    WindowRow,
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
            tonic::Code::InvalidArgument
            | tonic::Code::FailedPrecondition
            | tonic::Code::AlreadyExists => OperatorError::Invalid(detail),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => {
                OperatorError::Unavailable(detail)
            }
            _ => OperatorError::Failed(detail),
        }
    }
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
        for key in usage_keys(listed, |key| key.id, api_key_id)? {
            let totals = client
                .read_usage(usage_request(key.id, from_ms, to_ms))
                .await?
                .into_inner();
            rows.push(usage_row(key, totals)?);
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

    async fn sign_in(&self, sign_in: &SignIn) -> Result<SignedInRow, OperatorError> {
        let answer = self
            .client()
            .sign_in_account(pb::SignInAccountRequest::from(sign_in))
            .await?;
        rows::signed_in_row(answer.get_ref())
    }

    async fn prices(&self) -> Result<PriceList, OperatorError> {
        let answer = self.client().list_prices(pb::ListPricesRequest {}).await?;
        price_list_of(answer.into_inner())
    }

    async fn set_price(
        &self,
        model: &str,
        price: poolgate_core::account::Price,
    ) -> Result<PriceRow, OperatorError> {
        let answer = self
            .client()
            .set_price(pb::SetPriceRequest {
                model: model.to_owned(),
                price: Some(price.into()),
            })
            .await?;
        price_row_of(answer.into_inner())
    }

    async fn remove_price(&self, model: &str) -> Result<PriceRow, OperatorError> {
        let answer = self
            .client()
            .remove_price(pb::RemovePriceRequest {
                model: model.to_owned(),
            })
            .await?;
        price_row_of(answer.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
