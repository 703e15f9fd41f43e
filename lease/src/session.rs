//! The lease stream protocol (docs/DESIGN.md §4), in domain terms: one lease per stream, from the
//! first `Acquire`/`Resume` to `Release` or the end of the stream. The messages are
//! `poolgate-core`'s (`ClientMessage`, `LeaseEvent`; `poolgate-proto` converts them); this module
//! decides what each one does. The same protocol runs each conversation of a lease channel
//! (`channel`): only where the events go differs ([`EventSink`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::engine::{AcquireOutcome, LeaseEngine};
use crate::error::LeaseError;
use poolgate_core::lease::{
    Denial, DenyReason, LeaseId, LeaseTerms, LostReason, Renewal, Resumption,
};
use poolgate_core::millis;

pub use poolgate_core::lease::{ClientMessage, LeaseEvent};

/// An inbound item: a message, bad input (ends the stream with that error), or a broken stream
/// (the holder went away).
pub enum Inbound {
    Message(ClientMessage),
    Invalid(LeaseError),
    Broken,
}

/// The holder can no longer receive: its stream (or the whole channel) is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

/// Where one lease conversation's answers go: a lease stream's own queue, or one tag of a lease
/// channel (`channel::Tagged`), which writes into the channel's shared queue without a task or a
/// queue of its own.
pub trait EventSink: Clone + Send + Sync + 'static {
    /// Sends an event (or the error that ends the conversation); waits while the holder's queue
    /// is full.
    fn send(
        &self,
        item: Result<LeaseEvent, LeaseError>,
    ) -> impl Future<Output = Result<(), Gone>> + Send;

    /// Sends an informational event only if there is room now (`Queued`).
    fn try_send(&self, event: LeaseEvent);

    /// Resolves once the holder can no longer receive anything.
    fn closed(&self) -> impl Future<Output = ()> + Send;
}

/// A lease stream's own queue (one per `Lease` call).
impl EventSink for mpsc::Sender<Result<LeaseEvent, LeaseError>> {
    async fn send(&self, item: Result<LeaseEvent, LeaseError>) -> Result<(), Gone> {
        mpsc::Sender::send(self, item).await.map_err(|_| Gone)
    }

    fn try_send(&self, event: LeaseEvent) {
        let _ = mpsc::Sender::try_send(self, Ok(event));
    }

    async fn closed(&self) {
        mpsc::Sender::closed(self).await
    }
}

/// Serves one lease stream (or one conversation of a lease channel) to its end.
pub async fn serve_lease(
    admission: Arc<LeaseEngine>,
    mut inbound: impl Stream<Item = Inbound> + Unpin,
    out: impl EventSink,
) {
    let (lease_id, terms, holder_epoch) = match inbound.next().await {
        Some(Inbound::Message(ClientMessage::Acquire { terms, wait })) => {
            match acquire(&admission, &mut inbound, &out, &terms, wait).await {
                Some(lease_id) => (lease_id, terms, 0),
                None => return,
            }
        }
        Some(Inbound::Message(ClientMessage::Resume { lease_id, terms })) => {
            match admission.resume(&lease_id, &terms).await {
                Ok(Resumption::Resumed { holder_epoch }) => (lease_id, terms, holder_epoch),
                Ok(Resumption::Released) => {
                    let lost = LeaseEvent::Lost {
                        reason: LostReason::Released,
                        detail: "the lease was released; it cannot be resumed".into(),
                    };
                    let _ = out.send(Ok(lost)).await;
                    return;
                }
                Ok(Resumption::Unknown) => {
                    let _ = out
                        .send(Ok(LeaseEvent::Denied(Denial::new(
                            DenyReason::LeaseUnknown,
                            0,
                        ))))
                        .await;
                    return;
                }
                Err(error) => {
                    let _ = out.send(Err(LeaseError::Unavailable(error))).await;
                    return;
                }
            }
        }
        Some(Inbound::Message(_)) => {
            let _ = out
                .send(Err(LeaseError::invalid(
                    "kind",
                    "the first message of a lease stream must be acquire or resume",
                )))
                .await;
            return;
        }
        Some(Inbound::Invalid(error)) => {
            let _ = out.send(Err(error)).await;
            return;
        }
        Some(Inbound::Broken) | None => return,
    };

    let ttl = admission.settings().lease_ttl;
    let granted = LeaseEvent::Granted {
        lease_id: lease_id.clone(),
        ttl,
    };
    if out.send(Ok(granted)).await.is_err() {
        admission.orphan(&lease_id, &terms, holder_epoch).await;
        return;
    }
    admission.metrics().leases_in_flight.inc();
    let ended = hold(&admission, &mut inbound, &out, &lease_id, &terms).await;
    admission.metrics().leases_in_flight.dec();
    match ended {
        HoldEnd::Abandoned => admission.orphan(&lease_id, &terms, holder_epoch).await,
        HoldEnd::Lost => admission.forget_held(&lease_id),
        HoldEnd::Released => {}
    }
}

