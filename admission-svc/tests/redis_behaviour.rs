//! Behaviour that only exists with Redis: zombie leases, the cooldown key contract, a Redis
//! restart without persistence, a killed admission process, and a 3-master Redis Cluster.

use crate::support;

use std::time::{Duration, Instant};

use poolgate_lease::LeaseStore;
use poolgate_proto::admission::v1 as pb;
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_runtime::redis_keys::AccountKeys;
use poolgate_testkit::{RedisCluster, RedisServer, eventually};
use support::{
    AdmissionProcess, Answer, LeaseStream, Store, TestServer, acquire, connect, inflight,
    inflight_one,
};

async fn redis_now_ms(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    secs * 1000 + micros / 1000
}

#[tokio::test]
async fn zombie_leases_are_not_counted() {
    let store = Store::redis().await;
    let server = TestServer::on(&store).await;
    let redis = store.redis_server().expect("redis store");
    let mut conn = redis.client().await.expect("client");
    let now = redis_now_ms(&mut conn).await;
    let keys = AccountKeys::new(201);
    // A crashed replica's lease: expired, never reaped.
    let _: i64 = redis::cmd("ZADD")
        .arg(&keys.leases)
        .arg(now - 10_000)
        .arg("201.dead.1")
        .query_async(&mut conn)
        .await
        .expect("zadd");
    assert_eq!(
        inflight_one(&server.client, 201).await,
        0,
        "ZCOUNT now +inf skips the zombie"
    );
    let (_held, answer) = LeaseStream::acquire(&server.client, acquire(201, 1)).await;
    assert!(
        answer.is_granted(),
        "the zombie does not take the only slot: {answer:?}"
    );
    let zombie: Option<f64> = redis::cmd("ZSCORE")
        .arg(&keys.leases)
        .arg("201.dead.1")
        .query_async(&mut conn)
        .await
        .expect("zscore");
    assert_eq!(zombie, None, "the acquire script reaped it");
}

