//! [`SelectionApi`] over the selector's gRPC API: plans decoded strictly (an entry the relay
//! cannot read is a backend error, never a guess), success reports and usage-window readings
//! coalesced per account, other outcomes sent at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::account::Platform;
use poolgate_core::api::ApiError;
use poolgate_core::caller::{Caller, KeyCheck, KeyRefused, RefusedFor};
use poolgate_core::keys::KeyDescription;
use poolgate_core::outcome::{Outcome, OutcomeClass};
use poolgate_core::windows::WindowReading;
use poolgate_proto::convert::keys::KEY_REFUSAL_METADATA;
use poolgate_proto::convert::{self, ConvertError};
use poolgate_proto::selector::v1 as spb;
use poolgate_proto::selector::v1::selector_client::SelectorClient;
use poolgate_rpc::service_auth::WithToken;
use poolgate_select::api::{Applied, Plan, PlanRequest, Reported, SelectionApi, UsageRecord};
use poolgate_select::engine::binding_key;
use tonic::transport::Channel;

use crate::error::{CallError, api_error};
use crate::throttle::Throttle;
use crate::{Traced, traced};

/// The selector over gRPC.
pub struct RemoteSelection {
    client: SelectorClient<Traced>,
    report_failures: Arc<Throttle>,
    /// Successes waiting to be reported, per account (the last status). Most outcomes are
    /// successes and most change nothing, so they are coalesced: at most one report per account
    /// every `SUCCESS_FLUSH`, instead of a call per request. Any other outcome of an account
    /// sends that account's pending success first, so the selector sees them in order.
    successes: Arc<Mutex<HashMap<i64, u16>>>,
    /// Usage-window readings waiting to be recorded, per account: the latest answer's replace
    /// the ones before (they describe the same windows, later). Sent with the success reports,
    /// in one `RecordWindows` call per flush.
    windows: Arc<Mutex<PendingWindows>>,
}

type PendingWindows = HashMap<i64, Vec<WindowReading>>;

/// How often coalesced success reports are sent (a breaker probe's success closes the breaker
/// this much later at most).
const SUCCESS_FLUSH: Duration = Duration::from_millis(50);

impl RemoteSelection {
    pub fn new(
        channel: WithToken<Channel>,
        grpc_metrics: &poolgate_rpc::grpc_metrics::GrpcMetrics,
        window_writes: prometheus::IntCounterVec,
    ) -> Self {
        let client = SelectorClient::new(traced(channel, grpc_metrics));
        let successes = Arc::new(Mutex::new(HashMap::new()));
        let windows = Arc::new(Mutex::new(HashMap::new()));
        let report_failures = Arc::new(Throttle::new(Duration::from_secs(5)));
        tokio::spawn(flush_successes(
            client.clone(),
            Arc::downgrade(&successes),
            report_failures.clone(),
            WindowFlush {
                pending: Arc::downgrade(&windows),
                writes: window_writes,
                failures: Throttle::new(Duration::from_secs(5)),
            },
        ));
        RemoteSelection {
            client,
            report_failures,
            successes,
            windows,
        }
    }
}

impl RemoteSelection {
    /// The selector's client (the view stream opens on it).
    pub(crate) fn client(&self) -> SelectorClient<Traced> {
        self.client.clone()
    }
}

fn success_report(account_id: i64, status: u16) -> spb::ReportOutcomeRequest {
    spb::ReportOutcomeRequest::from(&Outcome::new(account_id, OutcomeClass::Success, status))
}

/// The usage-window half of the flush: what is pending, and how the calls went.
struct WindowFlush {
    pending: Weak<Mutex<PendingWindows>>,
    /// relay_window_writes_total{outcome}
    writes: prometheus::IntCounterVec,
    failures: Throttle,
}

