//! The engine's own implementation of [`SelectionApi`]: the selection API's domain decisions,
//! each made here once for every caller in process (the standalone relay) and behind the
//! selector's gRPC service (whose `grpc.rs` decodes, calls the same engine methods, encodes).

use async_trait::async_trait;
use poolgate_core::account::Platform;
use poolgate_core::api::ApiError;
use poolgate_core::caller::{Caller, KeyCheck};
use poolgate_core::keys::KeyDescription;
use poolgate_core::outcome::Outcome;
use poolgate_core::plan::{Plan, PlanRequest, UsageRecord};
use poolgate_core::windows::WindowReading;

use super::{KeyVerdict, Reported, SelectQuery, Selector, SelectorError, binding_key};
use crate::api::SelectionApi;

impl From<SelectorError> for ApiError {
    fn from(error: SelectorError) -> Self {
        match error {
            SelectorError::InvalidArgument { field, message } => {
                ApiError::Invalid { field, message }
            }
            SelectorError::NotFound(what) => ApiError::NotFound(what),
            other @ (SelectorError::Unauthenticated(_)
            | SelectorError::Conflict(_)
            | SelectorError::Unavailable(_)) => ApiError::Unavailable(other.to_string()),
        }
    }
}

impl Selector {
    /// The engine's query for a request: its session scoped to its key ([`binding_key`]).
    pub fn query_of(request: &PlanRequest) -> SelectQuery {
        SelectQuery {
            group: request.group.clone(),
            platform: Some(request.platform),
            service: request.service,
            model: request.model.clone(),
            session_hash: request
                .session_hash
                .as_deref()
                .map(|session| binding_key(request.api_key_id, session)),
            previous_response_id: request.previous_response_id.clone(),
            exclude: request.exclude.clone(),
            max_accounts: 0,
            api_key_id: request.api_key_id,
        }
    }
}

#[async_trait]
impl SelectionApi for Selector {
    async fn check_key(&self, api_key: &str) -> Result<KeyCheck, ApiError> {
        match Selector::check_key(self, api_key) {
            Ok(KeyVerdict::Accepted(record)) => Ok(KeyCheck::Known(Caller::from(*record))),
            Ok(KeyVerdict::Refused(refusal)) => Ok(KeyCheck::Refused(refusal.into())),
            Err(SelectorError::Unauthenticated(_)) => Ok(KeyCheck::Unknown),
            Err(error) => Err(error.into()),
        }
    }

    async fn describe_key(&self, api_key: &str) -> Result<Option<KeyDescription>, ApiError> {
        match Selector::describe_key(self, api_key).await {
            Ok(description) => Ok(Some(description)),
            Err(SelectorError::Unauthenticated(_)) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    async fn plan(&self, request: &PlanRequest) -> Result<Plan, ApiError> {
        match Selector::plan(self, &Selector::query_of(request)).await {
            Ok(plan) => Ok(plan),
            Err(SelectorError::NotFound(_)) => Ok(Plan::for_unknown_group()),
            Err(error) => Err(error.into()),
        }
    }

    async fn report(&self, outcome: Outcome) -> Result<Reported, ApiError> {
        Ok(self.report_outcome(&outcome).await?)
    }

    async fn bind_session(
        &self,
        api_key_id: i64,
        group: &str,
        session: &str,
        account_id: i64,
    ) -> Result<(), ApiError> {
        Selector::bind_session(self, group, &binding_key(api_key_id, session), account_id).await?;
        Ok(())
    }

    async fn bind_response(
        &self,
        api_key_id: i64,
        response_id: &str,
        account_id: i64,
    ) -> Result<(), ApiError> {
        Ok(self
            .bind_response_for_key(api_key_id, response_id, account_id)
            .await?)
    }

    async fn record_usage(&self, records: Vec<UsageRecord>) -> Result<(), ApiError> {
        Selector::record_usage(self, records).await?;
        Ok(())
    }

    async fn record_windows(
        &self,
        account_id: i64,
        readings: Vec<WindowReading>,
    ) -> Result<(), ApiError> {
        Ok(Selector::record_windows(self, account_id, readings).await?)
    }

    async fn models(&self, group: &str, platform: Platform) -> Result<Vec<String>, ApiError> {
        Ok(Selector::models(self, group, platform))
    }
}
