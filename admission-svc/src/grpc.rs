//! The gRPC transport: decode and validate proto messages, call the engine, encode the answer.
//! The only module that touches generated proto types.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use poolgate_proto::admission::v1 as pb;
use poolgate_proto::convert::{self, ConvertError};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::error::{invalid, status};
use poolgate_core::AccountId;
use poolgate_core::lease::{LeaseId, LeaseTerms};
use poolgate_core::millis;
use poolgate_core::money::micros_to_usd;
use poolgate_lease::LeaseEngine;
use poolgate_lease::error::LeaseError;
use poolgate_lease::session::{ClientMessage, Inbound, LeaseEvent, serve_lease};

/// Most accounts one `Inflight` call may read.
pub const MAX_INFLIGHT_ACCOUNTS: usize = 1000;

pub struct AdmissionGrpc {
    admission: Arc<LeaseEngine>,
}

impl AdmissionGrpc {
    pub fn new(admission: Arc<LeaseEngine>) -> Self {
        AdmissionGrpc { admission }
    }
}

fn account_id(field: &'static str, id: i64) -> Result<AccountId, LeaseError> {
    convert::account_id(field, id).map_err(invalid)
}

fn spend(field: &'static str, usd: f64) -> Result<i64, LeaseError> {
    convert::spend_micros(field, usd).map_err(invalid)
}

fn lease_id(field: &str, text: &str) -> Result<LeaseId, LeaseError> {
    LeaseId::parse(text).ok_or_else(|| {
        let shown: String = text.chars().take(64).collect();
        LeaseError::invalid(field, format!("not a lease id: {shown:?}"))
    })
}

/// Validates an `Acquire` into lease terms and a wait. `prefix` names the message in errors.
fn terms(acquire: pb::Acquire, prefix: &str) -> Result<(LeaseTerms, Duration), LeaseError> {
    let in_message = |error: ConvertError| {
        LeaseError::invalid(format!("{prefix}.{}", error.field), error.problem)
    };
    let wait = convert::wait(acquire.wait_ms).map_err(in_message)?;
    let terms = LeaseTerms::try_from(acquire).map_err(in_message)?;
    Ok((terms, wait))
}

fn client_message(request: pb::LeaseRequest) -> Result<ClientMessage, LeaseError> {
    use pb::lease_request::Kind;
    match request.kind {
        None => Err(LeaseError::invalid(
            "kind",
            "a lease request must set one of acquire, resume, heartbeat, attempt, release",
        )),
        Some(Kind::Acquire(acquire)) => {
            let (terms, wait) = terms(acquire, "acquire")?;
            Ok(ClientMessage::Acquire { terms, wait })
        }
        Some(Kind::Resume(resume)) => {
            let lease_id = lease_id("resume.lease_id", &resume.lease_id)?;
            let acquire = resume.terms.ok_or_else(|| {
                LeaseError::invalid("resume.terms", "is required (the original acquire)")
            })?;
            let (terms, _) = terms(acquire, "resume.terms")?;
            if terms.account_id != lease_id.account_id() {
                return Err(LeaseError::invalid(
                    "resume.terms.account_id",
                    "does not match the lease id's account",
                ));
            }
            Ok(ClientMessage::Resume { lease_id, terms })
        }
        Some(Kind::Heartbeat(_)) => Ok(ClientMessage::Heartbeat),
        Some(Kind::Attempt(_)) => Ok(ClientMessage::Attempt),
        Some(Kind::Release(release)) => Ok(ClientMessage::Release {
            spend_micros: spend("release.spend_usd", release.spend_usd)?,
        }),
    }
}

fn ttl_ms(ttl: Duration) -> u32 {
    u32::try_from(millis(ttl)).unwrap_or(u32::MAX)
}

