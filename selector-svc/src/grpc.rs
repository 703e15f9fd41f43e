//! The gRPC transport of the selector: validation (`InvalidArgument` naming the field), proto ↔
//! domain, the admin bearer-token check. The only module that touches generated proto types.

use std::sync::Arc;

use poolgate_proto::convert::{self, EnumField};
use poolgate_proto::selector::v1 as pb;
use tonic::{Request, Response, Status};

use crate::error::{key_refused, status};
use poolgate_core::account::Platform;
use poolgate_core::outcome::MAX_REASON_BYTES;
use poolgate_core::plan::UsageRecord;
use poolgate_core::{AccountId, MAX_NAME_BYTES};
mod admin;

pub use admin::{AdminAuth, AdminAuthService, AdminGrpc};

use poolgate_select::engine::{
    KeyVerdict, MAX_MODEL_BYTES, MAX_USAGE_RECORDS, Reported, SelectQuery, Selector, SelectorError,
    ViewFilter,
};

const MAX_EXCLUDED: usize = 256;

fn invalid(field: &str, message: impl Into<String>) -> Status {
    status(SelectorError::invalid(field, message))
}

fn name(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(invalid(
            field,
            format!(
                "must be at most {MAX_NAME_BYTES} bytes, got {}",
                value.len()
            ),
        ));
    }
    Ok(())
}

fn optional_name(field: &str, value: String) -> Result<Option<String>, Status> {
    if value.is_empty() {
        return Ok(None);
    }
    name(field, &value)?;
    Ok(Some(value))
}

fn account_id(field: &str, id: i64) -> Result<AccountId, Status> {
    if id <= 0 {
        return Err(invalid(
            field,
            format!("must be a positive account id, got {id}"),
        ));
    }
    Ok(id)
}

/// A client's poolgate key as a relay forwards it: 1..=256 bytes.
fn client_key(key: String) -> Result<String, Status> {
    if key.is_empty() || key.len() > 256 {
        return Err(invalid("api_key", "must be 1..=256 bytes"));
    }
    Ok(key)
}

/// A client key id a relay sends with a select or a response binding: 0 for none (an older
/// relay), else the key's id.
fn client_key_id(id: i64) -> Result<i64, Status> {
    if id < 0 {
        return Err(invalid(
            "api_key_id",
            format!("must be a client key id (0: none), got {id}"),
        ));
    }
    Ok(id)
}

pub struct SelectorGrpc {
    selector: Arc<Selector>,
}

impl SelectorGrpc {
    pub fn new(selector: Arc<Selector>) -> Self {
        SelectorGrpc { selector }
    }
}

#[tonic::async_trait]
impl pb::selector_server::Selector for SelectorGrpc {
    async fn select(
        &self,
        request: Request<pb::SelectRequest>,
    ) -> Result<Response<pb::SelectResponse>, Status> {
        let request = request.into_inner();
        name("group", &request.group)?;
        let platform = Platform::decode("platform", request.platform)?;
        if request.model.is_empty() || request.model.len() > MAX_MODEL_BYTES {
            return Err(invalid(
                "model",
                format!("must be 1..={MAX_MODEL_BYTES} bytes"),
            ));
        }
        if request.exclude_account_ids.len() > MAX_EXCLUDED {
            return Err(invalid(
                "exclude_account_ids",
                format!("at most {MAX_EXCLUDED} ids"),
            ));
        }
        for &id in &request.exclude_account_ids {
            account_id("exclude_account_ids", id)?;
        }
        let reads_confirming = request.reads_confirming;
        // Unset: chat, what a 0.1.0 relay asks for.
        let service = if request.service == pb::Service::Unspecified as i32 {
            poolgate_core::account::Service::Chat
        } else {
            poolgate_core::account::Service::decode("service", request.service)?
        };
        let query = SelectQuery {
            group: request.group,
            platform: Some(platform),
            service,
            model: request.model,
            session_hash: optional_name("session_hash", request.session_hash)?,
            previous_response_id: optional_name(
                "previous_response_id",
                request.previous_response_id,
            )?,
            exclude: request.exclude_account_ids,
            max_accounts: request.max_accounts.min(64) as usize,
            api_key_id: client_key_id(request.api_key_id)?,
        };
        let plan = self.selector.plan(&query).await.map_err(status)?;
        Ok(Response::new(convert::select_response(
            &plan,
            reads_confirming,
        )))
    }

    async fn report_outcome(
        &self,
        request: Request<pb::ReportOutcomeRequest>,
    ) -> Result<Response<pb::ReportOutcomeResponse>, Status> {
        let outcome = convert::read_outcome(request.into_inner())?;
        Ok(Response::new(
            match self
                .selector
                .report_outcome(&outcome)
                .await
                .map_err(status)?
            {
                Reported::Applied(applied) => {
                    convert::report_answer(applied.what, applied.block_ms, None)
                }
                Reported::Refreshed(fresh) => {
                    convert::report_answer(poolgate_core::plan::Effect::Refreshed, 0, Some(&fresh))
                }
            },
        ))
    }

