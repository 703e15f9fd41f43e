//! Client key limits (docs/DESIGN.md §4), written once against the engine and run on every
//! store: the memory backend, one Redis node and a 3-master Redis Cluster (where the key's slot
//! is another hash slot, charged first and refunded on refusal).
//!
//! The memory store runs on a manual clock: its TTLs and windows pass by `Store::pass`, which
//! advances the clock there and sleeps on Redis. The calendar cases move a manual clock on every
//! store (it stands in for Redis' clock where budget periods are computed).

use std::sync::Arc;
use std::time::{Duration, Instant};

use poolgate_core::lease::{
    DenyReason, KeyLimits, LeaseId, LeaseTerms, LostReason, Renewal, Settings,
};
use poolgate_core::{Clock, ManualClock};
use poolgate_lease::metrics::Metrics;
use poolgate_lease::{AcquireOutcome, LeaseEngine, LeaseStore};
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_runtime::redis_keys::{AccountKeys, ClientKeyKeys};
use poolgate_testkit::{RedisCluster, RedisServer, eventually};
use tokio_util::sync::CancellationToken;

enum Store {
    Memory(ManualClock),
    Redis(RedisServer),
    Cluster(RedisCluster),
}

impl Store {
    async fn memory() -> Self {
        Store::Memory(ManualClock::starting_now())
    }

    async fn redis() -> Self {
        Store::Redis(RedisServer::start().await.expect("redis starts"))
    }

    async fn cluster() -> Self {
        Store::Cluster(RedisCluster::start().await.expect("cluster starts"))
    }

    /// An engine on the store: on memory on the store's manual clock, on Redis on the system's.
    async fn engine(&self, settings: Settings) -> Arc<LeaseEngine> {
        let clock = match self {
            Store::Memory(clock) => clock.clock(),
            Store::Redis(_) | Store::Cluster(_) => Clock::system(),
        };
        self.engine_on(settings, clock).await
    }

    /// Lets `time` pass for the store: the manual clock moves on memory, Redis' time is real.
    async fn pass(&self, time: Duration) {
        match self {
            Store::Memory(clock) => clock.advance(time),
            Store::Redis(_) | Store::Cluster(_) => tokio::time::sleep(time).await,
        }
    }

    async fn engine_on(&self, settings: Settings, clock: Clock) -> Arc<LeaseEngine> {
        let store = match self {
            Store::Memory(_) => LeaseStore::Memory,
            Store::Redis(server) => LeaseStore::Redis {
                target: RedisTarget::Single(server.url()),
                options: RedisOptions::default(),
                policy: Default::default(),
            },
            Store::Cluster(cluster) => LeaseStore::Redis {
                target: RedisTarget::parse(&cluster.url()).expect("cluster url"),
                options: RedisOptions::default(),
                policy: Default::default(),
            },
        };
        poolgate_lease::start(&store, settings, Metrics::new(), clock)
            .await
            .expect("engine starts")
    }

    /// Deletes `keys` (one hash slot) as a Redis node that lost them would; `false` on memory.
    async fn delete(&self, keys: &[&str]) -> bool {
        let mut del = redis::cmd("DEL");
        for key in keys {
            del.arg(*key);
        }
        match self {
            Store::Memory(_) => false,
            Store::Redis(server) => {
                let client = redis::Client::open(server.url()).expect("client");
                let mut conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connection");
                let _: i64 = del.query_async(&mut conn).await.expect("del");
                true
            }
            Store::Cluster(cluster) => {
                let client =
                    redis::cluster::ClusterClient::new(cluster.node_urls()).expect("client");
                let mut conn = client.get_async_connection().await.expect("connection");
                let _: i64 = del.query_async(&mut conn).await.expect("del");
                true
            }
        }
    }
}

macro_rules! store_suite {
    ($($name:ident),* $(,)?) => {
        mod on_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Store::memory().await).await;
                }
            )*
        }
        mod on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Store::redis().await).await;
                }
            )*
        }
        mod on_a_redis_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Store::cluster().await).await;
                }
            )*
        }
    };
}

