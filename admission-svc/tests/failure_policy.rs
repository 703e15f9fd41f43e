//! The Redis failure policies, each pinned by a test named after its behaviour (docs/DESIGN.md §4),
//! plus the cleanup of an uncertain acquire. Three admission replicas run in this process on one
//! private Redis; the test stops and restarts that Redis.

use crate::support;

use std::time::Duration;

use poolgate_lease::LeaseStore;
use poolgate_lease::policy::{FailurePolicy, PolicySettings};
use poolgate_proto::admission::v1 as pb;
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_runtime::redis_keys::AccountKeys;
use poolgate_testkit::{RedisServer, eventually, free_port};
use support::{LeaseStream, TestServer, acquire, test_settings};

fn backend(url: String, policy: FailurePolicy, expected_replicas: u32) -> LeaseStore {
    LeaseStore::Redis {
        target: RedisTarget::Single(url),
        options: RedisOptions {
            timeout: Duration::from_millis(300),
            pool_size: 4,
        },
        policy: PolicySettings {
            policy,
            expected_replicas,
            registry_interval: Duration::from_millis(100),
            registry_ttl: Duration::from_millis(1_000),
        },
    }
}

async fn replicas(redis: &RedisServer, policy: FailurePolicy, count: usize) -> Vec<TestServer> {
    let mut servers = Vec::new();
    for _ in 0..count {
        servers.push(TestServer::start(backend(redis.url(), policy, 1), test_settings()).await);
    }
    // Every replica sees the full registry before the outage.
    for server in &servers {
        eventually(Duration::from_secs(5), || async {
            let policy = server.admission.policy()?;
            (policy.registry_view().0 == count as u32).then_some(())
        })
        .await
        .expect("registry holds every replica");
    }
    servers
}

