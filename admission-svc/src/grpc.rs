//! The gRPC transport: decode and validate proto messages (the conversions of
//! `poolgate_proto::convert`), call the engine, encode the answer. The only module of this
//! service that touches generated proto types.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use poolgate_proto::admission::v1 as pb;
use poolgate_proto::convert;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::error::{invalid, status};
use poolgate_core::AccountId;
use poolgate_core::money::micros_to_usd;
use poolgate_lease::LeaseEngine;
use poolgate_lease::error::LeaseError;
use poolgate_lease::session::{ClientMessage, Inbound, serve_lease};

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

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::LeaseEvent, Status>> + Send>>;

#[tonic::async_trait]
impl pb::admission_server::Admission for AdmissionGrpc {
    type LeaseStream = EventStream;

    async fn lease(
        &self,
        request: Request<Streaming<pb::LeaseRequest>>,
    ) -> Result<Response<Self::LeaseStream>, Status> {
        let inbound = request.into_inner().map(|item| match item {
            Ok(message) => match ClientMessage::try_from(message) {
                Ok(message) => Inbound::Message(message),
                Err(error) => Inbound::Invalid(invalid(error)),
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
            Ok(event) => Ok(pb::LeaseEvent::from(event)),
            Err(error) => Err(status(error)),
        });
        Ok(Response::new(Box::pin(events)))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let request = request.into_inner();
        let lease_id =
            convert::lease_id("lease_id", &request.lease_id).map_err(|e| status(invalid(e)))?;
        let spend_micros = spend("spend_usd", request.spend_usd).map_err(status)?;
        let released = self
            .admission
            .release_with(&lease_id, None, spend_micros, request.tokens)
            .await;
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