    async fn bind_session(
        &self,
        request: Request<pb::BindSessionRequest>,
    ) -> Result<Response<pb::BindSessionResponse>, Status> {
        let request = request.into_inner();
        name("group", &request.group)?;
        name("session_hash", &request.session_hash)?;
        let id = account_id("account_id", request.account_id)?;
        let result = self
            .selector
            .bind_session(&request.group, &request.session_hash, id)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::BindSessionResponse {
            result: result.to_owned(),
        }))
    }

    async fn bind_response(
        &self,
        request: Request<pb::BindResponseRequest>,
    ) -> Result<Response<pb::BindResponseResponse>, Status> {
        let request = request.into_inner();
        name("response_id", &request.response_id)?;
        let id = account_id("account_id", request.account_id)?;
        let api_key_id = client_key_id(request.api_key_id)?;
        self.selector
            .bind_response_for_key(api_key_id, &request.response_id, id)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::BindResponseResponse {}))
    }

    async fn authenticate(
        &self,
        request: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        let key = client_key(request.into_inner().api_key)?;
        // The engine judges the key; a refusal becomes the one the relay reads
        // (docs/DESIGN.md §6).
        match self.selector.check_key(&key).map_err(status)? {
            KeyVerdict::Accepted(record) => {
                Ok(Response::new(pb::AuthenticateResponse::from(&*record)))
            }
            KeyVerdict::Refused(refusal) => Err(key_refused(&refusal)),
        }
    }

    async fn describe_key(
        &self,
        request: Request<pb::DescribeKeyRequest>,
    ) -> Result<Response<pb::DescribeKeyResponse>, Status> {
        let key = client_key(request.into_inner().api_key)?;
        let description = self.selector.describe_key(&key).await.map_err(status)?;
        Ok(Response::new(pb::DescribeKeyResponse::from(&description)))
    }

    async fn record_usage(
        &self,
        request: Request<pb::RecordUsageRequest>,
    ) -> Result<Response<pb::RecordUsageResponse>, Status> {
        let records = request.into_inner().records;
        if records.len() > MAX_USAGE_RECORDS {
            return Err(invalid(
                "records",
                format!("at most {MAX_USAGE_RECORDS} per call"),
            ));
        }
        let records = records
            .into_iter()
            .map(UsageRecord::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        let accepted = self.selector.record_usage(records).await.map_err(status)?;
        Ok(Response::new(pb::RecordUsageResponse {
            accepted: accepted as u32,
        }))
    }

    async fn record_windows(
        &self,
        request: Request<pb::RecordWindowsRequest>,
    ) -> Result<Response<pb::RecordWindowsResponse>, Status> {
        // Every account is checked before any is recorded: a bad batch records nothing.
        let accounts = convert::read_windows_request(request.into_inner())?;
        let accepted = accounts.len() as u32;
        let recorded = futures_util::future::join_all(
            accounts
                .into_iter()
                .map(|(account_id, readings)| self.selector.record_windows(account_id, readings)),
        )
        .await;
        recorded
            .into_iter()
            .collect::<Result<Vec<()>, _>>()
            .map_err(status)?;
        Ok(Response::new(pb::RecordWindowsResponse { accepted }))
    }

    type WatchViewStream = tokio_stream::wrappers::ReceiverStream<Result<pb::ViewUpdate, Status>>;

    async fn watch_view(
        &self,
        request: Request<pb::WatchViewRequest>,
    ) -> Result<Response<Self::WatchViewStream>, Status> {
        let period = self.selector.view_period();
        let mut filter = ViewFilter::new(
            request.into_inner().groups,
            period,
            self.selector.deployment(),
        )
        .map_err(status)?;
        let mut pool = self.selector.watch_pool();
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                let update = {
                    let state = pool.borrow_and_update().clone();
                    state.is_read().then(|| filter.update(&state))
                };
                if let Some(update) = update
                    && sender
                        .send(Ok(pb::ViewUpdate::from(&update)))
                        .await
                        .is_err()
                {
                    // The relay went away.
                    return;
                }
                // The next reading, or the period's heartbeat.
                if let Ok(Err(_)) = tokio::time::timeout(period, pool.changed()).await {
                    // The engine stopped.
                    return;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            receiver,
        )))
    }

    async fn list_models(
        &self,
        request: Request<pb::ListModelsRequest>,
    ) -> Result<Response<pb::ListModelsResponse>, Status> {
        let request = request.into_inner();
        name("group", &request.group)?;
        let platform = Platform::decode("platform", request.platform)?;
        let models = self.selector.models(&request.group, platform);
        Ok(Response::new(pb::ListModelsResponse { models }))
    }
}