/// Runs the acquire while watching the stream: a holder that goes away cancels the wait. A
/// lease granted to a holder that is gone is released at once.
async fn acquire(
    admission: &Arc<LeaseEngine>,
    inbound: &mut (impl Stream<Item = Inbound> + Unpin),
    out: &impl EventSink,
    terms: &LeaseTerms,
    wait: Duration,
) -> Option<LeaseId> {
    let cancel = CancellationToken::new();
    let queued_out = out.clone();
    let on_queued = move |position| {
        // Best effort: a full channel only drops an informational event.
        queued_out.try_send(LeaseEvent::Queued { position });
    };
    let acquire = admission.acquire(terms, wait, &cancel, on_queued);
    tokio::pin!(acquire);
    let mut protocol_error = None;
    let mut withdrawn = false;
    let outcome = loop {
        tokio::select! {
            outcome = &mut acquire => break outcome,
            message = inbound.next(), if !cancel.is_cancelled() => match message {
                Some(Inbound::Message(ClientMessage::Release { .. })) => {
                    withdrawn = true;
                    cancel.cancel();
                }
                Some(Inbound::Message(_)) => {
                    protocol_error = Some(LeaseError::Protocol(
                        "no message may follow acquire before its answer".into(),
                    ));
                    cancel.cancel();
                }
                Some(Inbound::Invalid(error)) => {
                    protocol_error = Some(error);
                    cancel.cancel();
                }
                Some(Inbound::Broken) | None => cancel.cancel(),
            },
            _ = out.closed(), if !cancel.is_cancelled() => cancel.cancel(),
        }
    };
    match outcome {
        Ok(AcquireOutcome::Granted(lease_id)) if cancel.is_cancelled() => {
            admission.release(&lease_id, Some(terms), 0).await;
            if let Some(error) = protocol_error {
                let _ = out.send(Err(error)).await;
            } else if withdrawn {
                let _ = out.send(Ok(LeaseEvent::Released)).await;
            }
            None
        }
        Ok(AcquireOutcome::Granted(lease_id)) => Some(lease_id),
        Ok(AcquireOutcome::Denied(denial)) => {
            let _ = out.send(Ok(LeaseEvent::Denied(denial))).await;
            None
        }
        Ok(AcquireOutcome::Cancelled) => {
            if let Some(error) = protocol_error {
                let _ = out.send(Err(error)).await;
            } else if withdrawn {
                let _ = out.send(Ok(LeaseEvent::Released)).await;
            }
            None
        }
        Err(error) => {
            let _ = out.send(Err(LeaseError::Unavailable(error))).await;
            None
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum HoldEnd {
    Released,
    /// The stream ended (or broke) without `Release`.
    Abandoned,
    /// The lease could not be renewed for a whole ttl; the holder was told `Lost`.
    Lost,
}

/// Serves heartbeats, attempts and the release of a held lease.
async fn hold(
    admission: &Arc<LeaseEngine>,
    inbound: &mut (impl Stream<Item = Inbound> + Unpin),
    out: &impl EventSink,
    lease_id: &LeaseId,
    terms: &LeaseTerms,
) -> HoldEnd {
    let ttl = admission.settings().lease_ttl;
    let clock = admission.clock();
    let mut renewed_at = clock.now();
    let mut attempts = 0u32;
    loop {
        let message = tokio::select! {
            message = inbound.next() => message,
            _ = out.closed() => return HoldEnd::Abandoned,
        };
        let event = match message {
            Some(Inbound::Message(ClientMessage::Heartbeat)) => {
                match admission
                    .heartbeat(lease_id, terms, clock.since(renewed_at))
                    .await
                {
                    Ok(renewal @ (Renewal::Renewed | Renewal::Restored)) => {
                        renewed_at = clock.now();
                        LeaseEvent::Renewed {
                            ttl,
                            // The backend had lost the lease and the account had room for it.
                            restored: renewal == Renewal::Restored,
                        }
                    }
                    Ok(Renewal::Lost(reason)) => {
                        let detail = match reason {
                            LostReason::Released => "the lease was released".to_owned(),
                            LostReason::NoRoom => {
                                "the backend lost the lease and the account has no room for it"
                                    .to_owned()
                            }
                            LostReason::BackendUnavailable => "the backend is unavailable".into(),
                            LostReason::Expired => {
                                "no heartbeat for a whole ttl: the lease expired".to_owned()
                            }
                        };
                        let _ = out.send(Ok(LeaseEvent::Lost { reason, detail })).await;
                        return HoldEnd::Lost;
                    }
                    // A missed renewal is not fatal while the lease still has time left: the
                    // next heartbeat may get through.
                    Err(error) if renewed_at.elapsed() < ttl => {
                        tracing::warn!(%error, lease_id = %lease_id, "lease renewal failed; will retry on next heartbeat");
                        LeaseEvent::NotRenewed {
                            left: ttl.saturating_sub(renewed_at.elapsed()),
                        }
                    }
                    Err(error) => {
                        admission
                            .metrics()
                            .leases_lost
                            .with_label_values(&[LostReason::BackendUnavailable.as_str()])
                            .inc();
                        let detail =
                            format!("lease could not be renewed for {} ms: {error}", millis(ttl));
                        let lost = LeaseEvent::Lost {
                            reason: LostReason::BackendUnavailable,
                            detail,
                        };
                        let _ = out.send(Ok(lost)).await;
                        return HoldEnd::Lost;
                    }
                }
            }
            Some(Inbound::Message(ClientMessage::Attempt)) => {
                attempts += 1;
                match admission.attempt(lease_id, terms, attempts).await {
                    Ok(None) => LeaseEvent::AttemptAccepted,
                    Ok(Some(denial)) => LeaseEvent::Denied(denial),
                    Err(error) => {
                        tracing::warn!(%error, "attempt charge failed");
                        LeaseEvent::Denied(Denial::new(DenyReason::BackendUnavailable, 0))
                    }
                }
            }
            Some(Inbound::Message(ClientMessage::Release {
                spend_micros,
                tokens,
            })) => {
                admission
                    .release_with(lease_id, Some(terms), spend_micros, tokens)
                    .await;
                let _ = out.send(Ok(LeaseEvent::Released)).await;
                return HoldEnd::Released;
            }
            Some(Inbound::Message(
                ClientMessage::Acquire { .. } | ClientMessage::Resume { .. },
            )) => {
                let _ = out
                    .send(Err(LeaseError::Protocol(
                        "a lease stream holds one lease; open a new stream for another".into(),
                    )))
                    .await;
                return HoldEnd::Abandoned;
            }
            Some(Inbound::Invalid(error)) => {
                let _ = out.send(Err(error)).await;
                return HoldEnd::Abandoned;
            }
            Some(Inbound::Broken) | None => return HoldEnd::Abandoned,
        };
        if out.send(Ok(event)).await.is_err() {
            return HoldEnd::Abandoned;
        }
    }
}
