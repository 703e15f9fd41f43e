//! What the operator's status view reads of admission (docs/DESIGN.md §4): each replica's
//! heartbeat reports its failure policy and whether it is degraded into the replica registry,
//! and a reader on the same Redis (the selector's probe engine) tells admission's state from the
//! fresh reports only: `degraded` when any fresh replica says so, `ok` when all do, `unknown`
//! when none is fresh (a replica that cannot reach Redis cannot write: its entry goes stale) or
//! Redis cannot be read. Also admission's own counts the view shows: RPM events of the rolling
//! minute and the session window's spend, on memory and on Redis.

use std::sync::Arc;
use std::time::Duration;

use poolgate_core::Clock;
use poolgate_core::lease::{LeaseTerms, Settings};
use poolgate_core::status::{AdmissionPolicy, AdmissionState};
use poolgate_lease::metrics::Metrics;
use poolgate_lease::policy::{FailurePolicy, PolicySettings};
use poolgate_lease::{AcquireOutcome, LeaseEngine, LeaseStore};
use poolgate_runtime::redis::{RedisHandle, RedisOptions, RedisTarget};
use poolgate_runtime::redis_keys;
use poolgate_testkit::{RedisServer, eventually};
use tokio_util::sync::CancellationToken;

fn replica_store(redis: &RedisServer, policy: FailurePolicy) -> LeaseStore {
    LeaseStore::Redis {
        target: RedisTarget::Single(redis.url()),
        options: RedisOptions::default(),
        policy: PolicySettings {
            policy,
            registry_interval: Duration::from_millis(100),
            registry_ttl: Duration::from_millis(600),
            ..PolicySettings::default()
        },
    }
}

/// An engine on the admission replicas' Redis that is not one of them (as the selector's probe).
async fn reader(redis: &RedisServer) -> Arc<LeaseEngine> {
    let handle = RedisHandle::connect(
        &RedisTarget::Single(redis.url()),
        &RedisOptions::default(),
        prometheus::IntCounter::new("t", "t").expect("counter"),
    )
    .await
    .expect("redis connects");
    poolgate_lease::start(
        &LeaseStore::SharedRedis(handle),
        Settings::default(),
        Metrics::new(),
        Clock::system(),
    )
    .await
    .expect("engine starts")
}