impl WindowFlush {
    /// Sends every account's pending readings: one call (more only past the per-call bound of
    /// accounts). A failed call drops its batch: the readings are stale by the time a retry
    /// could land, and the accounts' next answers report them again.
    async fn send(&self, client: &SelectorClient<Traced>) {
        let Some(pending) = self.pending.upgrade() else {
            return;
        };
        let taken = std::mem::take(&mut *pending.lock().unwrap_or_else(|p| p.into_inner()));
        drop(pending);
        let mut accounts: Vec<(i64, Vec<WindowReading>)> = taken
            .into_iter()
            .map(|(account_id, mut readings)| {
                readings.truncate(convert::MAX_WINDOW_READINGS);
                (account_id, readings)
            })
            .collect();
        while !accounts.is_empty() {
            let rest = accounts.split_off(accounts.len().min(convert::MAX_WINDOW_ACCOUNTS));
            let batch = std::mem::replace(&mut accounts, rest);
            let count = batch.len();
            match client
                .clone()
                .record_windows(convert::windows_request(batch))
                .await
            {
                Ok(_) => self.writes.with_label_values(&["sent"]).inc(),
                Err(status) => {
                    self.writes.with_label_values(&["failed"]).inc();
                    if let Some(held_back) = self.failures.allow() {
                        tracing::warn!(accounts = count, code = ?status.code(), held_back, "usage windows not recorded; dropped until the next answers (held_back: failures not logged since the last line)");
                    }
                }
            }
        }
    }
}

/// Sends the coalesced success reports and usage-window readings every `SUCCESS_FLUSH` (ends
/// with the selection).
async fn flush_successes(
    client: SelectorClient<Traced>,
    successes: Weak<Mutex<HashMap<i64, u16>>>,
    failures: Arc<Throttle>,
    windows: WindowFlush,
) {
    loop {
        tokio::time::sleep(SUCCESS_FLUSH).await;
        let Some(successes) = successes.upgrade() else {
            return;
        };
        let pending: Vec<(i64, u16)> =
            std::mem::take(&mut *successes.lock().unwrap_or_else(|p| p.into_inner()))
                .into_iter()
                .collect();
        drop(successes);
        for (account_id, status) in pending {
            if let Err(status) = client
                .clone()
                .report_outcome(success_report(account_id, status))
                .await
                && let Some(held_back) = failures.allow()
            {
                tracing::warn!(account_id, code = ?status.code(), held_back, "outcome report failed (held_back: failures not logged since the last line)");
            }
        }
        windows.send(&client).await;
    }
}

impl RemoteSelection {
    /// Sends a non-success outcome, after a success of the account held back for coalescing
    /// (in order: it happened first).
    async fn send_report(&self, outcome: &Outcome) -> Result<spb::ReportOutcomeResponse, ApiError> {
        let pending_success = self
            .successes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&outcome.account_id);
        if let Some(success_status) = pending_success {
            let _ = self
                .client
                .clone()
                .report_outcome(success_report(outcome.account_id, success_status))
                .await;
        }
        match self
            .client
            .clone()
            .report_outcome(spb::ReportOutcomeRequest::from(outcome))
            .await
        {
            Ok(answer) => Ok(answer.into_inner()),
            Err(status) => {
                if let Some(held_back) = self.report_failures.allow() {
                    tracing::warn!(account_id = outcome.account_id, code = ?status.code(), held_back, "outcome report failed (held_back: failures not logged since the last line)");
                }
                Err(api_error(status))
            }
        }
    }
}

/// A key the selector refuses as a whole: `PERMISSION_DENIED` whose `poolgate-key-refusal`
/// entry names why (`disabled`, `expired`); the status message, the selector's words for it, is
/// what the client reads. A refusal without a reason this relay knows is the selector's error,
/// never a guess.
fn key_refusal(status: &tonic::Status) -> Result<KeyRefused, CallError> {
    let reason = status
        .metadata()
        .get(KEY_REFUSAL_METADATA)
        .and_then(|value| value.to_str().ok());
    let reason = match reason {
        Some("disabled") => RefusedFor::Disabled,
        Some("expired") => RefusedFor::Expired,
        other => {
            tracing::warn!(reason = ?other, "the selector refused a key for a reason this relay cannot read; treated as a selector error");
            return Err(CallError::from(status.clone()));
        }
    };
    Ok(KeyRefused {
        reason,
        message: status.message().to_owned(),
    })
}

