//! The lease channel (docs/DESIGN.md §4): many lease conversations on one stream, each message
//! tagged by the holder. Every conversation is served by [`serve_lease`], exactly as a lease
//! stream is (same messages, answers and rules); this module only routes: the holder's messages
//! to their conversation by tag, each conversation's answers into the channel's one outbound
//! queue with its tag ([`Tagged`], no task or queue of its own), and `End` after a conversation's
//! last answer, after which the holder may reuse the tag.
//!
//! Ending: `Close` on a tag ends the holder's side of that conversation, and the channel ending
//! or breaking ends every conversation still open on it, each as a lease stream whose client
//! went away (a held lease is orphaned, a waiting acquire withdrawn). Bad input in one
//! conversation ends only that one; a malformed channel message fails the channel. The
//! conversations open on one channel are bounded ([`ChannelSettings::max_conversations`]): a
//! tag over it is answered `Exhausted` and ended at once.
//!
//! Tracing: the message that opens a conversation brings the span the conversation runs in (the
//! transport makes it a child of the request the lease serves), so admission's work for a lease
//! belongs to that request's trace, not to the channel's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::LeaseEngine;
use crate::error::LeaseError;
use crate::session::{EventSink, Gone, Inbound, serve_lease};
use poolgate_core::lease::{ChannelRequest, ChannelTag, ClientMessage, LeaseEvent};

/// Messages a conversation may have queued before the channel waits for it to read them (a
/// holder sends one message and waits for its answer; a few in flight cover a pipelined
/// release).
const CONVERSATION_QUEUE: usize = 4;

/// Answers queued for the holder across all the channel's conversations before they wait.
pub const CHANNEL_QUEUE: usize = 1024;

/// A lease channel's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelSettings {
    /// Conversations open at once on one channel; a new tag over it is refused.
    pub max_conversations: usize,
}

impl Default for ChannelSettings {
    fn default() -> Self {
        ChannelSettings {
            max_conversations: 10_000,
        }
    }
}

/// An inbound item of a lease channel.
pub enum ChannelInbound {
    /// One conversation's message or close, or bad input in its request (which ends that
    /// conversation with the error). `span`: where the conversation runs when this message opens
    /// it (`Span::none()`: nowhere in particular); ignored otherwise.
    Tagged {
        tag: ChannelTag,
        asked: Result<ChannelRequest, LeaseError>,
        span: tracing::Span,
    },
    /// A malformed channel message (no tag, no kind): the channel fails with this error.
    Malformed(LeaseError),
    /// The channel broke (the holder went away).
    Broken,
}

/// What the channel says about one conversation.
#[derive(Debug)]
pub enum Said {
    Event(LeaseEvent),
    /// The conversation failed as a lease stream fails with an error; `End` follows.
    Error(LeaseError),
    /// The conversation is over: its tag may be reused.
    End,
}

/// An outbound item: one conversation's, tagged.
#[derive(Debug)]
pub struct ChannelItem {
    pub tag: ChannelTag,
    pub said: Said,
}

/// The channel's outbound queue: `Err` fails the whole channel (its last item).
pub type ChannelOut = mpsc::Sender<Result<ChannelItem, LeaseError>>;

/// One conversation's side of the channel's outbound queue: its answers, tagged.
#[derive(Clone)]
pub struct Tagged {
    tag: ChannelTag,
    out: ChannelOut,
}

impl Tagged {
    fn item(&self, said: Said) -> Result<ChannelItem, LeaseError> {
        Ok(ChannelItem {
            tag: self.tag,
            said,
        })
    }
}

impl EventSink for Tagged {
    async fn send(&self, item: Result<LeaseEvent, LeaseError>) -> Result<(), Gone> {
        let said = match item {
            Ok(event) => Said::Event(event),
            Err(error) => Said::Error(error),
        };
        self.out.send(self.item(said)).await.map_err(|_| Gone)
    }

    fn try_send(&self, event: LeaseEvent) {
        let _ = self.out.try_send(self.item(Said::Event(event)));
    }

    async fn closed(&self) {
        self.out.closed().await
    }
}

/// The channel's open conversations by tag: the sender of each one's inbound queue, `None` once
/// the holder closed it (its end not yet sent). A conversation removes its own entry before
/// sending `End`, so a tag the holder reuses after `End` is always free.
type Open = Arc<Mutex<HashMap<ChannelTag, Option<mpsc::Sender<Inbound>>>>>;

fn lock(open: &Open) -> MutexGuard<'_, HashMap<ChannelTag, Option<mpsc::Sender<Inbound>>>> {
    open.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Where a channel message goes.