/// Redis `TIME` in ms.
async fn redis_now(redis: &RedisServer) -> i64 {
    let mut conn = redis.client().await.expect("redis client");
    let (seconds, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .expect("time");
    seconds * 1000 + micros / 1000
}

/// A registry entry as a replica writes it: live until `expiry_ms`, with `report` if given.
async fn entry(redis: &RedisServer, member: &str, expiry_ms: i64, report: Option<String>) {
    let mut conn = redis.client().await.expect("redis client");
    let _: i64 = redis::cmd("ZADD")
        .arg(redis_keys::admission_replicas())
        .arg(expiry_ms)
        .arg(member)
        .query_async(&mut conn)
        .await
        .expect("zadd");
    if let Some(report) = report {
        let _: i64 = redis::cmd("HSET")
            .arg(redis_keys::admission_replica_reports())
            .arg(member)
            .arg(report)
            .query_async(&mut conn)
            .await
            .expect("hset");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_reads_ok_from_live_replicas_degraded_when_a_fresh_one_says_so_and_unknown_when_none_is_fresh()
 {
    let redis = RedisServer::start().await.expect("redis starts");
    let reader = reader(&redis).await;
    // Nothing registered yet.
    assert_eq!(
        reader.admission_status().await.state,
        AdmissionState::Unknown
    );

    let first = poolgate_lease::start(
        &replica_store(&redis, FailurePolicy::Divided),
        Settings::default(),
        Metrics::new(),
        Clock::system(),
    )
    .await
    .expect("replica starts");
    let second = poolgate_lease::start(
        &replica_store(&redis, FailurePolicy::Divided),
        Settings::default(),
        Metrics::new(),
        Clock::system(),
    )
    .await
    .expect("replica starts");
    let status = reader.admission_status().await;
    assert_eq!(status.state, AdmissionState::Ok, "{status:?}");
    assert_eq!(status.policy, Some(AdmissionPolicy::Divided));
    assert_eq!(status.replicas.len(), 2);
    assert!(
        status
            .replicas
            .iter()
            .all(|r| r.fresh && r.state == AdmissionState::Ok && r.report_age_ms.is_some()),
        "{status:?}"
    );

    // A fresh replica that serves from its fallback (it reached Redis again, its recovery did
    // not finish) makes admission degraded.
    let now = redis_now(&redis).await;
    entry(
        &redis,
        "degraded-one",
        now + 60_000,
        Some(format!("divided|degraded|{now}")),
    )
    .await;
    let status = reader.admission_status().await;
    assert_eq!(status.state, AdmissionState::Degraded, "{status:?}");
    let degraded = status
        .replicas
        .iter()
        .find(|r| r.id == "degraded-one")
        .expect("listed");
    assert_eq!(degraded.state, AdmissionState::Degraded);
    let mut conn = redis.client().await.expect("redis client");
    let _: (i64, i64) = redis::pipe()
        .cmd("ZREM")
        .arg(redis_keys::admission_replicas())
        .arg("degraded-one")
        .cmd("HDEL")
        .arg(redis_keys::admission_replica_reports())
        .arg("degraded-one")
        .query_async(&mut conn)
        .await
        .expect("removed");

    // A fresh replica that reports nothing (older than the reports): the whole is unknown.
    entry(&redis, "older-replica", now + 60_000, None).await;
    let status = reader.admission_status().await;
    assert_eq!(status.state, AdmissionState::Unknown, "{status:?}");
    let _: i64 = redis::cmd("ZREM")
        .arg(redis_keys::admission_replicas())
        .arg("older-replica")
        .query_async(&mut conn)
        .await
        .expect("removed");
    assert_eq!(reader.admission_status().await.state, AdmissionState::Ok);

    // Both replicas stop heartbeating (as when they cannot reach Redis): their entries go stale,
    // they are listed as unknown with the age of their last report, and admission is unknown.
    drop((first, second));
    eventually(Duration::from_secs(10), || {
        let reader = reader.clone();
        async move {
            let status = reader.admission_status().await;
            (status.state == AdmissionState::Unknown
                && status.replicas.len() == 2
                && status.replicas.iter().all(|r| !r.fresh))
            .then_some(())
        }
    })
    .await
    .expect("stale entries read as unknown");
    let status = reader.admission_status().await;
    assert_eq!(status.policy, None, "no fresh replica names the policy");
    assert!(
        status
            .replicas
            .iter()
            .all(|r| r.state == AdmissionState::Unknown && r.report_age_ms.is_some())
    );

    // An entry past its expiry that no heartbeat has pruned yet says nothing either, whatever
    // its report.
    let now = redis_now(&redis).await;
    entry(
        &redis,
        "expired-entry",
        now - 1_000,
        Some(format!("open|ok|{}", now - 1_500)),
    )
    .await;
    let status = reader.admission_status().await;
    let expired = status
        .replicas
        .iter()
        .find(|r| r.id == "expired-entry")
        .expect("listed");
    assert_eq!(
        (expired.fresh, expired.state),
        (false, AdmissionState::Unknown)
    );
    assert_eq!(status.state, AdmissionState::Unknown, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_is_unknown_when_redis_cannot_be_read_and_memory_in_process() {
    let mut redis = RedisServer::start().await.expect("redis starts");
    let reader = reader(&redis).await;
    let _replica = poolgate_lease::start(
        &replica_store(&redis, FailurePolicy::Open),
        Settings::default(),
        Metrics::new(),
        Clock::system(),
    )
    .await
    .expect("replica starts");
    let status = reader.admission_status().await;
    assert_eq!(
        (status.state, status.policy),
        (AdmissionState::Ok, Some(AdmissionPolicy::Open))
    );
    redis.stop_keeping_data().await.expect("redis stops");
    let status = reader.admission_status().await;
    assert_eq!(status.state, AdmissionState::Unknown);
    assert!(status.replicas.is_empty());
    redis.start_again().await.expect("redis starts again");

    let in_process =
        poolgate_lease::in_memory(Settings::default(), Metrics::new(), Clock::system());
    let status = in_process.admission_status().await;
    assert_eq!(
        (status.state, status.policy),
        (AdmissionState::Ok, Some(AdmissionPolicy::Memory))
    );
}

fn terms(account_id: i64) -> LeaseTerms {
    LeaseTerms {
        account_id,
        concurrency_limit: 0,
        rpm_limit: 100,
        user: None,
        session_hash: None,
        session_window_limit_micros: 50_000_000,
        session_bound: false,
        ignore_cooldown: false,
        key: None,
    }
}

/// RPM events and session spend as the status view reads them: what admission counted, per
/// account, in the order asked; 0 for an account with nothing counted.
async fn usage_is_counted(engine: Arc<LeaseEngine>) {
    let cancel = CancellationToken::new();
    for spend in [1_500_000, 250_000] {
        let lease = match engine
            .acquire(&terms(3), Duration::from_secs(1), &cancel, |_| {})
            .await
            .expect("backend answers")
        {
            AcquireOutcome::Granted(lease) => lease,
            other => panic!("granted, got {other:?}"),
        };
        engine.release(&lease, Some(&terms(3)), spend).await;
    }
    assert_eq!(
        engine.usage(&[9, 3]).await.expect("read"),
        [(0, 0), (2, 1_750_000)]
    );
}

#[tokio::test]
async fn usage_counts_the_minutes_requests_and_the_windows_spend_in_memory() {
    usage_is_counted(poolgate_lease::in_memory(
        Settings::default(),
        Metrics::new(),
        Clock::system(),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_counts_the_minutes_requests_and_the_windows_spend_on_redis() {
    let redis = RedisServer::start().await.expect("redis starts");
    let engine = poolgate_lease::start(
        &replica_store(&redis, FailurePolicy::Open),
        Settings::default(),
        Metrics::new(),
        Clock::system(),
    )
    .await
    .expect("engine starts");
    usage_is_counted(engine).await;
}
