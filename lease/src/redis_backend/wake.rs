//! Waking waiters across replicas. A waiter sleeps until its replica frees a slot of the account
//! (in process) or until its next poll (100 ms doubling to 1 s); a slot freed on another replica
//! used to be found only by that poll. Now the release script publishes on `LEASE_WAKE_CHANNEL`
//! when it freed a live slot of an account that has live waiters (the account's `waiters` set
//! says so; nothing is published otherwise), and every admission replica keeps one subscription
//! that wakes one local waiter of that account — and of the lease's client key — at once.
//!
//! Best effort by design: a message lost while the subscription reconnects costs a waiter its
//! poll interval, never a grant (each woken waiter still takes its slot through the acquire
//! script). On a Cluster the publish is a plain `PUBLISH`, which the cluster bus carries to
//! every node, so one subscription on any node hears all of them.

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt;
use poolgate_core::lease::LeaseId;
use poolgate_runtime::redis::RedisTarget;
use poolgate_runtime::redis_keys::LEASE_WAKE_CHANNEL;

use crate::engine::LeaseEngine;

/// How long a lost subscription waits before connecting again (to the next node on a Cluster).
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// How often an idle subscription checks that its engine still lives.
const ALIVE_CHECK: Duration = Duration::from_secs(1);

/// A random tag naming one backend's releases.
pub(super) fn new_tag() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// The lease a wake message names, unless it is `own_tag`'s (woken in process already) or
/// unreadable.
fn released_elsewhere(own_tag: &str, payload: &str) -> Option<LeaseId> {
    let (tag, lease) = payload.split_once(' ')?;
    if tag == own_tag {
        return None;
    }
    LeaseId::parse(lease)
}

/// Listens for wake messages until the engine is dropped, reconnecting (to the next node on a
/// Cluster) whenever the subscription ends.
pub async fn listen(
    engine: Weak<LeaseEngine>,
    target: RedisTarget,
    own_tag: String,
    connect_timeout: Duration,
) {
    let nodes = match target {
        RedisTarget::Single(url) => vec![url],
        RedisTarget::Cluster(nodes) => nodes,
    };
    for url in nodes.iter().cycle() {
        if engine.strong_count() == 0 {
            return;
        }
        match subscribe(url, connect_timeout).await {
            Ok(mut pubsub) => {
                let mut messages = pubsub.on_message();
                loop {
                    tokio::select! {
                        message = messages.next() => {
                            let Some(message) = message else { break };
                            let Some(engine) = engine.upgrade() else { return };
                            let payload = message.get_payload::<String>().unwrap_or_default();
                            if let Some(lease_id) = released_elsewhere(&own_tag, &payload) {
                                engine.wake_for_release_elsewhere(&lease_id);
                            }
                        }
                        _ = tokio::time::sleep(ALIVE_CHECK) => {
                            if engine.strong_count() == 0 {
                                return;
                            }
                        }
                    }
                }
                tracing::warn!("the lease wake subscription ended; waiters poll until it is back");
            }
            Err(reason) => {
                tracing::warn!(%reason, "could not subscribe to lease wake messages; waiters poll meanwhile");
            }
        }
        tokio::time::sleep(RECONNECT_AFTER).await;
    }
}

async fn subscribe(url: &str, timeout: Duration) -> Result<redis::aio::PubSub, String> {
    let client = redis::Client::open(url).map_err(|e| format!("{:?}", e.kind()))?;
    let connect = async {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(LEASE_WAKE_CHANNEL).await?;
        Ok::<_, redis::RedisError>(pubsub)
    };
    match tokio::time::timeout(timeout * 3, connect).await {
        Ok(Ok(pubsub)) => Ok(pubsub),
        Ok(Err(e)) => Err(format!("{:?}", e.kind())),
        Err(_) => Err("timed out".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `release.lua` publishes for a release by the backend tagged `tag`.
    fn message(tag: &str, lease_id: &LeaseId) -> String {
        format!("{tag} {}", lease_id.as_str())
    }

    /// The script spells no channel: it publishes on its last argument, which the backend sets
    /// to the channel the replicas listen to (`wake_across_replicas` shows it end to end).
    #[test]
    fn the_release_script_publishes_on_the_channel_it_is_given() {
        let script = include_str!("scripts/release.lua");
        assert!(script.contains("redis.pcall('PUBLISH', ARGV[#ARGV], ARGV[5] .. ' ' .. ARGV[1])"));
        assert!(!script.contains(LEASE_WAKE_CHANNEL));
        let backend = include_str!("mod.rs");
        assert!(backend.contains("invocation.arg(redis_keys::LEASE_WAKE_CHANNEL);"));
    }

    #[test]
    fn a_message_names_its_lease_and_our_own_are_skipped() {
        let lease = LeaseId::keyed(7, 3, "inst", 42);
        let ours = message("aaaa", &lease);
        assert_eq!(released_elsewhere("aaaa", &ours), None);
        let theirs = released_elsewhere("bbbb", &ours).expect("another backend's release");
        assert_eq!(theirs.account_id(), 7);
        assert_eq!(theirs.api_key_id(), Some(3));
        assert_eq!(released_elsewhere("bbbb", "garbage"), None);
        assert_eq!(released_elsewhere("bbbb", "cccc not-a-lease"), None);
    }
}