#[tokio::test]
async fn cooldown_key_written_by_the_selector_refuses_acquires() {
    let store = Store::redis().await;
    let server = TestServer::on(&store).await;
    let redis = store.redis_server().expect("redis store");
    let mut conn = redis.client().await.expect("client");
    let keys = AccountKeys::new(211);
    let _: () = redis::cmd("SET")
        .arg(&keys.cooldown)
        .arg("window_exhausted")
        .arg("PX")
        .arg(400)
        .query_async(&mut conn)
        .await
        .expect("set");
    let (_, answer) = LeaseStream::acquire(&server.client, acquire(211, 1)).await;
    assert_eq!(answer.denied_reason(), Some(pb::DenyReason::Cooling));
    // The block ends with its key.
    eventually(Duration::from_secs(3), || async {
        let (_, answer) = LeaseStream::acquire(&server.client, acquire(211, 5)).await;
        answer.is_granted().then_some(())
    })
    .await
    .expect("granted after the cooldown expired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_after_a_redis_restart_restores_the_lease() {
    let mut store = Store::redis().await;
    let mut settings = support::test_settings();
    settings.lease_ttl = std::time::Duration::from_secs(30);
    let server = TestServer::start(store.backend_config(), settings).await;
    let (mut stream, answer) = LeaseStream::acquire(&server.client, acquire(221, 1)).await;
    assert!(answer.is_granted());
    let Store::Redis(redis) = &mut store else {
        unreachable!("redis store")
    };
    redis.restart().await.expect("redis restarts empty");
    let conn = redis.client().await.expect("client");
    let keys = AccountKeys::new(221);
    let held = |conn: redis::aio::MultiplexedConnection| {
        let key = keys.leases.clone();
        async move {
            let mut conn = conn;
            let now = redis_now_ms(&mut conn).await;
            let count: u32 = redis::cmd("ZCOUNT")
                .arg(&key)
                .arg(now)
                .arg("+inf")
                .query_async(&mut conn)
                .await
                .expect("zcount");
            count
        }
    };
    assert_eq!(held(conn.clone()).await, 0, "the restart lost the lease");
    // One heartbeat: either Redis answers and the renew script re-adds the lease, or the first
    // command met a dead connection, the fallback took the renewal, and recovery writes it back
    // within one registry interval. Either way the count comes back without a new acquire.
    match stream.heartbeat().await {
        Ok(Some(pb::lease_event::Kind::Renewed(_))) => {}
        other => panic!("expected Renewed, got {other:?}"),
    }
    eventually(Duration::from_secs(5), || {
        let conn = conn.clone();
        async move { (held(conn).await == 1).then_some(()) }
    })
    .await
    .expect("the lease is back in redis");
    eventually(Duration::from_secs(5), || async {
        let (_, answer) = LeaseStream::acquire(&server.client, acquire(221, 1)).await;
        (answer.denied_reason() == Some(pb::DenyReason::Concurrency)).then_some(())
    })
    .await
    .expect("global enforcement holds the restored lease");
    stream.release(0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_a_killed_admission_process_are_reaped_at_their_ttl() {
    let redis = RedisServer::start().await.expect("redis");
    let ttl = Duration::from_millis(2_000);
    let mut process = AdmissionProcess::spawn(
        env!("CARGO_BIN_EXE_admission-svc"),
        &redis.url(),
        &["--lease-ttl-ms", "2000"],
    );
    let client = connect(process.addr).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let (stream, answer) = LeaseStream::acquire(&client, acquire(231, 3)).await;
        assert!(answer.is_granted(), "{answer:?}");
        held.push(stream);
    }
    // kill -9: no orphaning, no release — only the TTL can free these slots.
    process.child.kill().expect("kill -9");
    let killed_at = Instant::now();
    let _ = process.child.wait();
    let observer = TestServer::start(
        LeaseStore::Redis {
            target: RedisTarget::Single(redis.url()),
            options: RedisOptions::default(),
            policy: Default::default(),
        },
        support::test_settings(),
    )
    .await;
    assert_eq!(
        inflight_one(&observer.client, 231).await,
        3,
        "the slots are still held"
    );
    let (_, refused) = LeaseStream::acquire(&observer.client, acquire(231, 3)).await;
    assert_eq!(refused.denied_reason(), Some(pb::DenyReason::Concurrency));
    eventually(Duration::from_secs(6), || async {
        (inflight_one(&observer.client, 231).await == 0).then_some(())
    })
    .await
    .expect("reaped");
    let reaped_after = killed_at.elapsed();
    assert!(
        reaped_after >= ttl - Duration::from_millis(300),
        "not before the ttl: {reaped_after:?}"
    );
    let (_, answer) = LeaseStream::acquire(&observer.client, acquire(231, 3)).await;
    assert!(answer.is_granted());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_serves_accounts_on_different_slots() {
    let cluster = RedisCluster::start().await.expect("cluster");
    let backend = LeaseStore::Redis {
        target: RedisTarget::parse(&cluster.url()).expect("cluster url"),
        options: RedisOptions::default(),
        policy: Default::default(),
    };
    let server = TestServer::start(backend, support::test_settings()).await;
    // Enough accounts that every master owns some of them.
    let accounts: Vec<i64> = (301..=312).collect();
    let mut held = Vec::new();
    for &account in &accounts {
        let terms = pb::Acquire {
            rpm_limit: 10,
            session_window_limit_usd: 5.0,
            user_id: Some(format!("user-{account}")),
            user_rpm_limit: 10,
            ..acquire(account, 2)
        };
        for _ in 0..2 {
            let (stream, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
            assert!(answer.is_granted(), "account {account}: {answer:?}");
            held.push(stream);
        }
        let (_, refused) = LeaseStream::acquire(&server.client, terms).await;
        assert_eq!(refused.denied_reason(), Some(pb::DenyReason::Concurrency));
    }
    assert_eq!(
        inflight(&server.client, &accounts).await,
        vec![2; accounts.len()]
    );
    for stream in &mut held {
        assert!(matches!(
            stream.heartbeat().await,
            Ok(Some(pb::lease_event::Kind::Renewed(_)))
        ));
    }
    for stream in held {
        stream.release(0.25).await;
    }
    assert_eq!(
        inflight(&server.client, &accounts).await,
        vec![0; accounts.len()]
    );
    // Each account's window holds both spends.
    let spent = support::record_spend(&server.client, 305, 0.0).await;
    assert_eq!(spent, 0.5);
    // The slots are free again on every node.
    let (_, answer) = LeaseStream::acquire(&server.client, acquire(312, 1)).await;
    assert!(matches!(answer, Answer::Granted(_)));
}

/// Invariant 3 on a Cluster, where the user's key is in another slot than the account's: the
/// user is charged once per acquire (not once per wait poll), and the charge is refunded when
/// the wait ends without a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_waiting_acquire_charges_the_user_once_and_refunds_a_refusal() {
    let cluster = RedisCluster::start().await.expect("cluster");
    let backend = LeaseStore::Redis {
        target: RedisTarget::parse(&cluster.url()).expect("cluster url"),
        options: RedisOptions::default(),
        policy: Default::default(),
    };
    let server = TestServer::start(backend, support::test_settings()).await;
    let terms = |wait_ms| pb::Acquire {
        user_id: Some("carol".into()),
        user_rpm_limit: 3,
        wait_ms,
        ..acquire(321, 1)
    };
    let (holder, answer) = LeaseStream::acquire(&server.client, terms(0)).await;
    assert!(answer.is_granted());
    let client = redis::cluster::ClusterClient::new(cluster.node_urls()).expect("cluster client");
    let mut conn = client
        .get_async_connection()
        .await
        .expect("cluster connection");
    let user_key = poolgate_runtime::redis_keys::user_rpm("carol");
    // Refused after polling for 700 ms (the slot stays taken): nothing left charged.
    let (_, refused) = LeaseStream::acquire(&server.client, terms(700)).await;
    assert_eq!(refused.denied_reason(), Some(pb::DenyReason::Concurrency));
    let events: u32 = redis::cmd("ZCARD")
        .arg(&user_key)
        .query_async(&mut conn)
        .await
        .expect("zcard");
    assert_eq!(events, 1, "only the holder's request is charged");
    // A waiter granted after many polls is charged once.
    let client_for_waiter = server.client.clone();
    let waiter =
        tokio::spawn(async move { LeaseStream::acquire(&client_for_waiter, terms(5_000)).await });
    tokio::time::sleep(Duration::from_millis(600)).await;
    holder.release(0.0).await;
    let (_held, answer) = waiter.await.expect("waiter");
    assert!(answer.is_granted(), "{answer:?}");
    let events: u32 = redis::cmd("ZCARD")
        .arg(&user_key)
        .query_async(&mut conn)
        .await
        .expect("zcard");
    assert_eq!(events, 2, "two requests granted, each charged once");
}
