//! A slot freed on one admission replica wakes a waiter on another at once (the release script
//! publishes when the account has waiters, every replica subscribes), instead of at the waiter's
//! next poll; and a release with nobody waiting publishes nothing.

use crate::support;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use poolgate_lease::LeaseStore;
use poolgate_proto::admission::v1 as pb;
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_runtime::redis_keys::LEASE_WAKE_CHANNEL;
use poolgate_testkit::{RedisCluster, RedisServer, eventually};
use support::{LeaseStream, TestServer, acquire};

/// Waiters poll every 2.5–7.5 s here: only a wake-up grants within the bound below.
fn slow_polls() -> poolgate_core::lease::Settings {
    let mut settings = support::test_settings();
    settings.wait_poll_initial = Duration::from_secs(5);
    settings.wait_poll_max = Duration::from_secs(5);
    settings
}

/// An acquire of `account` (one slot) that waits.
fn waiting(account: i64) -> pb::Acquire {
    pb::Acquire {
        wait_ms: 20_000,
        ..acquire(account, 1)
    }
}

fn store(url: &str) -> LeaseStore {
    LeaseStore::Redis {
        target: RedisTarget::parse(url).expect("redis url"),
        options: RedisOptions::default(),
        policy: Default::default(),
    }
}

/// Counts the wake messages published on `url` (one node: on a Cluster, any node hears every
/// `PUBLISH`).
async fn count_wakes(url: String) -> tokio::sync::watch::Receiver<usize> {
    let client = redis::Client::open(url).expect("redis url");
    let mut pubsub = client.get_async_pubsub().await.expect("pubsub");
    pubsub
        .subscribe(LEASE_WAKE_CHANNEL)
        .await
        .expect("subscribe");
    let (count, counted) = tokio::sync::watch::channel(0);
    tokio::spawn(async move {
        let mut messages = pubsub.into_on_message();
        while messages.next().await.is_some() {
            count.send_modify(|n| *n += 1);
        }
    });
    counted
}

/// Subscribers of the wake channel on the node at `url`.
async fn subscribers(url: &str) -> Option<i64> {
    let client = redis::Client::open(url).ok()?;
    let mut connection = client.get_multiplexed_async_connection().await.ok()?;
    let (_, count): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(LEASE_WAKE_CHANNEL)
        .query_async(&mut connection)
        .await
        .ok()?;
    Some(count)
}

/// `url`: the deployment's Redis URL; `replicas_node`: the node the replicas subscribe on (the
/// first); `listener_node`: where the test counts the published messages.
async fn a_release_on_one_replica_wakes_a_waiter_on_another(
    url: String,
    replicas_node: String,
    listener_node: String,
) {
    let first = TestServer::start(store(&url), slow_polls()).await;
    let second = TestServer::start(store(&url), slow_polls()).await;
    let wakes = count_wakes(listener_node.clone()).await;
    // Both replicas' subscriptions are up before anything is released.
    let expected = if replicas_node == listener_node { 3 } else { 2 };
    eventually(Duration::from_secs(10), || async {
        (subscribers(&replicas_node).await? == expected).then_some(())
    })
    .await
    .expect("both replicas subscribe to the wake channel");

    // Nobody waits: the release publishes nothing.
    let (holder, answer) = LeaseStream::acquire(&first.client, acquire(401, 1)).await;
    assert!(answer.is_granted(), "{answer:?}");
    holder.release(0.0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        *wakes.borrow(),
        0,
        "a release with nobody waiting publishes nothing"
    );

    // A waiter on the second replica, the slot freed on the first.
    for round in 0..3 {
        let (holder, answer) = LeaseStream::acquire(&first.client, acquire(401, 1)).await;
        assert!(answer.is_granted(), "round {round}: {answer:?}");
        let (mut waiter, _) = LeaseStream::queued(&second.client, waiting(401)).await;
        let released_at = Instant::now();
        holder.release(0.0).await;
        let answer = waiter.answer().await;
        assert!(answer.is_granted(), "round {round}: {answer:?}");
        assert!(
            released_at.elapsed() < Duration::from_millis(1_500),
            "round {round}: granted {:?} after the release on the other replica, not woken",
            released_at.elapsed()
        );
        if round == 0 {
            // Nothing else could have woken it this soon: the wake message did. (Later rounds
            // may find a permit the previous waiter's own release left and take the slot on
            // that early try, before the message arrives.)
            assert_eq!(second.admission.metrics().wakes_received.get(), 1);
        }
        // The granted waiter's entry leaves the waiters set in the background: once it has,
        // its own release has nobody to wake and publishes nothing.
        tokio::time::sleep(Duration::from_millis(300)).await;
        waiter.release(0.0).await;
    }
    // Three releases had a waiter, the first did not; the waiters' own releases had none.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        *wakes.borrow(),
        3,
        "one wake message per release with a waiter"
    );
    assert!((1..=3).contains(&second.admission.metrics().wakes_received.get()));
    assert_eq!(
        first.admission.metrics().wakes_received.get(),
        0,
        "a replica's own releases woke its waiters in process"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_one_redis_a_release_wakes_a_waiter_on_another_replica() {
    let redis = RedisServer::start().await.expect("redis starts");
    a_release_on_one_replica_wakes_a_waiter_on_another(redis.url(), redis.url(), redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_release_wakes_a_waiter_on_another_replica() {
    let cluster = RedisCluster::start().await.expect("cluster starts");
    let nodes = match RedisTarget::parse(&cluster.url()).expect("cluster url") {
        RedisTarget::Cluster(nodes) => nodes,
        RedisTarget::Single(url) => vec![url],
    };
    // Listen on the last node: the replicas subscribe on the first, the account's slot may
    // live on any, and the cluster bus carries the message to all.
    let first = nodes.first().cloned().expect("a node");
    let last = nodes.last().cloned().expect("a node");
    assert_ne!(first, last);
    a_release_on_one_replica_wakes_a_waiter_on_another(cluster.url(), first, last).await;
}

/// A Redis user without the wake channel (an ACL granting keys and commands, no channels): the
/// publish is refused, the release is not, and the replica's own waiter is still woken in
/// process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_the_acl_refuses_fails_no_release() {
    let redis = RedisServer::start().await.expect("redis starts");
    let client = redis::Client::open(redis.url()).expect("redis url");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "admission",
            "on",
            ">secret",
            "~*",
            "+@all",
            "resetchannels",
        ])
        .query_async(&mut connection)
        .await
        .expect("acl user");
    let url = redis.url().replace("redis://", "redis://admission:secret@");
    let server = TestServer::start(store(&url), slow_polls()).await;
    let (holder, answer) = LeaseStream::acquire(&server.client, acquire(402, 1)).await;
    assert!(answer.is_granted(), "{answer:?}");
    let (mut waiter, _) = LeaseStream::queued(&server.client, waiting(402)).await;
    // `release` panics unless admission answers Released.
    holder.release(0.0).await;
    assert!(waiter.answer().await.is_granted());
    tokio::time::sleep(Duration::from_millis(300)).await;
    waiter.release(0.0).await;
    let (_, answer) = LeaseStream::acquire(&server.client, acquire(402, 1)).await;
    assert!(answer.is_granted(), "the slot is free again: {answer:?}");
    // A failed release script would have been answered `Released` all the same and queued for
    // retry: none was.
    assert_eq!(
        server.admission.metrics().degraded.get(),
        0,
        "served from Redis"
    );
    assert_eq!(server.admission.metrics().release_retries.get(), 0);
}