enum Route {
    /// Into this conversation's queue, after waiting for room (rare: a holder sends one
    /// message and waits for its answer).
    Deliver(mpsc::Sender<Inbound>, Box<Inbound>),
    /// A new tag over the bound.
    Refuse,
    /// Nothing to do: delivered already, a close, or a message that crossed its
    /// conversation's end.
    Done,
}

/// Serves one lease channel to its end: routes its messages until the holder's side ends,
/// breaks, or sends a malformed message; then every conversation still open sees its inbound
/// end. The outbound queue ends once every conversation has sent its `End`.
pub async fn serve_channel(
    admission: Arc<LeaseEngine>,
    mut inbound: impl Stream<Item = ChannelInbound> + Unpin,
    out: ChannelOut,
    settings: ChannelSettings,
) {
    let open: Open = Arc::default();
    loop {
        let item = tokio::select! {
            item = inbound.next() => item,
            _ = out.closed() => break,
        };
        match item {
            Some(ChannelInbound::Tagged { tag, asked, span }) => {
                match route(&admission, &open, &out, &settings, tag, asked, span) {
                    Route::Deliver(sender, item) => {
                        // A conversation that ended meanwhile drops its message: the holder
                        // sent it before reading the end.
                        let _ = sender.send(*item).await;
                    }
                    Route::Refuse => {
                        let refusal = LeaseError::Exhausted(format!(
                            "at most {} lease conversations open on one channel",
                            settings.max_conversations
                        ));
                        let tagged = Tagged {
                            tag,
                            out: out.clone(),
                        };
                        if tagged.send(Err(refusal)).await.is_err()
                            || out.send(tagged.item(Said::End)).await.is_err()
                        {
                            break;
                        }
                    }
                    Route::Done => {}
                }
            }
            Some(ChannelInbound::Malformed(error)) => {
                let _ = out.send(Err(error)).await;
                break;
            }
            Some(ChannelInbound::Broken) | None => break,
        }
    }
    // Every conversation still open ends as a lease stream whose holder went away.
    let senders: Vec<_> = lock(&open).drain().collect();
    drop(senders);
}

/// Routes one tagged message: to its open conversation, into a new one (an `Acquire` or
/// `Resume`, or bad input, on a free tag), or nowhere. Delivers at once when the
/// conversation's queue has room.
fn route(
    admission: &Arc<LeaseEngine>,
    open: &Open,
    out: &ChannelOut,
    settings: &ChannelSettings,
    tag: ChannelTag,
    asked: Result<ChannelRequest, LeaseError>,
    span: tracing::Span,
) -> Route {
    let mut conversations = lock(open);
    let item = match asked {
        Ok(ChannelRequest::Message(message)) => Inbound::Message(message),
        Err(error) => Inbound::Invalid(error),
        Ok(ChannelRequest::Close) => {
            // Dropping the sender ends the conversation's inbound once it has read what came
            // before; its entry stays until it ends, so the tag is not reused before `End`.
            if let Some(entry) = conversations.get_mut(&tag) {
                entry.take();
            }
            return Route::Done;
        }
    };
    let sender = match conversations.get(&tag) {
        Some(Some(sender)) => sender,
        // Closed by the holder and not yet ended: nothing more is read on it.
        Some(None) => return Route::Done,
        None => {
            let opens = matches!(
                item,
                Inbound::Message(ClientMessage::Acquire { .. } | ClientMessage::Resume { .. })
                    | Inbound::Invalid(_)
            );
            if !opens {
                // A heartbeat, attempt or release sent before its conversation's end reached
                // the holder: that conversation is over, and answering would be read as the
                // answer of the tag's next one.
                return Route::Done;
            }
            if conversations.len() >= settings.max_conversations {
                return Route::Refuse;
            }
            let (sender, receiver) = mpsc::channel(CONVERSATION_QUEUE);
            // A fresh queue has room for its first message.
            let _ = sender.try_send(item);
            conversations.insert(tag, Some(sender));
            let sink = Tagged {
                tag,
                out: out.clone(),
            };
            tokio::spawn(
                converse(admission.clone(), receiver, sink, open.clone()).instrument(span),
            );
            return Route::Done;
        }
    };
    match sender.try_send(item) {
        Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => Route::Done,
        Err(mpsc::error::TrySendError::Full(item)) => {
            Route::Deliver(sender.clone(), Box::new(item))
        }
    }
}

/// One conversation: the lease protocol over the tag's queue, then `End`.
async fn converse(
    admission: Arc<LeaseEngine>,
    mut receiver: mpsc::Receiver<Inbound>,
    sink: Tagged,
    open: Open,
) {
    let inbound = futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx));
    serve_lease(admission, inbound, sink.clone()).await;
    // Free the tag before saying so: a holder that reuses it after `End` finds it free.
    lock(&open).remove(&sink.tag);
    let _ = sink.out.send(sink.item(Said::End)).await;
}