store_suite!(
    a_key_at_its_concurrency_limit_across_accounts_waits_then_is_refused,
    a_release_frees_the_key_slot_and_wakes_its_waiter,
    an_orphaned_keyed_lease_frees_the_key_slot_after_the_grace,
    a_released_keyed_lease_stays_released_and_gives_the_key_slot_back,
    an_account_refusal_leaves_no_key_slot_charged,
    the_key_tpm_refuses_over_a_rolling_window_with_a_retry_after,
    a_day_budget_resets_at_local_midnight_across_a_dst_change,
    the_total_budget_never_resets_and_week_and_month_budgets_follow_the_calendar,
    a_seeded_budget_counts_only_where_the_counter_was_lost,
    a_seed_raises_a_counter_recreated_after_a_flush,
    a_keyed_release_charges_the_key_once,
);

/// The cases that need a store that can lose data (Redis, one node and a Cluster).
macro_rules! redis_suite {
    ($($name:ident),* $(,)?) => {
        mod on_redis_only {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Store::redis().await).await;
                }
            )*
        }
        mod on_a_redis_cluster_only {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Store::cluster().await).await;
                }
            )*
        }
    };
}

redis_suite!(
    a_restore_with_room_on_the_account_is_refused_when_the_key_has_none,
    the_keys_release_fence_holds_when_the_accounts_node_lost_the_lease,
);

fn settings() -> Settings {
    Settings {
        lease_ttl: Duration::from_secs(3),
        orphan_grace: Duration::from_millis(300),
        wait_poll_initial: Duration::from_millis(20),
        wait_poll_max: Duration::from_millis(200),
        budget_time_zone: "Europe/Berlin".to_owned(),
        ..Settings::default()
    }
}

fn terms(account_id: i64, concurrency_limit: i32, key: KeyLimits) -> LeaseTerms {
    LeaseTerms {
        account_id,
        concurrency_limit,
        rpm_limit: 0,
        user: None,
        session_hash: None,
        session_window_limit_micros: 0,
        session_bound: false,
        ignore_cooldown: false,
        key: Some(key),
    }
}

fn key(id: i64, concurrency: i32) -> KeyLimits {
    KeyLimits {
        api_key_id: id,
        concurrency_limit: concurrency,
        ..KeyLimits::default()
    }
}

async fn acquire(engine: &LeaseEngine, terms: &LeaseTerms, wait: Duration) -> AcquireOutcome {
    engine
        .acquire(terms, wait, &CancellationToken::new(), |_| {})
        .await
        .expect("the backend answers")
}