/// Acquires on every replica until each refuses; returns the grants per replica (streams held).
async fn fill(servers: &[TestServer], terms: &pb::Acquire) -> (Vec<usize>, Vec<LeaseStream>) {
    let mut held = Vec::new();
    let mut grants = Vec::new();
    for server in servers {
        let mut granted = 0;
        for _ in 0..50 {
            let (stream, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
            if !answer.is_granted() {
                assert_eq!(
                    answer.denied_reason(),
                    Some(pb::DenyReason::Concurrency),
                    "{answer:?}"
                );
                break;
            }
            granted += 1;
            held.push(stream);
        }
        grants.push(granted);
    }
    (grants, held)
}

fn fallbacks(server: &TestServer) -> u64 {
    let metrics = server.admission.metrics();
    ["acquire", "charge_user", "registry"]
        .iter()
        .flat_map(|op| ["timeout", "error", "degraded"].map(|reason| (op, reason)))
        .map(|(op, reason)| metrics.fallbacks.with_label_values(&[op, reason]).get())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_policy_lets_three_replicas_admit_exactly_three_times_the_limit_while_redis_is_down() {
    let mut redis = RedisServer::start().await.expect("redis");
    let servers = replicas(&redis, FailurePolicy::Open, 3).await;
    redis.kill();
    let (grants, _held) = fill(&servers, &acquire(501, 2)).await;
    assert_eq!(
        grants,
        vec![2, 2, 2],
        "each replica enforces the full limit on its own"
    );
    for server in &servers {
        assert!(server.admission.is_degraded());
        assert_eq!(server.admission.metrics().degraded.get(), 1);
        assert!(fallbacks(server) > 0, "the fallback counter moved");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_running_when_redis_goes_away_count_against_the_fallback_limit() {
    let mut redis = RedisServer::start().await.expect("redis");
    let servers = replicas(&redis, FailurePolicy::Open, 1).await;
    let server = &servers[0];
    let terms = acquire(511, 2);
    let (first, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
    assert!(answer.is_granted(), "{answer:?}");
    let (_second, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
    assert!(answer.is_granted(), "{answer:?}");
    redis.kill();
    eventually(Duration::from_secs(5), || async {
        server.admission.is_degraded().then_some(())
    })
    .await
    .expect("the replica notices the outage");
    // The two requests Redis admitted still run: the fallback counts them, so the replica does
    // not admit a full limit on top of them.
    let (_, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
    assert_eq!(
        answer.denied_reason(),
        Some(pb::DenyReason::Concurrency),
        "{answer:?}"
    );
    first.release(0.0).await;
    let (_third, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
    assert!(
        answer.is_granted(),
        "a release frees a fallback slot: {answer:?}"
    );
    let (_, answer) = LeaseStream::acquire(&server.client, terms).await;
    assert_eq!(answer.denied_reason(), Some(pb::DenyReason::Concurrency));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn divided_policy_lets_three_replicas_admit_exactly_the_limit_in_total_while_redis_is_down() {
    let mut redis = RedisServer::start().await.expect("redis");
    let servers = replicas(&redis, FailurePolicy::Divided, 3).await;
    redis.kill();
    for limit in [5, 7, 2, 3] {
        let (grants, held) = fill(&servers, &acquire(510 + limit as i64, limit)).await;
        assert_eq!(
            grants.iter().sum::<usize>(),
            limit as usize,
            "limit {limit}: shares {grants:?}"
        );
        let mut sorted = grants.clone();
        sorted.sort();
        assert!(
            sorted[2] - sorted[0] <= 1,
            "shares differ by at most one: {grants:?}"
        );
        drop(held);
    }
}

/// Keyed acquires (a fresh account each, with room to spare) on every replica until each
/// refuses; the refusal must be the key's. Returns the grants per replica (streams held).
async fn fill_key(
    servers: &[TestServer],
    first_account: i64,
    api_key_id: i64,
    key_limit: i32,
) -> (Vec<usize>, Vec<LeaseStream>) {
    let mut held = Vec::new();
    let mut grants = Vec::new();
    let mut account = first_account;
    for server in servers {
        let mut granted = 0;
        for _ in 0..50 {
            account += 1;
            let terms = pb::Acquire {
                api_key_id,
                key_concurrency_limit: key_limit,
                ..acquire(account, 10)
            };
            let (stream, answer) = LeaseStream::acquire(&server.client, terms).await;
            if !answer.is_granted() {
                assert_eq!(
                    answer.denied_reason(),
                    Some(pb::DenyReason::KeyConcurrency),
                    "{answer:?}"
                );
                break;
            }
            granted += 1;
            held.push(stream);
        }
        grants.push(granted);
    }
    (grants, held)
}

/// A client key gets its share like an account (docs/DESIGN.md §4): under `open` each replica
/// holds the key to its whole limit on its own, across accounts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_policy_gives_a_key_its_whole_limit_on_each_replica_while_redis_is_down() {
    let mut redis = RedisServer::start().await.expect("redis");
    let servers = replicas(&redis, FailurePolicy::Open, 3).await;
    redis.kill();
    let (grants, _held) = fill_key(&servers, 5_000, 41, 2).await;
    assert_eq!(grants, vec![2, 2, 2], "the key's full limit per replica");
    for server in &servers {
        assert!(server.admission.is_degraded());
    }
}

/// Under `divided` each replica holds the key to its share of the key's concurrency, so the
/// shares add up to the key's limit across replicas and accounts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn divided_policy_gives_each_replica_its_share_of_a_key_while_redis_is_down() {
    let mut redis = RedisServer::start().await.expect("redis");
    let servers = replicas(&redis, FailurePolicy::Divided, 3).await;
    redis.kill();
    for (n, key_limit) in [5, 7, 2, 3].into_iter().enumerate() {
        let first_account = 6_000 + 100 * n as i64;
        let (grants, held) = fill_key(&servers, first_account, 50 + n as i64, key_limit).await;
        assert_eq!(
            grants.iter().sum::<usize>(),
            key_limit as usize,
            "key limit {key_limit}: shares {grants:?}"
        );
        let mut sorted = grants.clone();
        sorted.sort();
        assert!(
            sorted[2] - sorted[0] <= 1,
            "shares differ by at most one: {grants:?}"
        );
        drop(held);
    }
}

/// Invariant 4: `divided` holds the limit in total through the recovery too. The replicas tick
/// by hand here, so replica 0 is back while the two others have not written their fallback
/// leases into Redis yet: it used to grant from a Redis holding only its own 2 (limit 6: 2+2+2
/// during the outage, then 6+2+2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn divided_recovery_keeps_the_limit_in_total_until_every_replica_wrote_its_leases() {
    let mut redis = RedisServer::start().await.expect("redis");
    let mut servers = Vec::new();
    for _ in 0..3 {
        let mut config = backend(redis.url(), FailurePolicy::Divided, 3);
        if let LeaseStore::Redis { policy, .. } = &mut config {
            policy.registry_interval = Duration::from_secs(3600);
            policy.registry_ttl = Duration::from_secs(3600);
        }
        servers.push(TestServer::start(config, test_settings()).await);
    }
    let policy = |n: usize| servers[n].admission.policy().expect("redis policy").clone();
    for n in 0..3 {
        policy(n).tick().await;
    }
    for n in 0..3 {
        assert_eq!(policy(n).registry_view().0, 3, "every replica sees 3");
    }
    redis.kill();
    let terms = acquire(561, 6);
    let (grants, mut held) = fill(&servers, &terms).await;
    assert_eq!(grants, vec![2, 2, 2], "the shares during the outage");
    redis.restart().await.expect("redis back");
    policy(0).tick().await;
    assert!(!servers[0].admission.is_degraded(), "replica 0 recovered");
    assert!(servers[1].admission.is_degraded() && servers[2].admission.is_degraded());
    let mut extra = 0;
    for _ in 0..6 {
        let (stream, answer) = LeaseStream::acquire(&servers[0].client, terms.clone()).await;
        if answer.is_granted() {
            extra += 1;
            held.push(stream);
        } else {
            assert_eq!(answer.denied_reason(), Some(pb::DenyReason::Concurrency));
        }
    }
    assert_eq!(
        extra, 0,
        "replica 0 keeps to its share until the others wrote theirs"
    );
    policy(1).tick().await;
    policy(2).tick().await;
    assert_eq!(support::inflight_one(&servers[0].client, 561).await, 6);
    for server in &servers {
        let (_, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
        assert_eq!(answer.denied_reason(), Some(pb::DenyReason::Concurrency));
    }
    assert_eq!(held.len(), 6, "the test's clients hold exactly the limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn divided_policy_uses_expected_replicas_when_redis_was_never_reached() {
    let dead = format!("redis://127.0.0.1:{}", free_port().expect("port"));
    let server = TestServer::start(backend(dead, FailurePolicy::Divided, 3), test_settings()).await;
    let (grants, _held) = fill(std::slice::from_ref(&server), &acquire(521, 7)).await;
    // floor(7 / 3) = 2: without a registry read the rank is unknown, so no "plus one".
    assert_eq!(grants, vec![2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_policy_refuses_with_backend_unavailable_while_redis_is_down() {
    let mut redis = RedisServer::start().await.expect("redis");
    let servers = replicas(&redis, FailurePolicy::Closed, 3).await;
    redis.kill();
    for server in &servers {
        let (_, answer) = LeaseStream::acquire(&server.client, acquire(531, 5)).await;
        assert_eq!(
            answer.denied_reason(),
            Some(pb::DenyReason::BackendUnavailable),
            "{answer:?}"
        );
        // Unlimited accounts never touch Redis, so they are still granted.
        let (_, free) = LeaseStream::acquire(&server.client, acquire(532, 0)).await;
        assert!(free.is_granted());
    }
    redis.restart().await.expect("redis back");
    for server in &servers {
        eventually(Duration::from_secs(5), || async {
            let (_, answer) = LeaseStream::acquire(&server.client, acquire(533, 5)).await;
            answer.is_granted().then_some(())
        })
        .await
        .expect("granted again once redis answers");
        assert_eq!(server.admission.metrics().degraded.get(), 0);
    }
}

/// Invariant 5: a heartbeat the backend cannot take gets an answer (`NotRenewed` with the time
/// left); after a whole ttl without a renewal the stream ends `Lost{BACKEND_UNAVAILABLE}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_heartbeat_is_answered_not_renewed_then_lost_after_a_ttl() {
    let mut redis = RedisServer::start().await.expect("redis");
    let mut settings = test_settings();
    settings.lease_ttl = Duration::from_millis(1_000);
    let server = TestServer::start(backend(redis.url(), FailurePolicy::Closed, 1), settings).await;
    let (mut stream, answer) = LeaseStream::acquire(&server.client, acquire(571, 1)).await;
    assert!(answer.is_granted());
    redis.kill();
    match stream.heartbeat().await {
        Ok(Some(pb::lease_event::Kind::NotRenewed(not_renewed))) => {
            assert!(not_renewed.ttl_ms <= 1_000, "{not_renewed:?}")
        }
        other => panic!("expected NotRenewed, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    match stream.heartbeat().await {
        Ok(Some(pb::lease_event::Kind::Lost(lost))) => {
            assert_eq!(lost.lost_reason(), pb::LostReason::BackendUnavailable)
        }
        other => panic!("expected Lost, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_restarts_enforcement_resumes_without_over_admission_from_outage_leases() {
    let mut redis = RedisServer::start().await.expect("redis");
    let servers = replicas(&redis, FailurePolicy::Open, 3).await;
    redis.kill();
    let terms = pb::Acquire {
        rpm_limit: 100,
        session_window_limit_usd: 100.0,
        ..acquire(541, 2)
    };
    let (grants, mut held) = fill(&servers, &terms).await;
    assert_eq!(grants, vec![2, 2, 2]);
    // Spend recorded during the outage must not be lost.
    held.pop().expect("a lease").release(1.5).await;
    redis.restart().await.expect("redis back, empty");
    for server in &servers {
        eventually(Duration::from_secs(5), || async {
            (!server.admission.is_degraded()).then_some(())
        })
        .await
        .expect("every replica recovers");
    }
    let mut conn = redis.client().await.expect("client");
    let keys = AccountKeys::new(541);
    let leases: u32 = redis::cmd("ZCARD")
        .arg(&keys.leases)
        .query_async(&mut conn)
        .await
        .expect("zcard");
    assert_eq!(
        leases, 5,
        "the outage's running leases were written back before serving"
    );
    let events: u32 = redis::cmd("ZCARD")
        .arg(&keys.rpm)
        .query_async(&mut conn)
        .await
        .expect("zcard");
    assert_eq!(events, 6, "and so were its RPM events");
    // Global enforcement: 5 running leases, limit 2 → everyone refuses.
    for server in &servers {
        let (_, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
        assert_eq!(answer.denied_reason(), Some(pb::DenyReason::Concurrency));
    }
    // Down to one running lease: exactly one more fits, cluster-wide.
    for stream in held.drain(..4) {
        stream.release(0.0).await;
    }
    let (_one_more, answer) = LeaseStream::acquire(&servers[1].client, terms.clone()).await;
    assert!(answer.is_granted(), "{answer:?}");
    let (_, answer) = LeaseStream::acquire(&servers[2].client, terms.clone()).await;
    assert_eq!(answer.denied_reason(), Some(pb::DenyReason::Concurrency));
    // The spend of the release made during the outage reached Redis after recovery.
    let spend: Option<i64> = redis::cmd("HGET")
        .arg(&keys.window)
        .arg("spend")
        .query_async(&mut conn)
        .await
        .expect("hget");
    assert_eq!(spend, Some(1_500_000), "1.5 USD in micro-USD");
}

/// Blocks Redis (started with the debug command enabled) for `seconds`, in the background: every
/// client's command waits, as when Redis is overloaded. Returns once Redis is seen blocked (a
/// `PING` on a connection of its own goes unanswered for 20 ms), not after a guessed delay.
async fn block_redis(redis: &RedisServer, seconds: &str) -> tokio::task::JoinHandle<()> {
    let mut blocker = redis.client().await.expect("client");
    let mut probe = redis.client().await.expect("client");
    let seconds = seconds.to_owned();
    let sleeper = tokio::spawn(async move {
        let _: Result<String, _> = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(seconds)
            .query_async(&mut blocker)
            .await;
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let ping = redis::cmd("PING");
        if tokio::time::timeout(
            Duration::from_millis(20),
            ping.query_async::<String>(&mut probe),
        )
        .await
        .is_err()
        {
            return sleeper;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Redis never blocked on DEBUG SLEEP"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncertain_acquire_is_cleaned_up_with_its_rpm_event_by_one_detached_cleanup() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"])
        .await
        .expect("redis");
    let mut backend = backend(redis.url(), FailurePolicy::Closed, 1);
    if let LeaseStore::Redis { options, .. } = &mut backend {
        options.timeout = Duration::from_millis(60);
    }
    let server = TestServer::start(backend, test_settings()).await;
    let terms = pb::Acquire {
        rpm_limit: 10,
        ..acquire(551, 3)
    };
    // Warm the script cache and the pool, then block Redis for 300 ms so the next acquire
    // times out on the client side and runs (commits) afterwards.
    let (warm, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
    assert!(answer.is_granted());
    warm.release(0.0).await;
    let sleeper = block_redis(&redis, "0.3").await;
    let (_, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
    assert_eq!(
        answer.denied_reason(),
        Some(pb::DenyReason::BackendUnavailable),
        "{answer:?}"
    );
    let _ = sleeper.await;
    let conn = redis.client().await.expect("client");
    let keys = AccountKeys::new(551);
    // The timed-out script ran after the sleep (its lease and RPM event were added), and the
    // cleanup that followed it on the same connection removed both: the warm-up's RPM event is
    // the only one left.
    eventually(Duration::from_millis(1_000), || {
        let mut conn = conn.clone();
        let keys = keys.clone();
        async move {
            let leases: u32 = redis::cmd("ZCARD")
                .arg(&keys.leases)
                .query_async(&mut conn)
                .await
                .ok()?;
            let events: u32 = redis::cmd("ZCARD")
                .arg(&keys.rpm)
                .query_async(&mut conn)
                .await
                .ok()?;
            (leases == 0 && events == 1).then_some(())
        }
    })
    .await
    .expect("the ghost lease and its rpm event are removed long before the 3 s ttl");
}

/// A slow Redis is not an outage. One replica's heartbeat times out while Redis is busy (a
/// `DEBUG SLEEP`); the replica answers `NotRenewed` for that heartbeat and stays on Redis. Were it
/// to switch to its fallback, it would grant a lease on an account another replica holds full
/// (the chaos suite caught a resume storm doing that after an admission replica died).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_heartbeat_is_not_an_outage_and_grants_nothing_from_the_fallback() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"])
        .await
        .expect("redis");
    let mut servers = Vec::new();
    for _ in 0..2 {
        let mut backend = backend(redis.url(), FailurePolicy::Open, 1);
        if let LeaseStore::Redis {
            options, policy, ..
        } = &mut backend
        {
            options.timeout = Duration::from_millis(60);
            // One registry probe at most falls in the sleep: two timed out in a row would be an
            // outage by design.
            policy.registry_interval = Duration::from_secs(1);
        }
        servers.push(TestServer::start(backend, test_settings()).await);
    }
    let (slow, full) = (&servers[0], &servers[1]);
    // Account 591 (limit 1) is full through the other replica; the slow one holds a lease on 592.
    let (_held, answer) = LeaseStream::acquire(&full.client, acquire(591, 1)).await;
    assert!(answer.is_granted());
    let (mut mine, answer) = LeaseStream::acquire(&slow.client, acquire(592, 1)).await;
    assert!(answer.is_granted());

    let sleeper = block_redis(&redis, "0.4").await;
    match mine.heartbeat().await {
        Ok(Some(pb::lease_event::Kind::NotRenewed(_))) => {}
        other => panic!("expected NotRenewed, got {other:?}"),
    }
    let policy = slow.admission.policy().expect("redis backend");
    assert!(
        !policy.is_degraded(),
        "one timed-out call does not switch the replica to its fallback"
    );
    assert!(
        slow.admission
            .metrics()
            .redis_timeouts
            .with_label_values(&["renew"])
            .get()
            >= 1,
        "the timeout is counted"
    );
    let _ = sleeper.await;
    let (_, answer) = LeaseStream::acquire(&slow.client, acquire(591, 1)).await;
    assert_eq!(
        answer.denied_reason(),
        Some(pb::DenyReason::Concurrency),
        "the account the other replica holds full stays full: {answer:?}"
    );
    assert!(!policy.is_degraded());
    assert_eq!(fallbacks(slow), 0, "nothing was served by the fallback");
}