fn lease_event(event: LeaseEvent) -> pb::LeaseEvent {
    use pb::lease_event::Kind;
    let kind = match event {
        LeaseEvent::Granted { lease_id, ttl } => Kind::Granted(pb::Granted {
            lease_id: lease_id.to_string(),
            ttl_ms: ttl_ms(ttl),
        }),
        LeaseEvent::Denied(denial) => Kind::Denied(denial.into()),
        LeaseEvent::Queued { position } => Kind::Queued(pb::Queued { position }),
        LeaseEvent::Renewed { ttl, restored } => Kind::Renewed(pb::Renewed {
            ttl_ms: ttl_ms(ttl),
            restored,
        }),
        LeaseEvent::NotRenewed { left } => Kind::NotRenewed(pb::NotRenewed {
            ttl_ms: ttl_ms(left),
        }),
        LeaseEvent::AttemptAccepted => Kind::AttemptAccepted(pb::AttemptAccepted {}),
        LeaseEvent::Released => Kind::Released(pb::Released {}),
        LeaseEvent::Lost { reason, detail } => Kind::Lost(pb::Lost {
            reason: detail,
            lost_reason: pb::LostReason::from(reason) as i32,
        }),
    };
    pb::LeaseEvent { kind: Some(kind) }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::LeaseEvent, Status>> + Send>>;

#[tonic::async_trait]
impl pb::admission_server::Admission for AdmissionGrpc {
    type LeaseStream = EventStream;

    async fn lease(
        &self,
        request: Request<Streaming<pb::LeaseRequest>>,
    ) -> Result<Response<Self::LeaseStream>, Status> {
        let inbound = request.into_inner().map(|item| match item {
            Ok(message) => match client_message(message) {
                Ok(message) => Inbound::Message(message),
                Err(error) => Inbound::Invalid(error),
            },
            // The holder's side broke (reset, cancelled, bad frame): treat as gone.
            Err(_) => Inbound::Broken,
        });
        let (sender, receiver) = mpsc::channel(16);
        tokio::spawn(serve_lease(
            self.admission.clone(),
            Box::pin(inbound),
            sender,
        ));
        let events = ReceiverStream::new(receiver).map(|item| match item {
            Ok(event) => Ok(lease_event(event)),
            Err(error) => Err(status(error)),
        });
        Ok(Response::new(Box::pin(events)))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let request = request.into_inner();
        let lease_id = lease_id("lease_id", &request.lease_id).map_err(status)?;
        let spend_micros = spend("spend_usd", request.spend_usd).map_err(status)?;
        let released = self.admission.release(&lease_id, None, spend_micros).await;
        Ok(Response::new(pb::ReleaseResponse { released }))
    }

    async fn inflight(
        &self,
        request: Request<pb::InflightRequest>,
    ) -> Result<Response<pb::InflightResponse>, Status> {
        let ids = request.into_inner().account_ids;
        if ids.len() > MAX_INFLIGHT_ACCOUNTS {
            return Err(status(LeaseError::invalid(
                "account_ids",
                format!(
                    "at most {MAX_INFLIGHT_ACCOUNTS} accounts per call, got {}",
                    ids.len()
                ),
            )));
        }
        for &id in &ids {
            account_id("account_ids", id).map_err(status)?;
        }
        let counts = self
            .admission
            .inflight(&ids)
            .await
            .map_err(|error| status(LeaseError::Unavailable(error)))?;
        let accounts = ids
            .into_iter()
            .zip(counts)
            .map(|(account_id, inflight)| pb::AccountInflight {
                account_id,
                inflight,
            })
            .collect();
        Ok(Response::new(pb::InflightResponse { accounts }))
    }

    async fn record_spend(
        &self,
        request: Request<pb::RecordSpendRequest>,
    ) -> Result<Response<pb::RecordSpendResponse>, Status> {
        let request = request.into_inner();
        let account = account_id("account_id", request.account_id).map_err(status)?;
        let micros = spend("usd", request.usd).map_err(status)?;
        let total = self
            .admission
            .record_spend(account, micros)
            .await
            .map_err(|error| status(LeaseError::Unavailable(error)))?;
        Ok(Response::new(pb::RecordSpendResponse {
            window_spend_usd: micros_to_usd(total),
        }))
    }
}