async fn granted(engine: &LeaseEngine, terms: &LeaseTerms) -> LeaseId {
    match acquire(engine, terms, Duration::ZERO).await {
        AcquireOutcome::Granted(lease) => lease,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn denied(outcome: AcquireOutcome) -> (DenyReason, u64) {
    match outcome {
        AcquireOutcome::Denied(denial) => (denial.reason, denial.retry_after_ms),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn ms(text: &str) -> i64 {
    text.parse::<jiff::Timestamp>()
        .expect("timestamp")
        .as_millisecond()
}

/// An engine on a manual clock at `start`, which the test moves (on every store: budget
/// periods follow a manual clock even on Redis).
async fn engine_at(store: &Store, start: &str) -> (Arc<LeaseEngine>, ManualClock) {
    let now = ManualClock::starting_at(ms(start));
    (store.engine_on(settings(), now.clock()).await, now)
}

async fn a_key_at_its_concurrency_limit_across_accounts_waits_then_is_refused(store: Store) {
    let engine = store.engine(settings()).await;
    let limits = key(7, 2);
    // Two accounts with room to spare: the key's limit is what counts.
    let first = granted(&engine, &terms(101, 5, limits.clone())).await;
    let second = granted(&engine, &terms(102, 5, limits.clone())).await;
    assert_eq!(first.api_key_id(), Some(7));
    assert_eq!(second.api_key_id(), Some(7));
    let started = Instant::now();
    let third = acquire(
        &engine,
        &terms(103, 5, limits.clone()),
        Duration::from_millis(400),
    )
    .await;
    assert_eq!(denied(third).0, DenyReason::KeyConcurrency);
    assert!(
        started.elapsed() >= Duration::from_millis(350),
        "a key at its limit waits like an account: {:?}",
        started.elapsed()
    );
    // Another key is not affected.
    granted(&engine, &terms(103, 5, key(8, 1))).await;
}

async fn a_release_frees_the_key_slot_and_wakes_its_waiter(store: Store) {
    let engine = store.engine(settings()).await;
    let limits = key(17, 2);
    let first = granted(&engine, &terms(111, 5, limits.clone())).await;
    granted(&engine, &terms(112, 5, limits.clone())).await;
    let waiter = {
        let engine = engine.clone();
        let terms = terms(113, 5, limits.clone());
        tokio::spawn(async move { acquire(&engine, &terms, Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!waiter.is_finished(), "the third waits for the key");
    let released = Instant::now();
    assert!(engine.release(&first, None, 0).await);
    let outcome = waiter.await.expect("waiter");
    assert!(matches!(outcome, AcquireOutcome::Granted(_)), "{outcome:?}");
    assert!(
        released.elapsed() < Duration::from_millis(1500),
        "woken by the release, not at the wait's end"
    );
}

async fn an_orphaned_keyed_lease_frees_the_key_slot_after_the_grace(store: Store) {
    let engine = store.engine(settings()).await;
    let limits = key(27, 1);
    let held_terms = terms(121, 5, limits.clone());
    let lease = granted(&engine, &held_terms).await;
    engine.orphan(&lease, &held_terms, 0).await;
    let next = terms(122, 5, limits);
    assert_eq!(
        denied(acquire(&engine, &next, Duration::ZERO).await).0,
        DenyReason::KeyConcurrency,
        "within the grace the orphan still holds the key's slot"
    );
    let started = Instant::now();
    store
        .pass(settings().orphan_grace + Duration::from_millis(50))
        .await;
    eventually(Duration::from_secs(3), || async {
        matches!(
            acquire(&engine, &next, Duration::ZERO).await,
            AcquireOutcome::Granted(_)
        )
        .then_some(())
    })
    .await
    .expect("the key's slot comes back after the orphan grace");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "freed at the grace (300 ms), not the ttl (3 s)"
    );
}

async fn a_released_keyed_lease_stays_released_and_gives_the_key_slot_back(store: Store) {
    let engine = store.engine(settings()).await;
    let limits = key(37, 1);
    let held_terms = terms(131, 0, limits.clone());
    let lease = granted(&engine, &held_terms).await;
    // A unary release (the id alone names the key), then the old holder's heartbeat.
    assert!(engine.release(&lease, None, 0).await);
    let renewal = engine
        .heartbeat(&lease, &held_terms, Duration::ZERO)
        .await
        .expect("heartbeat");
    assert_eq!(renewal, Renewal::Lost(LostReason::Released));
    // The heartbeat did not take the key's slot back.
    granted(&engine, &terms(132, 0, limits)).await;
}

async fn an_account_refusal_leaves_no_key_slot_charged(store: Store) {
    let engine = store.engine(settings()).await;
    let limits = key(47, 2);
    let full = terms(141, 1, limits.clone());
    granted(&engine, &full).await;
    for _ in 0..5 {
        assert_eq!(
            denied(acquire(&engine, &full, Duration::ZERO).await).0,
            DenyReason::Concurrency
        );
    }
    if let Store::Cluster(cluster) = &store {
        let client = redis::cluster::ClusterClient::new(cluster.node_urls()).expect("client");
        let mut conn = client.get_async_connection().await.expect("connection");
        let held: u32 = redis::cmd("ZCARD")
            .arg(ClientKeyKeys::slot_only(47).leases)
            .query_async(&mut conn)
            .await
            .expect("zcard");
        assert_eq!(held, 1, "every refused acquire's key charge was refunded");
    }
    // Had a refusal kept its key slot, the key (limit 2) would be full.
    granted(&engine, &terms(142, 1, limits)).await;
}

async fn the_key_tpm_refuses_over_a_rolling_window_with_a_retry_after(store: Store) {
    let engine = store
        .engine(Settings {
            rpm_window: Duration::from_secs(3),
            ..settings()
        })
        .await;
    let limits = KeyLimits {
        tpm_limit: 100,
        ..key(57, 0)
    };
    let request = terms(151, 0, limits);
    for tokens in [60, 60] {
        let lease = granted(&engine, &request).await;
        engine.release_with(&lease, Some(&request), 0, tokens).await;
    }
    let (reason, retry_after_ms) = denied(acquire(&engine, &request, Duration::ZERO).await);
    assert_eq!(reason, DenyReason::KeyTpm);
    assert!(
        (1..=3_000).contains(&retry_after_ms),
        "retry after the window: {retry_after_ms}"
    );
    store.pass(Duration::from_millis(3_050)).await;
    eventually(Duration::from_secs(6), || async {
        matches!(
            acquire(&engine, &request, Duration::ZERO).await,
            AcquireOutcome::Granted(_)
        )
        .then_some(())
    })
    .await
    .expect("the tokens age out of the window");
}

async fn a_day_budget_resets_at_local_midnight_across_a_dst_change(store: Store) {
    // 23:30 in Berlin on Saturday 28 March 2026; that night the clocks go forward.
    let (engine, now) = engine_at(&store, "2026-03-28T22:30:00Z").await;
    let limits = KeyLimits {
        budget_day_micros: 1_000_000,
        ..key(67, 0)
    };
    let request = terms(161, 0, limits);
    let lease = granted(&engine, &request).await;
    engine
        .release_with(&lease, Some(&request), 1_000_000, 0)
        .await;
    let (reason, retry_after_ms) = denied(acquire(&engine, &request, Duration::from_secs(1)).await);
    assert_eq!(reason, DenyReason::KeyBudget);
    assert_eq!(
        retry_after_ms,
        30 * 60_000,
        "the budget resets at local midnight"
    );
    // Local midnight: a new day, a new budget.
    now.set_wall_ms(ms("2026-03-28T23:00:00Z"));
    let lease = granted(&engine, &request).await;
    engine
        .release_with(&lease, Some(&request), 1_500_000, 0)
        .await;
    let (reason, retry_after_ms) = denied(acquire(&engine, &request, Duration::ZERO).await);
    assert_eq!(reason, DenyReason::KeyBudget);
    assert_eq!(
        retry_after_ms,
        23 * 3_600_000,
        "the day of the DST change has 23 hours"
    );
    now.set_wall_ms(ms("2026-03-29T21:59:59Z"));
    assert_eq!(
        denied(acquire(&engine, &request, Duration::ZERO).await).0,
        DenyReason::KeyBudget
    );
    now.set_wall_ms(ms("2026-03-29T22:00:00Z"));
    granted(&engine, &request).await;
}

async fn the_total_budget_never_resets_and_week_and_month_budgets_follow_the_calendar(
    store: Store,
) {
    // Wednesday 2 December 2026, noon in Berlin.
    let (engine, now) = engine_at(&store, "2026-12-02T11:00:00Z").await;
    let week = terms(
        171,
        0,
        KeyLimits {
            budget_week_micros: 2_000_000,
            ..key(77, 0)
        },
    );
    let lease = granted(&engine, &week).await;
    engine.release_with(&lease, Some(&week), 2_000_000, 0).await;
    let (reason, retry_after_ms) = denied(acquire(&engine, &week, Duration::ZERO).await);
    assert_eq!(reason, DenyReason::KeyBudget);
    // Until Monday 7 December, 00:00 in Berlin.
    assert_eq!(
        retry_after_ms as i64,
        ms("2026-12-06T23:00:00Z") - ms("2026-12-02T11:00:00Z")
    );
    now.set_wall_ms(ms("2026-12-06T23:00:00Z"));
    granted(&engine, &week).await;

    now.set_wall_ms(ms("2026-12-02T11:00:00Z"));
    let month = terms(
        172,
        0,
        KeyLimits {
            budget_month_micros: 1_000_000,
            budget_total_micros: 3_000_000,
            ..key(78, 0)
        },
    );
    let lease = granted(&engine, &month).await;
    engine
        .release_with(&lease, Some(&month), 1_000_000, 0)
        .await;
    let (reason, retry_after_ms) = denied(acquire(&engine, &month, Duration::ZERO).await);
    assert_eq!(reason, DenyReason::KeyBudget);
    assert_eq!(
        retry_after_ms as i64,
        ms("2026-12-31T23:00:00Z") - ms("2026-12-02T11:00:00Z")
    );
    for month_start in ["2026-12-31T23:00:00Z", "2027-01-31T23:00:00Z"] {
        now.set_wall_ms(ms(month_start));
        let lease = granted(&engine, &month).await;
        engine
            .release_with(&lease, Some(&month), 1_000_000, 0)
            .await;
    }
    // Three months of 1 USD: the total of 3 USD is gone, and stays gone.
    now.set_wall_ms(ms("2027-03-01T00:00:00Z"));
    assert_eq!(
        denied(acquire(&engine, &month, Duration::ZERO).await),
        (DenyReason::KeyBudget, 0)
    );
}

async fn a_seeded_budget_counts_only_where_the_counter_was_lost(store: Store) {
    let (engine, _now) = engine_at(&store, "2026-12-02T11:00:00Z").await;
    let request = terms(
        181,
        0,
        KeyLimits {
            budget_day_micros: 1_000_000,
            ..key(87, 0)
        },
    );
    let periods = engine.budget_periods().await.expect("periods");
    assert_eq!(periods.day.id, "d:2026-12-02");
    assert!(
        engine
            .seed_budget(87, &periods.day.id, 1_000_000)
            .await
            .expect("seed")
    );
    assert_eq!(
        denied(acquire(&engine, &request, Duration::ZERO).await).0,
        DenyReason::KeyBudget,
        "the seeded spend counts"
    );
    assert!(
        !engine
            .seed_budget(87, &periods.day.id, 0)
            .await
            .expect("seed"),
        "a counter is never lowered"
    );
}

/// A counter a flush lost and charges recreated since holds only the charges after the flush:
/// the ledger's larger sum raises it (the spend before the flush counts again), and a smaller
/// one leaves it.
async fn a_seed_raises_a_counter_recreated_after_a_flush(store: Store) {
    let (engine, _now) = engine_at(&store, "2026-12-02T11:00:00Z").await;
    let request = terms(
        183,
        0,
        KeyLimits {
            budget_day_micros: 1_000_000,
            ..key(89, 0)
        },
    );
    let lease = granted(&engine, &request).await;
    engine
        .release_with(&lease, Some(&request), 300_000, 0)
        .await;
    let day = engine.budget_periods().await.expect("periods").day.id;
    assert!(
        !engine.seed_budget(89, &day, 200_000).await.expect("seed"),
        "a ledger behind the counter leaves it"
    );
    granted(&engine, &request).await;
    assert!(
        engine.seed_budget(89, &day, 1_000_000).await.expect("seed"),
        "the ledger's larger sum raises the counter"
    );
    assert_eq!(
        denied(acquire(&engine, &request, Duration::ZERO).await).0,
        DenyReason::KeyBudget
    );
}

async fn a_keyed_release_charges_the_key_once(store: Store) {
    let (engine, _now) = engine_at(&store, "2026-12-02T11:00:00Z").await;
    let request = terms(
        191,
        0,
        KeyLimits {
            budget_day_micros: 1_000_000,
            ..key(97, 0)
        },
    );
    let lease = granted(&engine, &request).await;
    // The stream's release and a unary release of the same lease (a retry): charged once.
    engine
        .release_with(&lease, Some(&request), 600_000, 0)
        .await;
    engine.release_with(&lease, None, 600_000, 0).await;
    granted(&engine, &request).await;
}

/// After Redis lost the leases alone (the accounts' state kept: a wipe makes the account recount
/// instead, `admission-svc/tests/lease_model.rs`), an old holder's heartbeat restores its lease
/// only with room on both its account and its key: here the account has room and the key's one
/// slot went to a grant made since, so `Lost{no_room}`, and neither the account nor the key
/// counts the old lease. A lease of a key with room is restored the same way (the refusal is
/// the key's alone).
async fn a_restore_with_room_on_the_account_is_refused_when_the_key_has_none(store: Store) {
    let engine = store.engine(settings()).await;
    let old_terms = terms(201, 5, key(107, 1));
    let old = granted(&engine, &old_terms).await;
    let other_terms = terms(202, 5, key(108, 1));
    let other = granted(&engine, &other_terms).await;
    for lost in [
        AccountKeys::new(201).leases,
        AccountKeys::new(202).leases,
        ClientKeyKeys::slot_only(107).leases,
        ClientKeyKeys::slot_only(108).leases,
    ] {
        assert!(store.delete(&[&lost]).await);
    }
    // The key's one slot goes to a new lease on another account.
    granted(&engine, &terms(203, 5, key(107, 1))).await;
    let renewal = engine
        .heartbeat(&old, &old_terms, Duration::ZERO)
        .await
        .expect("heartbeat");
    assert_eq!(renewal, Renewal::Lost(LostReason::NoRoom));
    assert_eq!(
        engine.inflight(&[201]).await.expect("inflight"),
        vec![0],
        "the account does not keep a lease its key refused"
    );
    assert_eq!(engine.key_inflight(&[107]).await.expect("keys"), vec![1]);
    let renewal = engine
        .heartbeat(&other, &other_terms, Duration::ZERO)
        .await
        .expect("heartbeat");
    assert_eq!(renewal, Renewal::Restored, "a key with room restores");
    assert_eq!(engine.key_inflight(&[108]).await.expect("keys"), vec![1]);
}

/// A released keyed lease stays released by its key's own fence when the account's node lost
/// the lease and its fence (on a Cluster the key's slot is another node; on one node the script
/// reads both fences): the old holder's heartbeat is `Lost{released}` and its resume
/// `Released`, and neither brings the lease back on the account or the key.
async fn the_keys_release_fence_holds_when_the_accounts_node_lost_the_lease(store: Store) {
    let engine = store.engine(settings()).await;
    let held_terms = terms(211, 5, key(117, 2));
    let lease = granted(&engine, &held_terms).await;
    assert!(engine.release(&lease, None, 0).await);
    let account = AccountKeys::new(211);
    assert!(
        store
            .delete(&[&account.leases, &account.released, &account.holders])
            .await
    );
    let renewal = engine
        .heartbeat(&lease, &held_terms, Duration::ZERO)
        .await
        .expect("heartbeat");
    assert_eq!(renewal, Renewal::Lost(LostReason::Released));
    let resumed = engine.resume(&lease, &held_terms).await.expect("resume");
    assert!(
        matches!(
            resumed,
            poolgate_core::lease::Resumption::Released | poolgate_core::lease::Resumption::Unknown
        ),
        "{resumed:?}"
    );
    assert_eq!(engine.inflight(&[211]).await.expect("inflight"), vec![0]);
    assert_eq!(engine.key_inflight(&[117]).await.expect("keys"), vec![0]);
}
