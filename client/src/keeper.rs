//! The keeper of a granted lease: the task that owns its conversation (heartbeats every ttl/3,
//! attempts, release, `Resume` on another replica when the conversation breaks), on a lease
//! channel or a `Lease` stream alike, and the [`Lease`] handle the request holds, which talks to
//! it by commands.

use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::lease::{LeaseTerms, LostReason};
use poolgate_proto::admission::v1 as apb;
use poolgate_proto::convert::EnumField;
use tokio::sync::{mpsc, oneshot, watch};

use crate::error::CallError;
use crate::leases::{Events, Link, Requests, TraceContext, acquire_pb, message};
use crate::metrics::Metrics;
use poolgate_lease::api::Lease;

/// Starts the keeper of a lease admission just granted on `events`; the returned handle is the
/// holder's.
pub(super) fn spawn(
    link: Link,
    terms: LeaseTerms,
    granted: apb::Granted,
    sender: Requests,
    events: Events,
    metrics: Metrics,
    trace: TraceContext,
) -> RemoteLease {
    let (commands, receiver) = mpsc::channel(4);
    let (lost, lost_signal) = watch::channel(false);
    let keeper = Keeper {
        link,
        terms,
        lease_id: granted.lease_id,
        ttl: Duration::from_millis(u64::from(granted.ttl_ms.max(300))),
        metrics,
        lost,
        trace,
    };
    tokio::spawn(keeper.run(sender, events, receiver));
    RemoteLease {
        commands: Some(commands),
        lost: lost_signal,
    }
}

enum Command {
    Attempt(oneshot::Sender<bool>),
    /// The spend and the tokens (see `Lease::release`).
    Release(f64, u64, oneshot::Sender<()>),
}

/// Owns one lease conversation: heartbeats, attempts, release, and resume when it breaks.
struct Keeper {
    link: Link,
    terms: LeaseTerms,
    lease_id: String,
    ttl: Duration,
    metrics: Metrics,
    /// Set when the lease is gone for good (see `Lease::lost`).
    lost: watch::Sender<bool>,
    /// The request's trace context, sent with the resumes and the release.
    trace: TraceContext,
}

