//! The relay's `Selection` over the selector engine in this process: the same calls the
//! selector's gRPC layer makes for a remote relay, without the network in between.

use std::sync::Arc;

use async_trait::async_trait;
use poolgate_core::account::{Platform, Secret};
use poolgate_core::classify::Classified;
use poolgate_core::keys::KeyDescription;
use poolgate_core::outcome::Outcome;
use poolgate_core::select::NoneReason;
use poolgate_core::short_hash;
use poolgate_core::windows::WindowReading;
use poolgate_select::engine::{
    EngineTasks, KeyVerdict, Reported, SelectQuery, Selector, SelectorError,
};

use crate::ports::{BackendError, Caller, KeyCheck, Plan, PlanRequest, Selection, UsageRecord};
use crate::session::binding_key;
use crate::usage_sink::UsageSink;

pub struct InProcessSelection {
    selector: Arc<Selector>,
    usage: UsageSink,
    /// The engine's background tasks, stopped with the relay that holds this.
    _tasks: EngineTasks,
}

impl InProcessSelection {
    pub fn new(selector: Arc<Selector>, usage: UsageSink, tasks: EngineTasks) -> Self {
        InProcessSelection {
            selector,
            usage,
            _tasks: tasks,
        }
    }

    /// The same outcome the selector's gRPC layer builds from a remote relay's report.
    async fn apply(
        &self,
        account_id: i64,
        outcome: &Classified,
        status: u16,
        reason: &str,
        refused: Option<&Secret>,
    ) -> Option<Reported> {
        let applied = self
            .selector
            .report_outcome(&Outcome {
                reset_at_ms: outcome.reset_at_ms,
                reason: reason.to_owned(),
                refused_fingerprint: refused.map(|credential| short_hash(credential.expose())),
                before_send: status == 0 && outcome.is_connect_failure(),
                ..Outcome::new(account_id, outcome.class, status)
            })
            .await;
        match applied {
            Ok(reported) => Some(reported),
            Err(error) => {
                tracing::warn!(account_id, %error, "outcome not applied");
                None
            }
        }
    }
}

/// The engine's error, kept as it is (the relay decides on its variant, never on a string).
fn unavailable(error: SelectorError) -> BackendError {
    BackendError::Selection(error)
}

#[async_trait]
impl Selection for InProcessSelection {
    async fn check_key(&self, api_key: &str) -> Result<KeyCheck, BackendError> {
        // The engine judges the key, as it does for the selector's `Authenticate`.
        match self.selector.check_key(api_key) {
            Ok(KeyVerdict::Accepted(record)) => {
                let record = *record;
                Ok(KeyCheck::Known(Caller {
                    api_key_id: record.id,
                    user: record.user,
                    group: record.group,
                    user_rpm_limit: record.user_rpm_limit,
                    access: record.access,
                    limits: record.limits,
                }))
            }
            Ok(KeyVerdict::Refused(refusal)) => Ok(KeyCheck::Refused(refusal.into())),
            Err(SelectorError::Unauthenticated(_)) => Ok(KeyCheck::Unknown),
            Err(error) => Err(unavailable(error)),
        }
    }

    async fn describe_key(&self, api_key: &str) -> Result<Option<KeyDescription>, BackendError> {
        match self.selector.describe_key(api_key).await {
            Ok(description) => Ok(Some(description)),
            Err(SelectorError::Unauthenticated(_)) => Ok(None),
            Err(error) => Err(unavailable(error)),
        }
    }

    async fn select(&self, request: &PlanRequest) -> Result<Plan, BackendError> {
        let query = SelectQuery {
            group: request.group.clone(),
            platform: Some(request.platform),
            model: request.model.clone(),
            session_hash: request
                .session_hash
                .as_deref()
                .map(|session| binding_key(request.api_key_id, session)),
            previous_response_id: request.previous_response_id.clone(),
            exclude: request.exclude.clone(),
            max_accounts: 0,
            api_key_id: request.api_key_id,
        };
        match self.selector.plan(&query).await {
            Ok(plan) => Ok(plan),
            // A group without accounts is not an error to the client: nothing to serve it.
            Err(SelectorError::NotFound(_)) => Ok(Plan {
                none_reason: Some(NoneReason::NoAccounts),
                ..Plan::default()
            }),
            Err(error) => Err(unavailable(error)),
        }
    }

    async fn report(&self, account_id: i64, outcome: Classified, status: u16, reason: &str) {
        self.apply(account_id, &outcome, status, reason, None).await;
    }

    async fn report_refused(
        &self,
        account_id: i64,
        outcome: Classified,
        status: u16,
        reason: &str,
        refused: &Secret,
    ) -> Option<Secret> {
        match self
            .apply(account_id, &outcome, status, reason, Some(refused))
            .await?
        {
            Reported::Refreshed(fresh) => Some(fresh),
            Reported::Applied(_) => None,
        }
    }

    async fn bind_session(
        &self,
        group: &str,
        api_key_id: i64,
        session_hash: &str,
        account_id: i64,
    ) {
        if let Err(error) = self
            .selector
            .bind_session(group, &binding_key(api_key_id, session_hash), account_id)
            .await
        {
            tracing::debug!(%error, "session binding not written");
        }
    }

    async fn bind_response(&self, api_key_id: i64, response_id: &str, account_id: i64) {
        if let Err(error) = self
            .selector
            .bind_response_for_key(api_key_id, response_id, account_id)
            .await
        {
            tracing::debug!(%error, "response binding not written");
        }
    }

    fn record_usage(&self, record: UsageRecord) {
        self.usage.record(record);
    }

    fn record_windows(&self, account_id: i64, readings: Vec<WindowReading>) {
        let selector = self.selector.clone();
        // On its own task: the request that read them never waits for the store.
        tokio::spawn(async move {
            if let Err(error) = selector.record_windows(account_id, readings).await {
                tracing::debug!(account_id, %error, "usage windows not recorded");
            }
        });
    }

    async fn models(&self, group: &str, platform: Platform) -> Vec<String> {
        self.selector.models(group, platform)
    }
}
