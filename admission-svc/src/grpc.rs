//! The gRPC transport: decode and validate proto messages (the conversions of
//! `poolgate_proto::convert`), call the engine, encode the answer. The only module of this
//! service that touches generated proto types.

use std::collections::HashMap;
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
use poolgate_core::lease::{ChannelRequest, ChannelTag};
use poolgate_core::money::micros_to_usd;
use poolgate_lease::LeaseEngine;
use poolgate_lease::channel::{
    CHANNEL_QUEUE, ChannelInbound, ChannelItem, ChannelSettings, Said, serve_channel,
};
use poolgate_lease::error::LeaseError;
use poolgate_lease::session::{ClientMessage, Inbound, serve_lease};

/// Most accounts one `Inflight` call may read.
pub const MAX_INFLIGHT_ACCOUNTS: usize = 1000;

pub struct AdmissionGrpc {
    admission: Arc<LeaseEngine>,
    channel: ChannelSettings,
}

impl AdmissionGrpc {
    pub fn new(admission: Arc<LeaseEngine>, channel: ChannelSettings) -> Self {
        AdmissionGrpc { admission, channel }
    }
}

/// A lease channel message as the channel server reads it: validated as a lease stream's (bad
/// input in the conversation's request names its field), a malformed channel message fails the
/// channel. A message that opens a conversation (`Acquire`, `Resume`) with the trace context of
/// its request gets the conversation's span, a child of that request's span: one client request
/// is one trace on the channel as on a `Lease` stream.
fn channel_inbound(item: Result<pb::ChannelRequest, Status>) -> ChannelInbound {
    match item {
        Ok(mut request) => {
            let carried = std::mem::take(&mut request.trace_context);
            match convert::channel_request(request) {
                Ok((tag, asked)) => {
                    let opens = matches!(
                        asked,
                        Ok(ChannelRequest::Message(
                            ClientMessage::Acquire { .. } | ClientMessage::Resume { .. }
                        ))
                    );
                    let span = if opens && !carried.is_empty() {
                        conversation_span(tag, &carried)
                    } else {
                        tracing::Span::none()
                    };
                    ChannelInbound::Tagged {
                        tag,
                        asked: asked.map_err(invalid),
                        span,
                    }
                }
                Err(error) => ChannelInbound::Malformed(invalid(error)),
            }
        }
        // The holder's side broke (reset, cancelled, bad frame): every conversation is gone.
        Err(_) => ChannelInbound::Broken,
    }
}

/// The span one lease conversation runs in: named as a `Lease` stream's server span (the
/// conversation is exactly one), parented on the request's carried trace context.
fn conversation_span(tag: ChannelTag, carried: &HashMap<String, String>) -> tracing::Span {
    let span = tracing::info_span!(
        "grpc.server",
        rpc.method = "/poolgate.admission.v1.Admission/LeaseChannel",
        lease.tag = tag.get(),
    );
    poolgate_rpc::telemetry::span_with_parent(&span, carried);
    span
}

/// One conversation's item as the channel's wire message; an error carries the code a lease
/// stream would have ended with (`error::status`, the one map).
fn channel_event(item: ChannelItem) -> pb::ChannelEvent {
    match item.said {
        Said::Event(event) => convert::channel_event(item.tag, event),
        Said::Error(error) => {
            let status = status(error);
            convert::channel_error(item.tag, status.code() as i32, status.message().to_owned())
        }
        Said::End => convert::channel_end(item.tag),
    }
}

fn account_id(field: &'static str, id: i64) -> Result<AccountId, LeaseError> {
    convert::account_id(field, id).map_err(invalid)
}

fn spend(field: &'static str, usd: f64) -> Result<i64, LeaseError> {
    convert::spend_micros(field, usd).map_err(invalid)
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::LeaseEvent, Status>> + Send>>;
type ChannelEvents = Pin<Box<dyn Stream<Item = Result<pb::ChannelEvent, Status>> + Send>>;

#[tonic::async_trait]
impl pb::admission_server::Admission for AdmissionGrpc {
    type LeaseStream = EventStream;
    type LeaseChannelStream = ChannelEvents;

    async fn lease_channel(
        &self,
        request: Request<Streaming<pb::ChannelRequest>>,
    ) -> Result<Response<Self::LeaseChannelStream>, Status> {
        let inbound = request.into_inner().map(channel_inbound);
        let (sender, receiver) = mpsc::channel(CHANNEL_QUEUE);
        tokio::spawn(serve_channel(
            self.admission.clone(),
            Box::pin(inbound),
            sender,
            self.channel,
        ));
        let events = ReceiverStream::new(receiver).map(|item| match item {
            Ok(item) => Ok(channel_event(item)),
            Err(error) => Err(status(error)),
        });
        Ok(Response::new(Box::pin(events)))
    }

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