impl Keeper {
    async fn run(self, sender: Requests, events: Events, mut commands: mpsc::Receiver<Command>) {
        let mut stream = Some((sender, events));
        let mut heartbeat = tokio::time::interval(self.ttl / 3);
        heartbeat.tick().await;
        loop {
            let Some((sender, events)) = stream.as_mut() else {
                // No stream: the lease is lost; serve commands so the request finishes anyway.
                match commands.recv().await {
                    Some(Command::Attempt(reply)) => {
                        let _ = reply.send(true);
                    }
                    Some(Command::Release(spend, tokens, reply)) => {
                        // No stream carried this release: the unary one keeps the spend.
                        let _ = self
                            .link
                            .client
                            .clone()
                            .release(apb::ReleaseRequest {
                                lease_id: self.lease_id.clone(),
                                spend_usd: spend_usd(spend),
                                tokens,
                            })
                            .await;
                        let _ = reply.send(());
                        return;
                    }
                    None => return,
                }
                continue;
            };
            tokio::select! {
                _ = heartbeat.tick() => {
                    if sender.send(message(apb::lease_request::Kind::Heartbeat(apb::Heartbeat {}))).await.is_err() {
                        stream = self.resume().await;
                    }
                }
                event = events.next() => match event {
                    Some(Ok(apb::LeaseEvent { kind: Some(apb::lease_event::Kind::Renewed(_)) })) => {}
                    Some(Ok(apb::LeaseEvent { kind: Some(apb::lease_event::Kind::Lost(lost)) })) => {
                        stream = self.lost(lost.lost_reason).await;
                    }
                    Some(Err(_)) | None => {
                        stream = self.resume().await;
                    }
                    Some(Ok(_)) => {}
                },
                command = commands.recv() => {
                    let (kind, reply) = match command {
                        Some(Command::Attempt(reply)) => (apb::lease_request::Kind::Attempt(apb::Attempt {}), Reply::Attempt(reply)),
                        Some(Command::Release(spend, tokens, reply)) => (
                            apb::lease_request::Kind::Release(apb::Release { spend_usd: spend_usd(spend), tokens }),
                            Reply::Release(reply, spend_usd(spend), tokens),
                        ),
                        // The holder dropped the lease without releasing: release it now.
                        None => (apb::lease_request::Kind::Release(apb::Release { spend_usd: 0.0, tokens: 0 }), Reply::Dropped),
                    };
                    let sent = sender.send_traced(message(kind), &self.trace).await.is_ok();
                    let answer = if sent { self.await_answer(events).await } else { None };
                    match reply {
                        Reply::Attempt(reply) => {
                            // Unknown (stream trouble) counts as accepted: the request goes on.
                            let _ = reply.send(!matches!(answer, Some(Answer::Refused)));
                            if let Some(Answer::Lost(reason)) = answer {
                                stream = self.lost(reason).await;
                            }
                        }
                        Reply::Release(reply, spend, tokens) => {
                            if !matches!(answer, Some(Answer::Accepted)) {
                                // A release that went out on the stream without an answer may
                                // have landed with its spend; one that never went out, or that
                                // the stream's `Lost` overtook, did not: the unary one carries it.
                                let landed_maybe = sent && answer.is_none();
                                let (spend_usd, tokens) = if landed_maybe { (0.0, 0) } else { (spend, tokens) };
                                let _ = self.link.client.clone().release(apb::ReleaseRequest { lease_id: self.lease_id.clone(), spend_usd, tokens }).await;
                            }
                            let _ = reply.send(());
                            return;
                        }
                        Reply::Dropped => {
                            if !matches!(answer, Some(Answer::Accepted)) {
                                let _ = self.link.client.clone().release(apb::ReleaseRequest { lease_id: self.lease_id.clone(), spend_usd: 0.0, tokens: 0 }).await;
                            }
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Reads events until the answer to the last command (heartbeat answers are skipped).
    async fn await_answer(&self, events: &mut Events) -> Option<Answer> {
        loop {
            match tokio::time::timeout(Duration::from_secs(5), events.next()).await {
                Ok(Some(Ok(apb::LeaseEvent { kind: Some(kind) }))) => match kind {
                    apb::lease_event::Kind::Renewed(_)
                    | apb::lease_event::Kind::NotRenewed(_)
                    | apb::lease_event::Kind::Queued(_) => {
                        continue;
                    }
                    apb::lease_event::Kind::AttemptAccepted(_)
                    | apb::lease_event::Kind::Released(_) => return Some(Answer::Accepted),
                    apb::lease_event::Kind::Denied(_) => return Some(Answer::Refused),
                    apb::lease_event::Kind::Lost(lost) => {
                        return Some(Answer::Lost(lost.lost_reason));
                    }
                    _ => return None,
                },
                _ => return None,
            }
        }
    }

    /// Admission answered `Lost`. A released lease, or one the backend lost with no room left
    /// for it, is not resumed (resuming would take a slot that went to someone else); the
    /// request finishes anyway. A backend outage is resumed elsewhere.
    async fn lost(&self, lost_reason: i32) -> Option<(Requests, Events)> {
        let reason = match LostReason::decode("lost.lost_reason", lost_reason) {
            Ok(reason) => reason,
            // An older admission sends no reason: the proto says it only ever meant an outage.
            Err(_) if lost_reason == apb::LostReason::Unspecified as i32 => {
                LostReason::BackendUnavailable
            }
            // A reason this relay does not know yet. Resuming is the side that cannot over-admit
            // (a resume never re-adds a lease: one that is gone answers `Lost` or a denial),
            // where giving up would cut a lease that may still be live.
            Err(error) => {
                tracing::warn!(lease_id = %self.lease_id, %error, "lease lost for a reason this relay does not know; resuming it");
                LostReason::BackendUnavailable
            }
        };
        if reason == LostReason::BackendUnavailable {
            return self.resume().await;
        }
        let label = reason.as_str();
        tracing::warn!(lease_id = %self.lease_id, reason = label, "lease lost; not resumed");
        self.metrics.leases_lost.with_label_values(&[label]).inc();
        self.lost.send_replace(true);
        None
    }

    /// Resumes the lease on any admission replica within the orphan grace; `None` when it cannot
    /// (the upstream call finishes anyway, counted in a metric). A released lease answers the
    /// resume with `Lost` (read as a refusal by `answer`).
    async fn resume(&self) -> Option<(Requests, Events)> {
        // Within half the ttl: the lease outlives its broken stream by the orphan grace (or the
        // ttl since the last heartbeat); a replica that just died takes a moment to be skipped.
        let give_up = tokio::time::Instant::now() + self.ttl / 2;
        let mut attempt = 0u64;
        while tokio::time::Instant::now() < give_up {
            attempt += 1;
            let resume = apb::Resume {
                lease_id: self.lease_id.clone(),
                terms: Some(acquire_pb(&self.terms, Duration::ZERO)),
            };
            match self.link.resume(resume, &self.trace).await {
                Ok((sender, events, Ok(_))) => {
                    tracing::info!(lease_id = %self.lease_id, "lease resumed after its stream broke");
                    self.metrics.leases_resumed.inc();
                    return Some((sender, events));
                }
                // Refused, or an answer this relay cannot read: trying again changes neither.
                Ok((_, _, Err(_))) | Err(CallError::Convert(_)) => break,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis((100 * attempt).min(1000))).await
                }
            }
        }
        tracing::warn!(lease_id = %self.lease_id, "lease lost: stream broke and could not be resumed");
        self.metrics
            .leases_lost
            .with_label_values(&["not_resumed"])
            .inc();
        self.lost.send_replace(true);
        None
    }
}

enum Reply {
    Attempt(oneshot::Sender<bool>),
    /// With the spend and tokens, for a unary release if the stream one got no answer.
    Release(oneshot::Sender<()>, f64, u64),
    Dropped,
}

/// A spend admission accepts: finite and >= 0.
fn spend_usd(spend: f64) -> f64 {
    if spend.is_finite() {
        spend.max(0.0)
    } else {
        0.0
    }
}

enum Answer {
    Accepted,
    Refused,
    /// The stream ended with `Lost` before the command's answer (the command was not served),
    /// with its `lost_reason` as it came.
    Lost(i32),
}

/// The holder's side of a lease: commands to its keeper, and the keeper's "lost" signal.
pub(super) struct RemoteLease {
    commands: Option<mpsc::Sender<Command>>,
    lost: watch::Receiver<bool>,
}

#[async_trait]
impl Lease for RemoteLease {
    async fn attempt(&mut self) -> bool {
        let Some(commands) = &self.commands else {
            return false;
        };
        let (reply, answer) = oneshot::channel();
        if commands.send(Command::Attempt(reply)).await.is_err() {
            return true;
        }
        answer.await.unwrap_or(true)
    }

    fn lost(&self) -> Option<watch::Receiver<bool>> {
        Some(self.lost.clone())
    }

    async fn release(mut self: Box<Self>, spend_usd: f64, tokens: u64) {
        if let Some(commands) = self.commands.take() {
            let (reply, done) = oneshot::channel();
            if commands
                .send(Command::Release(spend_usd, tokens, reply))
                .await
                .is_ok()
            {
                let _ = done.await;
            }
        }
    }
}