/// The caller of a key `Authenticate` accepted. Lists or limits this relay cannot read are the
/// selector's error (with a log line), never a key without them: that would lift them.
fn known_caller(answer: spb::AuthenticateResponse) -> Result<Caller, CallError> {
    let unreadable = |error: ConvertError| {
        tracing::warn!(%error, "the selector's key answer is unreadable; treated as a selector error");
        CallError::from(error)
    };
    let access = convert::keys::authenticated_access(&answer).map_err(unreadable)?;
    let limits = convert::keys::authenticated_limits(&answer).map_err(unreadable)?;
    Ok(Caller {
        api_key_id: answer.api_key_id,
        user: answer.user,
        group: answer.group,
        user_rpm_limit: answer.user_rpm_limit,
        access,
        limits,
    })
}

fn platform_pb(platform: Platform) -> i32 {
    spb::Platform::from(platform) as i32
}

#[async_trait]
impl SelectionApi for RemoteSelection {
    async fn check_key(&self, api_key: &str) -> Result<KeyCheck, ApiError> {
        match self
            .client
            .clone()
            .authenticate(spb::AuthenticateRequest {
                api_key: api_key.to_owned(),
            })
            .await
        {
            Ok(answer) => Ok(known_caller(answer.into_inner()).map(KeyCheck::Known)?),
            Err(status) if status.code() == tonic::Code::PermissionDenied => {
                Ok(key_refusal(&status).map(KeyCheck::Refused)?)
            }
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::Unauthenticated | tonic::Code::InvalidArgument
                ) =>
            {
                Ok(KeyCheck::Unknown)
            }
            Err(status) => Err(api_error(status)),
        }
    }

    async fn describe_key(&self, api_key: &str) -> Result<Option<KeyDescription>, ApiError> {
        let answer = self
            .client
            .clone()
            .describe_key(spb::DescribeKeyRequest {
                api_key: api_key.to_owned(),
            })
            .await;
        match answer {
            Ok(answer) => KeyDescription::try_from(answer.into_inner())
                .map(Some)
                .map_err(|error| {
                    tracing::warn!(%error, "the selector's key description is unreadable; treated as a selector error");
                    CallError::from(error).into()
                }),
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::Unauthenticated | tonic::Code::InvalidArgument
                ) =>
            {
                Ok(None)
            }
            Err(status) => Err(api_error(status)),
        }
    }

    async fn plan(&self, request: &PlanRequest) -> Result<Plan, ApiError> {
        let answer = self
            .client
            .clone()
            .select(convert::select_request(
                request,
                // The wire carries the binding's name, scoped by the engine's rule.
                request
                    .session_hash
                    .as_deref()
                    .map(|session| binding_key(request.api_key_id, session)),
            ))
            .await;
        let answer = match answer {
            Ok(answer) => answer.into_inner(),
            // The selector's encoding of an unknown group's plan (its proto).
            Err(status) if status.code() == tonic::Code::NotFound => {
                return Ok(Plan::for_unknown_group());
            }
            Err(status) => return Err(api_error(status)),
        };
        Plan::try_from(answer).map_err(|error| {
            tracing::warn!(%error, "the selector's plan is unreadable; treated as a selector error");
            CallError::from(error).into()
        })
    }

    async fn report(&self, outcome: Outcome) -> Result<Reported, ApiError> {
        if outcome.class == OutcomeClass::Success {
            self.successes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(outcome.account_id, outcome.status);
            return Ok(Reported::Applied(Applied::NONE));
        }
        let answer = self.send_report(&outcome).await?;
        let block_ms = answer.block_ms;
        match convert::read_report_answer(answer) {
            Ok((_, Some(fresh))) => Ok(Reported::Refreshed(fresh)),
            Ok((what, None)) => Ok(Reported::Applied(Applied { what, block_ms })),
            Err(error) => {
                tracing::warn!(account_id = outcome.account_id, %error, "the selector's report answer is unreadable");
                Err(CallError::from(error).into())
            }
        }
    }

    async fn bind_session(
        &self,
        api_key_id: i64,
        group: &str,
        session: &str,
        account_id: i64,
    ) -> Result<(), ApiError> {
        let request = spb::BindSessionRequest {
            group: group.to_owned(),
            session_hash: binding_key(api_key_id, session),
            account_id,
        };
        self.client
            .clone()
            .bind_session(request)
            .await
            .map_err(api_error)?;
        Ok(())
    }

    async fn bind_response(
        &self,
        api_key_id: i64,
        response_id: &str,
        account_id: i64,
    ) -> Result<(), ApiError> {
        let request = spb::BindResponseRequest {
            response_id: response_id.to_owned(),
            account_id,
            api_key_id,
        };
        self.client
            .clone()
            .bind_response(request)
            .await
            .map_err(api_error)?;
        Ok(())
    }

    async fn record_usage(&self, records: Vec<UsageRecord>) -> Result<(), ApiError> {
        let records = records.into_iter().map(spb::UsageRecord::from).collect();
        self.client
            .clone()
            .record_usage(spb::RecordUsageRequest { records })
            .await
            .map_err(api_error)?;
        Ok(())
    }

    async fn record_windows(
        &self,
        account_id: i64,
        readings: Vec<WindowReading>,
    ) -> Result<(), ApiError> {
        // Answers of one flush period merge as the store merges them: a late answer's older
        // figures never replace a later one's.
        let mut pending = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        poolgate_core::windows::merge_readings(pending.entry(account_id).or_default(), &readings);
        Ok(())
    }

    async fn models(&self, group: &str, platform: Platform) -> Result<Vec<String>, ApiError> {
        let answer = self
            .client
            .clone()
            .list_models(spb::ListModelsRequest {
                group: group.to_owned(),
                platform: platform_pb(platform),
            })
            .await
            .map_err(api_error)?;
        Ok(answer.into_inner().models)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(reason: Option<&'static str>) -> tonic::Status {
        let mut status = tonic::Status::permission_denied("this API key is disabled");
        if let Some(reason) = reason {
            status.metadata_mut().insert(
                KEY_REFUSAL_METADATA,
                tonic::metadata::MetadataValue::from_static(reason),
            );
        }
        status
    }

    #[test]
    fn a_refused_key_reads_its_reason_from_the_metadata_and_its_words_from_the_message() {
        assert_eq!(
            key_refusal(&denied(Some("disabled"))).expect("readable"),
            KeyRefused {
                reason: RefusedFor::Disabled,
                message: "this API key is disabled".into(),
            }
        );
        assert_eq!(
            key_refusal(&denied(Some("expired")))
                .expect("readable")
                .reason,
            RefusedFor::Expired
        );
        for unreadable in [None, Some("suspended")] {
            let error = key_refusal(&denied(unreadable)).expect_err("not a guess");
            assert!(
                matches!(
                    error,
                    CallError::Status {
                        code: tonic::Code::PermissionDenied,
                        ..
                    }
                ),
                "{error:?}"
            );
        }
    }
    #[test]
    fn a_keys_limits_are_read_strictly_and_an_unreadable_one_is_a_selector_error() {
        let answer = spb::AuthenticateResponse {
            api_key_id: 7,
            user: "alice".into(),
            group: "default".into(),
            key_concurrency_limit: 2,
            key_tpm_limit: 1000,
            key_budget_day_usd: 1.5,
            ..spb::AuthenticateResponse::default()
        };
        let caller = known_caller(answer.clone()).expect("readable");
        assert_eq!(caller.limits.concurrency_limit, 2);
        assert_eq!(caller.limits.tpm_limit, 1000);
        assert_eq!(caller.limits.budget_day_micros, 1_500_000);
        let terms = caller.key_limits().expect("a key with limits");
        assert_eq!(terms.api_key_id, 7, "the key's own id goes with its limits");
        let none = known_caller(spb::AuthenticateResponse {
            api_key_id: 8,
            ..spb::AuthenticateResponse::default()
        })
        .expect("readable");
        assert_eq!(
            none.key_limits(),
            None,
            "a key without limits leases as before"
        );
        for unreadable in [
            spb::AuthenticateResponse {
                key_tpm_limit: -1,
                ..answer.clone()
            },
            spb::AuthenticateResponse {
                key_budget_month_usd: f64::NAN,
                ..answer.clone()
            },
        ] {
            let error = known_caller(unreadable).expect_err("not a key without limits");
            assert!(matches!(error, CallError::Convert(_)), "{error:?}");
        }
    }
}
