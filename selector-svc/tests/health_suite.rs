//! One suite for both health stores (`health/{memory,redis}/`): every case runs on the memory
//! store (over the in-process admission engine on its memory backend) and on the Redis store
//! (over a real Redis, with admission's Redis backend on the same server), the way admission's
//! `lease_suite` does for leases. The engine cases run `Selector` over a `MemorySource`, so the
//! Redis run needs Redis only.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use poolgate_core::account::{
    Account, AccountStatus, CredentialKind, GroupSettings, Platform, Secret,
};
use poolgate_core::lease::{DenyReason, LeaseTerms, Settings};
use poolgate_core::outcome::{Outcome, OutcomeClass, RuntimeBlockSettings};
use poolgate_core::select::NoneReason;
use poolgate_core::windows::{Scope, WindowKind, WindowReading, WindowStatus};
use poolgate_core::{AccountId, Clock, ManualClock, now_ms};
use poolgate_lease::engine::{AcquireOutcome, LeaseEngine};
use poolgate_runtime::redis::{RedisHandle, RedisOptions, RedisTarget};
use poolgate_select::engine::{
    Plan, SelectQuery, Selector, SelectorError, SelectorParts, SelectorSettings,
};
use poolgate_select::health::{
    Breaker, BreakerChange, HardBlock, HealthStore, InProcessHealth, RedisHealth,
};
use poolgate_select::load_cache::LoadCacheSettings;
use poolgate_select::metrics::Metrics;
use poolgate_select::probe::ProbeSettings;
use poolgate_select::snapshot::{Snapshot, SnapshotCell};
use poolgate_select::source::{AccountSource, MemorySource};
use poolgate_testkit::{RedisServer, eventually};
use tokio_util::sync::CancellationToken;

use crate::support;
use support::upstream;

macro_rules! health_suite {
    (manual_clock: [$($name:ident),* $(,)?], real_time: [$($real:ident),* $(,)?] $(,)?) => {
        mod on_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Store::memory().await).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $real() {
                    super::$real(super::Store::memory_in_real_time().await).await;
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
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $real() {
                    super::$real(super::Store::redis().await).await;
                }
            )*
        }
    };
}

// On memory, the cases run on a manual clock that `Store::pass` advances. On the system clock:
// those whose confirmation probes run in the background against real upstreams (their waits are
// `eventually`s over locks and blocks that lapse meanwhile), and those that stamp readings with
// the system's wall time and expect it back to the millisecond.
health_suite!(
    manual_clock: [
        a_hard_block_keeps_the_later_deadline_and_admission_refuses_the_account_until_cleared,
        a_soft_block_only_reorders_and_admission_still_grants,
        unauthorized_outcomes_are_counted_within_the_window_only,
        the_breaker_opens_at_the_threshold_reopens_for_twice_as_long_and_a_success_closes_it,
        sticky_and_response_bindings_expire_and_a_touch_keeps_a_binding,
        locks_are_taken_once_released_only_by_their_owner_and_linger_then_lapse,
        a_confirming_block_is_lifted_only_while_it_is_the_block_in_place,
        the_load_is_admissions_live_lease_count_in_the_order_asked,
        selection_filters_and_orders_through_the_engine,
        busy_is_not_broken_through_the_engine,
        the_confirmation_lock_names_its_state_and_swaps_only_from_the_value_it_holds,
        a_relay_clock_ahead_or_a_far_reset_cannot_pin_a_window_reading,
        sessions_and_responses_stick_to_their_account_through_the_engine,
        usage_windows_keep_the_newest_reading_per_window_and_drop_long_past_resets,
        a_nearly_full_week_orders_last_for_new_sessions_but_stays_in_the_plan_through_the_engine,
        an_account_with_no_window_readings_is_neither_empty_nor_full_through_the_engine,
        a_groups_own_window_thresholds_move_its_sessions_sooner_and_show_in_its_gauges,
        a_plan_empty_only_while_an_account_is_confirming_says_so_with_a_short_retry_hint,
    ],
    real_time: [
        an_account_whose_plan_window_is_used_up_is_left_out_until_its_reset,
        a_model_scoped_limit_that_ran_out_keeps_the_account_from_those_models_only,
        connect_failures_open_the_breaker_and_a_success_closes_it_through_the_engine,
        no_answer_after_the_request_started_is_confirmed_by_the_probe_first_through_the_engine,
        unauthorized_outcomes_mark_the_account_error_only_when_the_probe_is_refused_through_the_engine,
        a_probe_with_no_slot_retries_with_the_account_selectable_then_applies_its_answer_through_the_engine,
        a_refusal_reported_after_the_account_was_retired_sends_no_second_probe,
    ],
);

/// A health store under test, with the admission engine its hard blocks and loads belong to.
pub struct Store {
    health: Arc<dyn HealthStore>,
    admission: Arc<LeaseEngine>,
    /// The clock the store, admission and the engine run on.
    clock: Clock,
    /// Set on memory's manual clock: `pass` advances it.
    manual: Option<ManualClock>,
    _redis: Option<RedisServer>,
}

impl Store {
    /// The memory store and admission on a manual clock.
    async fn memory() -> Self {
        let manual = ManualClock::starting_now();
        let mut store = Self::memory_on(manual.clock());
        store.manual = Some(manual);
        store
    }

    /// The memory store and admission on the system clock.
    async fn memory_in_real_time() -> Self {
        Self::memory_on(Clock::system())
    }

    fn memory_on(clock: Clock) -> Self {
        let admission = poolgate_lease::in_memory(
            Settings::default(),
            poolgate_lease::metrics::Metrics::new(),
            clock.clone(),
        );
        Store {
            health: Arc::new(InProcessHealth::new(admission.clone(), clock.clone())),
            admission,
            clock,
            manual: None,
            _redis: None,
        }
    }

    /// Lets `time` pass: a manual clock is advanced, otherwise (Redis) the test sleeps.
    async fn pass(&self, time: Duration) {
        match &self.manual {
            Some(manual) => manual.advance(time),
            None => tokio::time::sleep(time).await,
        }
    }

    async fn redis() -> Self {
        let server = RedisServer::start().await.expect("redis starts");
        let handle = RedisHandle::connect(
            &RedisTarget::Single(server.url()),
            &RedisOptions::default(),
            Metrics::new().redis_round_trips,
        )
        .await
        .expect("redis connects");
        let admission = poolgate_lease::start(
            &poolgate_lease::LeaseStore::SharedRedis(handle.clone()),
            Settings::default(),
            poolgate_lease::metrics::Metrics::new(),
            Clock::system(),
        )
        .await
        .expect("lease engine");
        Store {
            health: Arc::new(RedisHealth::new(handle)),
            admission,
            clock: Clock::system(),
            manual: None,
            _redis: Some(server),
        }
    }

    /// Whether admission grants a lease on `id` now (the lease is released at once).
    async fn admits(&self, id: AccountId) -> Result<(), DenyReason> {
        let terms = LeaseTerms {
            account_id: id,
            concurrency_limit: 5,
            rpm_limit: 0,
            user: None,
            session_hash: None,
            session_window_limit_micros: 0,
            session_bound: false,
            ignore_cooldown: false,
            key: None,
        };
        let outcome = self
            .admission
            .acquire(&terms, Duration::ZERO, &CancellationToken::new(), |_| {})
            .await
            .expect("admission answers");
        match outcome {
            AcquireOutcome::Granted(lease) => {
                self.admission.release(&lease, Some(&terms), 0).await;
                Ok(())
            }
            AcquireOutcome::Denied(denial) => Err(denial.reason),
            AcquireOutcome::Cancelled => panic!("nothing cancelled the acquire"),
        }
    }

    async fn read(&self, id: AccountId) -> poolgate_select::health::AccountHealth {
        self.health.read_one(id).await.expect("health readable")
    }
}

async fn a_hard_block_keeps_the_later_deadline_and_admission_refuses_the_account_until_cleared(
    store: Store,
) {
    let health = &store.health;
    assert_eq!(store.admits(1).await, Ok(()));
    let left = health
        .hard_block(1, 30_000, "window_exhausted", 429, "window used up")
        .await
        .expect("blocked");
    assert_eq!(left, 30_000);
    let left = health
        .hard_block(1, 1_000, "broken", 503, "shorter")
        .await
        .expect("blocked");
    assert!(
        left > 29_000,
        "a shorter block keeps the later deadline: {left}"
    );
    let read = store.read(1).await;
    assert!(
        read.hard_block_ms > 29_000 && read.hard_block_ms <= 30_000,
        "{read:?}"
    );
    assert_eq!(read.soft_block_ms, 0);
    assert_eq!(
        store.admits(1).await,
        Err(DenyReason::Cooling),
        "a hard block is admission's cooldown"
    );
    assert_eq!(
        store.admits(2).await,
        Ok(()),
        "other accounts are not affected"
    );
    let blocks = health.list_blocks(&[1, 2]).await.expect("blocks listed");
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    assert_eq!(
        (
            blocks[0].account_id,
            blocks[0].kind,
            blocks[0].class.as_str()
        ),
        (1, "hard", "window_exhausted")
    );
    assert_eq!(
        (blocks[0].status, blocks[0].reason.as_str()),
        (429, "window used up"),
        "the first block's record stays: the shorter one did not replace it"
    );
    health.clear(1).await.expect("cleared");
    assert_eq!(store.read(1).await.hard_block_ms, 0);
    assert_eq!(
        store.admits(1).await,
        Ok(()),
        "a clear lifts admission's cooldown"
    );
    assert!(health.list_blocks(&[1]).await.expect("listed").is_empty());

    // A block ends by itself.
    health
        .hard_block(3, 150, "broken", 0, "network")
        .await
        .expect("blocked");
    assert_eq!(store.admits(3).await, Err(DenyReason::Cooling));
    store.pass(Duration::from_millis(150)).await;
    eventually(Duration::from_secs(3), || async {
        (store.read(3).await.hard_block_ms == 0 && store.admits(3).await.is_ok()).then_some(())
    })
    .await
    .expect("the block lapses, here and in admission");
}

async fn a_soft_block_only_reorders_and_admission_still_grants(store: Store) {
    let health = &store.health;
    let left = health
        .soft_block(1, 5_000, "busy", 429, "slow down")
        .await
        .expect("soft-blocked");
    assert_eq!(left, 5_000);
    let left = health
        .soft_block(1, 10_000, "busy", 529, "overloaded")
        .await
        .expect("soft-blocked");
    assert_eq!(left, 10_000, "a later deadline replaces an earlier one");
    let read = store.read(1).await;
    assert!(read.soft_block_ms > 9_000, "{read:?}");
    assert_eq!(
        (read.hard_block_ms, read.breaker, read.failures),
        (0, Breaker::Closed, 0)
    );
    assert_eq!(store.admits(1).await, Ok(()));
    let blocks = health.list_blocks(&[1]).await.expect("listed");
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    assert_eq!(
        (blocks[0].kind, blocks[0].status, blocks[0].reason.as_str()),
        ("soft", 529, "overloaded")
    );
}

async fn unauthorized_outcomes_are_counted_within_the_window_only(store: Store) {
    let health = &store.health;
    for expected in 1..=3 {
        let count = health.count_unauthorized(1, 60_000).await.expect("counted");
        assert_eq!(count, expected);
    }
    assert_eq!(
        health.count_unauthorized(2, 60_000).await.expect("counted"),
        1,
        "per account"
    );
    // A short window forgets what fell out of it.
    assert_eq!(health.count_unauthorized(3, 200).await.expect("counted"), 1);
    assert_eq!(health.count_unauthorized(3, 200).await.expect("counted"), 2);
    store.pass(Duration::from_millis(300)).await;
    assert_eq!(health.count_unauthorized(3, 200).await.expect("counted"), 1);
    // A clear resets the count.
    health.clear(1).await.expect("cleared");
    assert_eq!(
        health.count_unauthorized(1, 60_000).await.expect("counted"),
        1
    );
}

async fn the_breaker_opens_at_the_threshold_reopens_for_twice_as_long_and_a_success_closes_it(
    store: Store,
) {
    let health = &store.health;
    let failure = || health.breaker_failure(1, 3, 300, 1_000);
    assert_eq!(failure().await.expect("counted"), BreakerChange::Counted(1));
    assert_eq!(failure().await.expect("counted"), BreakerChange::Counted(2));
    assert_eq!(
        store.read(1).await.failures,
        2,
        "failures are counted before the breaker opens"
    );
    assert_eq!(failure().await.expect("opened"), BreakerChange::Opened(300));
    match store.read(1).await.breaker {
        Breaker::Open(ms) => assert!(ms > 0 && ms <= 300, "open for {ms} ms"),
        other => panic!("expected an open breaker, got {other:?}"),
    }
    assert_eq!(
        failure().await.expect("still open"),
        BreakerChange::StillOpen
    );
    let blocks = health.list_blocks(&[1]).await.expect("listed");
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    assert_eq!(
        (blocks[0].kind, blocks[0].class.as_str()),
        ("breaker", "broken")
    );
    assert_eq!(blocks[0].reason, "4 consecutive broken outcomes");
    store.pass(Duration::from_millis(300)).await;
    eventually(Duration::from_secs(3), || async {
        (store.read(1).await.breaker == Breaker::HalfOpen).then_some(())
    })
    .await
    .expect("the open period ends: half-open");
    assert_eq!(
        failure().await.expect("reopened"),
        BreakerChange::Reopened(600),
        "a failed half-open check reopens it for twice as long"
    );
    assert!(matches!(store.read(1).await.breaker, Breaker::Open(ms) if ms > 300));
    assert!(
        health.breaker_success(1).await.expect("closed"),
        "the success closed an open breaker"
    );
    let read = store.read(1).await;
    assert_eq!((read.breaker, read.failures), (Breaker::Closed, 0));
    assert!(
        !health.breaker_success(1).await.expect("nothing to close"),
        "a closed breaker was not open"
    );
    // Doubling stops at the cap.
    for _ in 0..3 {
        health
            .breaker_failure(2, 1, 300, 400)
            .await
            .expect("counted");
    }
    store.pass(Duration::from_millis(300)).await;
    eventually(Duration::from_secs(3), || async {
        (store.read(2).await.breaker == Breaker::HalfOpen).then_some(())
    })
    .await
    .expect("half-open");
    assert_eq!(
        health
            .breaker_failure(2, 1, 300, 400)
            .await
            .expect("reopened"),
        BreakerChange::Reopened(400)
    );
}

async fn sticky_and_response_bindings_expire_and_a_touch_keeps_a_binding(store: Store) {
    let health = &store.health;
    assert_eq!(health.sticky_get("g", "s").await.expect("read"), None);
    assert_eq!(
        health.sticky_set("g", "s", 1, 60_000).await.expect("bound"),
        None
    );
    assert_eq!(health.sticky_get("g", "s").await.expect("read"), Some(1));
    assert_eq!(
        health.sticky_get("other", "s").await.expect("read"),
        None,
        "per group"
    );
    assert_eq!(
        health
            .sticky_set("g", "s", 2, 60_000)
            .await
            .expect("rebound"),
        Some(1),
        "a rebind answers the previous account"
    );
    assert!(health.sticky_drop("g", "s").await.expect("dropped"));
    assert!(!health.sticky_drop("g", "s").await.expect("nothing to drop"));
    assert_eq!(health.sticky_get("g", "s").await.expect("read"), None);

    health
        .sticky_set("g", "short", 3, 300)
        .await
        .expect("bound");
    health.sticky_set("g", "kept", 4, 300).await.expect("bound");
    store.pass(Duration::from_millis(150)).await;
    health
        .sticky_touch("g", "kept", 1_000)
        .await
        .expect("touched");
    // Touching nothing binds nothing.
    health
        .sticky_touch("g", "never", 1_000)
        .await
        .expect("touched");
    store.pass(Duration::from_millis(300)).await;
    assert_eq!(
        health.sticky_get("g", "short").await.expect("read"),
        None,
        "expired"
    );
    assert_eq!(
        health.sticky_get("g", "kept").await.expect("read"),
        Some(4),
        "touched"
    );
    assert_eq!(health.sticky_get("g", "never").await.expect("read"), None);

    assert_eq!(health.response_get("resp-1").await.expect("read"), None);
    health
        .response_set("resp-1", 5, 60_000)
        .await
        .expect("bound");
    health.response_set("resp-2", 6, 200).await.expect("bound");
    assert_eq!(health.response_get("resp-1").await.expect("read"), Some(5));
    assert_eq!(health.response_get("resp-2").await.expect("read"), Some(6));
    store.pass(Duration::from_millis(300)).await;
    assert_eq!(
        health.response_get("resp-2").await.expect("read"),
        None,
        "expired"
    );
    assert_eq!(health.response_get("resp-1").await.expect("read"), Some(5));
}

async fn locks_are_taken_once_released_only_by_their_owner_and_linger_then_lapse(store: Store) {
    let health = &store.health;
    assert!(health.lock_confirm(1, "a", 60_000).await.expect("locked"));
    assert!(!health.lock_confirm(1, "b", 60_000).await.expect("held"));
    assert!(
        !health.lock_confirm(1, "a", 60_000).await.expect("held"),
        "not reentrant"
    );
    assert!(
        health.lock_confirm(2, "b", 60_000).await.expect("locked"),
        "per account"
    );
    health.unlock_confirm(1, "b").await.expect("not the owner");
    assert!(
        !health
            .lock_confirm(1, "b", 60_000)
            .await
            .expect("still held")
    );
    health.unlock_confirm(1, "a").await.expect("unlocked");
    assert!(
        health
            .lock_confirm(1, "b", 60_000)
            .await
            .expect("free again")
    );
    // A linger shortens the owner's lock; someone else's linger does nothing.
    health
        .linger_confirm(1, "a", 100)
        .await
        .expect("not the owner");
    health.linger_confirm(2, "b", 150).await.expect("lingered");
    store.pass(Duration::from_millis(300)).await;
    assert!(
        !health
            .lock_confirm(1, "c", 60_000)
            .await
            .expect("still held")
    );
    assert!(health.lock_confirm(2, "c", 60_000).await.expect("lapsed"));

    // The refresh lock is its own.
    assert!(health.lock_refresh(1, "r", 60_000).await.expect("locked"));
    assert!(!health.lock_refresh(1, "s", 60_000).await.expect("held"));
    health.unlock_refresh(1, "s").await.expect("not the owner");
    assert!(!health.lock_refresh(1, "s", 60_000).await.expect("held"));
    health.unlock_refresh(1, "r").await.expect("unlocked");
    assert!(
        health
            .lock_refresh(1, "s", 60_000)
            .await
            .expect("free again")
    );
    assert!(health.lock_refresh(3, "t", 100).await.expect("locked"));
    store.pass(Duration::from_millis(200)).await;
    assert!(health.lock_refresh(3, "u", 100).await.expect("lapsed"));
}

async fn a_confirming_block_is_lifted_only_while_it_is_the_block_in_place(store: Store) {
    let health = &store.health;
    let value = health
        .block_confirming(1, 30_000, "quota_gone", 402, "owner-1")
        .await
        .expect("blocked");
    assert!(store.read(1).await.hard_block_ms > 29_000);
    assert_eq!(store.admits(1).await, Err(DenyReason::Cooling));
    let blocks = health.list_blocks(&[1]).await.expect("listed");
    assert_eq!(blocks[0].reason, "confirming owner-1");
    health
        .unblock_confirming(1, "quota_gone|402|confirming someone-else")
        .await
        .expect("not this block");
    assert_eq!(store.admits(1).await, Err(DenyReason::Cooling));
    health.unblock_confirming(1, &value).await.expect("lifted");
    assert_eq!(store.read(1).await.hard_block_ms, 0);
    assert_eq!(store.admits(1).await, Ok(()), "admission admits again");

    // A later block that replaced the confirming one stays.
    let value = health
        .block_confirming(2, 1_000, "broken", 503, "owner-2")
        .await
        .expect("blocked");
    health
        .hard_block(2, 60_000, "window_exhausted", 429, "window used up")
        .await
        .expect("blocked");
    health
        .unblock_confirming(2, &value)
        .await
        .expect("not lifted");
    assert!(store.read(2).await.hard_block_ms > 59_000);
    assert_eq!(store.admits(2).await, Err(DenyReason::Cooling));
}

async fn the_load_is_admissions_live_lease_count_in_the_order_asked(store: Store) {
    let terms = |id| LeaseTerms {
        account_id: id,
        concurrency_limit: 10,
        rpm_limit: 0,
        user: None,
        session_hash: None,
        session_window_limit_micros: 0,
        session_bound: false,
        ignore_cooldown: false,
        key: None,
    };
    let mut held = Vec::new();
    for (id, count) in [(1, 2), (2, 3)] {
        for _ in 0..count {
            match store
                .admission
                .acquire(
                    &terms(id),
                    Duration::ZERO,
                    &CancellationToken::new(),
                    |_| {},
                )
                .await
                .expect("admission answers")
            {
                AcquireOutcome::Granted(lease) => held.push((lease, id)),
                other => panic!("expected a grant, got {other:?}"),
            }
        }
    }
    let reads = store.health.read_batch(&[2, 3, 1]).await.expect("read");
    let inflight: Vec<Option<u32>> = reads.iter().map(|h| h.inflight).collect();
    assert_eq!(inflight, vec![Some(3), Some(0), Some(2)]);
    let (lease, id) = held.pop().expect("a lease");
    store.admission.release(&lease, Some(&terms(id)), 0).await;
    assert_eq!(
        store.read(2).await.inflight,
        Some(2),
        "a release is seen at once"
    );
    assert!(store.health.read_batch(&[]).await.expect("read").is_empty());
}

// --- through the engine -------------------------------------------------------------------

fn account(id: AccountId, group: &str, tweak: impl FnOnce(&mut Account)) -> Account {
    let mut account = Account {
        serves: Vec::new(),
        id,
        name: format!("acct-{id}"),
        group: group.into(),
        platform: Platform::Anthropic,
        base_url: "http://127.0.0.1:9".into(),
        credential_kind: CredentialKind::ApiKey,
        credential: Secret::new(format!("sk-ant-{id}-secret-credential")),
        oauth: None,
        status: AccountStatus::Active,
        status_reason: String::new(),
        priority: 0,
        weight: 1,
        concurrency_limit: 5,
        rpm_limit: 0,
        session_window_limit_usd: 0.0,
        allowed_models: vec![],
        model_mapping: HashMap::new(),
        proxy_url: None,
        probe_model: None,
        stream_usage: true,
        identity: Default::default(),
    };
    tweak(&mut account);
    account
}

/// Blocks that lapse within a test, a breaker that stays open through one, and no cached
/// readings (each select sees what the case just did).
fn engine_settings() -> SelectorSettings {
    SelectorSettings {
        blocks: RuntimeBlockSettings {
            broken_block: Duration::from_millis(50),
            unauthorized_block: Duration::from_millis(50),
            breaker_threshold: 2,
            breaker_open: Duration::from_secs(30),
            ..RuntimeBlockSettings::default()
        },
        load_cache: LoadCacheSettings {
            cache_ttl: Duration::ZERO,
            ..LoadCacheSettings::default()
        },
        probe: ProbeSettings {
            lease_wait: Duration::from_millis(200),
            inconclusive_retries: vec![Duration::from_millis(300); 3],
            ..ProbeSettings::default()
        },
        ..SelectorSettings::default()
    }
}

/// An engine over `accounts` in memory and the store under test.
struct Engine {
    selector: Selector,
    source: Arc<MemorySource>,
    reload: tokio::task::JoinHandle<()>,
}

impl Engine {
    fn new(store: &Store, accounts: Vec<Account>) -> Self {
        Self::with_groups(store, accounts, HashMap::new())
    }

    fn with_groups(
        store: &Store,
        accounts: Vec<Account>,
        groups: HashMap<String, GroupSettings>,
    ) -> Self {
        let snapshot = Snapshot::new(vec![], accounts, HashMap::new(), HashMap::new())
            .with_group_settings(groups);
        let source =
            Arc::new(MemorySource::new(snapshot, None, store.clock.clone()).expect("source"));
        let cell = Arc::new(SnapshotCell::new(source.snapshot()));
        let reload = tokio::spawn(source.clone().reload_on_change(cell.clone()));
        let selector = Selector::new(SelectorParts {
            snapshot: cell,
            source: source.clone(),
            health: store.health.clone(),
            leases: store.admission.clone(),
            settings: engine_settings(),
            metrics: Metrics::new(),
            clock: store.clock.clone(),
        });
        Engine {
            selector,
            source,
            reload,
        }
    }

    async fn plan(&self, query: &SelectQuery) -> Plan {
        self.selector.select(query).await.expect("select")
    }

    async fn report(&self, id: AccountId, class: OutcomeClass, status: u16) -> &'static str {
        self.report_outcome(Outcome::new(id, class, status)).await
    }

    async fn report_outcome(&self, outcome: Outcome) -> &'static str {
        self.selector
            .report(&Outcome {
                reason: format!("test {}", outcome.status),
                ..outcome
            })
            .await
            .expect("report")
            .what
            .as_str()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.reload.abort();
    }
}

fn query(group: &str) -> SelectQuery {
    SelectQuery {
        group: group.into(),
        platform: Some(Platform::Anthropic),
        model: "claude-sonnet".into(),
        max_accounts: 10,
        ..SelectQuery::default()
    }
}

fn ids(plan: &Plan) -> Vec<AccountId> {
    plan.accounts.iter().map(|account| account.id).collect()
}

async fn selection_filters_and_orders_through_the_engine(store: Store) {
    let engine = Engine::new(
        &store,
        vec![
            account(1, "g", |_| {}),
            account(2, "g", |_| {}),
            account(3, "g", |a| a.priority = 1),
            account(4, "g", |a| a.status = AccountStatus::Disabled),
            account(5, "g", |a| a.platform = Platform::OpenAi),
            account(6, "g", |a| a.allowed_models = vec!["another-model".into()]),
            account(7, "h", |a| a.allowed_models = vec!["another-model".into()]),
        ],
    );
    for _ in 0..5 {
        let plan = engine.plan(&query("g")).await;
        let mut first_tier = ids(&plan)[..2].to_vec();
        first_tier.sort_unstable();
        assert_eq!(first_tier, vec![1, 2], "{:?}", ids(&plan));
        assert_eq!(ids(&plan)[2..], [3], "the lower priority tier comes last");
    }
    let plan = engine
        .plan(&SelectQuery {
            max_accounts: 1,
            ..query("g")
        })
        .await;
    assert_eq!(plan.accounts.len(), 1, "the plan is cut to the size asked");
    let plan = engine
        .plan(&SelectQuery {
            exclude: vec![1, 2, 3],
            ..query("g")
        })
        .await;
    assert_eq!(plan.none_reason, Some(NoneReason::AllExcluded));
    assert_eq!(
        engine.plan(&query("h")).await.none_reason,
        Some(NoneReason::ModelNotAllowed)
    );
    assert!(matches!(
        engine.selector.select(&query("nope")).await,
        Err(SelectorError::NotFound(_))
    ));

    // Soft-blocked accounts go last in their tier; hard-blocked ones are left out.
    let health = &store.health;
    health
        .soft_block(1, 60_000, "busy", 429, "busy")
        .await
        .expect("soft-blocked");
    let plan = engine.plan(&query("g")).await;
    assert_eq!(ids(&plan), vec![2, 1, 3]);
    assert!(plan.accounts[1].soft_blocked && !plan.accounts[0].soft_blocked);
    health
        .hard_block(2, 60_000, "window_exhausted", 429, "used up")
        .await
        .expect("blocked");
    assert_eq!(ids(&engine.plan(&query("g")).await), vec![1, 3]);
    for id in [1, 3] {
        health
            .hard_block(id, 60_000, "window_exhausted", 429, "used up")
            .await
            .expect("blocked");
    }
    let plan = engine.plan(&query("g")).await;
    assert_eq!(plan.none_reason, Some(NoneReason::AllBlocked));
    assert!(plan.retry_after_ms > 50_000, "{}", plan.retry_after_ms);
    engine.selector.clear_blocks(2).await.expect("cleared");
    assert_eq!(ids(&engine.plan(&query("g")).await), vec![2]);
}

/// A confirmation's block is held until its verdict, which may let the account back
/// at any moment: an empty plan says `confirming` with a short retry hint (the relay plans again
/// within the request's deadline), not the block's length; any other block keeps its reason and
/// its end.
async fn a_plan_empty_only_while_an_account_is_confirming_says_so_with_a_short_retry_hint(
    store: Store,
) {
    let engine = Engine::new(
        &store,
        vec![account(1, "g", |_| {}), account(2, "g", |_| {})],
    );
    let health = &store.health;
    health
        .hard_block(2, 600_000, "window_exhausted", 429, "used up")
        .await
        .expect("blocked");
    let confirming = health
        .block_confirming(1, 90_000, "unauthorized", 401, "run:owner-1")
        .await
        .expect("blocked");
    assert_eq!(
        health.hard_blocks(&[1, 2, 3]).await.expect("read"),
        vec![HardBlock::Confirming, HardBlock::Other, HardBlock::None],
        "what each account's hard block is, in the order asked"
    );
    let plan = engine.plan(&query("g")).await;
    assert_eq!(
        (plan.none_reason, plan.retry_after_ms),
        (
            Some(NoneReason::Confirming),
            poolgate_core::select::CONFIRMING_RETRY_MS
        ),
        "one account confirming, the other blocked for ten minutes"
    );
    // The verdict lets it back: the next plan has it.
    health
        .unblock_confirming(1, &confirming)
        .await
        .expect("lifted");
    assert_eq!(ids(&engine.plan(&query("g")).await), vec![1]);
    // A verdict that blocks it: the block's own reason and end.
    health
        .hard_block(1, 300_000, "unauthorized", 401, "refused")
        .await
        .expect("blocked");
    let plan = engine.plan(&query("g")).await;
    assert_eq!(plan.none_reason, Some(NoneReason::AllBlocked));
    assert!(plan.retry_after_ms > 250_000, "{}", plan.retry_after_ms);
}

async fn busy_is_not_broken_through_the_engine(store: Store) {
    let engine = Engine::new(&store, vec![account(1, "g", |_| {})]);
    for n in 0..20 {
        let status = if n % 2 == 0 { 429 } else { 529 };
        assert_eq!(
            engine.report(1, OutcomeClass::Busy, status).await,
            "soft_block"
        );
    }
    let plan = engine.plan(&query("g")).await;
    assert_eq!(ids(&plan), vec![1], "still served: it is the only account");
    assert!(plan.accounts[0].soft_blocked);
    let read = store.read(1).await;
    assert_eq!(
        (read.hard_block_ms, read.breaker, read.failures),
        (0, Breaker::Closed, 0),
        "no hard block, no breaker count"
    );
    assert_eq!(
        store.admits(1).await,
        Ok(()),
        "admission does not refuse it"
    );
    // An exhausted window is another matter: a hard block admission keeps.
    assert_eq!(
        engine.report(1, OutcomeClass::WindowExhausted, 429).await,
        "hard_block"
    );
    assert_eq!(store.admits(1).await, Err(DenyReason::Cooling));
    assert_eq!(
        engine.plan(&query("g")).await.none_reason,
        Some(NoneReason::AllBlocked)
    );
    // Client errors change nothing.
    engine.selector.clear_blocks(1).await.expect("cleared");
    assert_eq!(
        engine.report(1, OutcomeClass::ClientError, 400).await,
        "none"
    );
    assert_eq!(ids(&engine.plan(&query("g")).await), vec![1]);
}

async fn connect_failures_open_the_breaker_and_a_success_closes_it_through_the_engine(
    store: Store,
) {
    let engine = Engine::new(&store, vec![account(1, "g", |_| {})]);
    // The connection failed before any byte of the request left: applies at once.
    let connect = || Outcome {
        before_send: true,
        ..Outcome::new(1, OutcomeClass::Broken, 0)
    };
    assert_eq!(engine.report_outcome(connect()).await, "hard_block");
    assert_eq!(store.read(1).await.failures, 1);
    assert_eq!(engine.report_outcome(connect()).await, "breaker_open");
    assert!(matches!(store.read(1).await.breaker, Breaker::Open(_)));
    // The 50 ms hard block lapses; the breaker keeps the account out.
    let plan = eventually(Duration::from_secs(3), || async {
        let plan = engine.plan(&query("g")).await;
        (plan.none_reason == Some(NoneReason::BreakerOpen)).then_some(plan)
    })
    .await
    .expect("only the breaker is left");
    assert!(plan.retry_after_ms > 20_000, "{}", plan.retry_after_ms);
    assert_eq!(
        engine.report(1, OutcomeClass::Success, 200).await,
        "breaker_closed"
    );
    assert_eq!(ids(&engine.plan(&query("g")).await), vec![1]);
    assert_eq!(store.read(1).await.failures, 0);
}

async fn no_answer_after_the_request_started_is_confirmed_by_the_probe_first_through_the_engine(
    store: Store,
) {
    let healthy = upstream(200, OK, Duration::from_millis(100)).await;
    let engine = Engine::new(
        &store,
        vec![
            account(1, "g", |a| a.base_url = healthy.base_url.clone()),
            // Nothing listens there: the probe gets no answer either.
            account(2, "g", |_| {}),
        ],
    );
    // A timeout, an early close, an oversized answer, a stream broken mid-way: the request
    // may have caused it. Confirming, then cleared by the probe's answer.
    assert_eq!(
        engine.report(1, OutcomeClass::Broken, 0).await,
        "confirming"
    );
    eventually(Duration::from_secs(5), || async {
        let read = store.read(1).await;
        (healthy.seen_requests().len() == 1 && read.hard_block_ms == 0).then_some(())
    })
    .await
    .expect("probed; the confirming block lifted");
    assert_eq!(store.read(1).await.failures, 0, "not counted");
    // The converse: the probe gets no answer either, and the outcome applies.
    assert_eq!(
        engine.report(2, OutcomeClass::Broken, 0).await,
        "confirming"
    );
    eventually(Duration::from_secs(5), || async {
        (store.read(2).await.failures == 1).then_some(())
    })
    .await
    .expect("the probe bore it out: counted");
}

const OK: &str = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"p"}],"usage":{"input_tokens":1,"output_tokens":1}}"#;
const AUTHENTICATION_ERROR: &str =
    r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;

async fn unauthorized_outcomes_mark_the_account_error_only_when_the_probe_is_refused_through_the_engine(
    store: Store,
) {
    let refusing = upstream(401, AUTHENTICATION_ERROR, Duration::ZERO).await;
    let healthy = upstream(200, OK, Duration::ZERO).await;
    let engine = Engine::new(
        &store,
        vec![
            account(1, "g", |a| a.base_url = refusing.base_url.clone()),
            account(2, "g", |a| a.base_url = healthy.base_url.clone()),
        ],
    );
    // A client-shaped 401 on account 2: its probe is answered, nothing counts.
    assert_eq!(
        engine.report(2, OutcomeClass::Unauthorized, 401).await,
        "confirming"
    );
    eventually(Duration::from_secs(5), || async {
        (healthy.seen_requests().len() == 1 && store.read(2).await.hard_block_ms == 0).then_some(())
    })
    .await
    .expect("probed; unblocked");
    // Quiet now: the same refusal again starts nothing and blocks nothing.
    assert_eq!(
        engine.report(2, OutcomeClass::Unauthorized, 401).await,
        "none"
    );
    assert_eq!(healthy.seen_requests().len(), 1);
    assert_eq!(
        store
            .health
            .count_unauthorized(2, 3_600_000)
            .await
            .expect("count"),
        1,
        "only this read's own event: none before it"
    );
    // Account 1's key is refused by the probe too: each confirmed refusal counts; the third
    // within the window marks it error.
    for round in 1..=3 {
        let started = eventually(Duration::from_secs(5), || async {
            (engine.report(1, OutcomeClass::Unauthorized, 401).await == "confirming").then_some(())
        })
        .await;
        assert_eq!(started, Ok(()), "round {round}");
        eventually(Duration::from_secs(5), || async {
            (refusing.seen_requests().len() == round).then_some(())
        })
        .await
        .expect("probed");
    }
    eventually(Duration::from_secs(5), || async {
        let stored = engine.source.load_account(1).await.ok()?;
        (stored.status == AccountStatus::Error).then_some(stored)
    })
    .await
    .map(|stored| {
        assert!(
            stored.status_reason.contains("unauthorized"),
            "{}",
            stored.status_reason
        )
    })
    .expect("three confirmed refusals: error");
    assert_eq!(
        engine.source.load_account(2).await.expect("account").status,
        AccountStatus::Active
    );
}

async fn the_confirmation_lock_names_its_state_and_swaps_only_from_the_value_it_holds(
    store: Store,
) {
    let health = &store.health;
    assert_eq!(health.confirm_state(1).await.expect("read"), None);
    assert!(health.lock_confirm(1, "run:a", 5_000).await.expect("lock"));
    assert_eq!(
        health.confirm_state(1).await.expect("read").as_deref(),
        Some("run:a")
    );
    assert!(
        !health
            .swap_confirm(1, "run:b", "quiet:b", 5_000)
            .await
            .expect("swap"),
        "not the value it holds"
    );
    assert!(
        health
            .swap_confirm(1, "run:a", "fresh:f00:a", 1_000)
            .await
            .expect("swap")
    );
    assert_eq!(
        health.confirm_state(1).await.expect("read").as_deref(),
        Some("fresh:f00:a")
    );
    assert!(
        !health.lock_confirm(1, "run:c", 5_000).await.expect("lock"),
        "still held"
    );
    store.pass(Duration::from_secs(1)).await;
    eventually(Duration::from_secs(3), || async {
        health.confirm_state(1).await.ok()?.is_none().then_some(())
    })
    .await
    .expect("the swapped TTL lapses");
}

async fn sessions_and_responses_stick_to_their_account_through_the_engine(store: Store) {
    let engine = Engine::new(
        &store,
        vec![account(1, "g", |_| {}), account(2, "g", |a| a.priority = 1)],
    );
    let session = |hash: &str| SelectQuery {
        session_hash: Some(hash.into()),
        ..query("g")
    };
    assert_eq!(ids(&engine.plan(&session("s1")).await), vec![1, 2]);
    assert_eq!(
        engine
            .selector
            .bind_session("g", "s1", 2)
            .await
            .expect("bound"),
        "bound"
    );
    let plan = engine.plan(&session("s1")).await;
    assert!(plan.sticky);
    assert_eq!(
        ids(&plan),
        vec![2, 1],
        "the bound account comes first, whatever its tier"
    );
    assert_eq!(
        store.health.sticky_get("g", "s1").await.expect("read"),
        Some(2)
    );
    assert_eq!(
        engine
            .selector
            .bind_session("g", "s1", 2)
            .await
            .expect("bound"),
        "hit"
    );
    assert_eq!(
        engine
            .selector
            .bind_session("g", "s1", 1)
            .await
            .expect("bound"),
        "rebind"
    );
    assert_eq!(ids(&engine.plan(&session("s1")).await), vec![1, 2]);
    // A soft-blocked sticky account is not put first.
    engine
        .selector
        .bind_session("g", "s2", 2)
        .await
        .expect("bound");
    store
        .health
        .soft_block(2, 60_000, "busy", 429, "busy")
        .await
        .expect("soft-blocked");
    let plan = engine.plan(&session("s2")).await;
    assert!(!plan.sticky);
    assert_eq!(ids(&plan), vec![1, 2]);
    store.health.clear(2).await.expect("cleared");

    engine
        .selector
        .bind_response("resp-1", 2)
        .await
        .expect("bound");
    let plan = engine
        .plan(&SelectQuery {
            previous_response_id: Some("resp-1".into()),
            ..query("g")
        })
        .await;
    assert!(plan.sticky);
    assert_eq!(
        ids(&plan),
        vec![2, 1],
        "a previous response's account comes first"
    );
}

async fn a_probe_with_no_slot_retries_with_the_account_selectable_then_applies_its_answer_through_the_engine(
    store: Store,
) {
    let failing = upstream(
        500,
        r#"{"type":"error","error":{"type":"api_error","message":"boom"}}"#,
        Duration::ZERO,
    )
    .await;
    let engine = Engine::new(
        &store,
        vec![account(1, "g", |a| {
            a.base_url = failing.base_url.clone();
            a.concurrency_limit = 1;
        })],
    );
    // A client holds the account's only slot: the probe cannot be sent.
    let terms = LeaseTerms {
        account_id: 1,
        concurrency_limit: 1,
        rpm_limit: 0,
        user: None,
        session_hash: None,
        session_window_limit_micros: 0,
        session_bound: false,
        ignore_cooldown: false,
        key: None,
    };
    let AcquireOutcome::Granted(held) = store
        .admission
        .acquire(&terms, Duration::ZERO, &CancellationToken::new(), |_| {})
        .await
        .expect("admission answers")
    else {
        panic!("the only slot is free");
    };
    assert_eq!(
        engine.report(1, OutcomeClass::Broken, 500).await,
        "confirming"
    );
    // While the probe waits to retry, the account is not held out of service.
    eventually(Duration::from_secs(3), || async {
        (store.read(1).await.hard_block_ms == 0).then_some(())
    })
    .await
    .expect("the confirming block is lifted while the probe waits to retry");
    assert_eq!(ids(&engine.plan(&query("g")).await), vec![1], "selectable");
    assert_eq!(failing.seen_requests().len(), 0, "no probe without a slot");
    // The slot comes free: a retry sends the probe, and its 5xx applies.
    store.admission.release(&held, Some(&terms), 0).await;
    eventually(Duration::from_secs(5), || async {
        (failing.seen_requests().len() == 1 && store.read(1).await.failures == 1).then_some(())
    })
    .await
    .expect("the retried probe got the 5xx: counted");
}

/// The race a CI run caught: a client request that went out before a confirmation retired the
/// account reports its refusal after the confirmation ended, while this replica's snapshot still
/// says `active`. The confirmation it starts reads the stored account, finds it retired, and
/// sends no probe.
async fn a_refusal_reported_after_the_account_was_retired_sends_no_second_probe(store: Store) {
    let out_of_credit = upstream(
        402,
        r#"{"type":"error","error":{"type":"billing_error","message":"credit balance too low"}}"#,
        Duration::ZERO,
    )
    .await;
    let engine = Engine::new(
        &store,
        vec![account(1, "g", |a| {
            a.base_url = out_of_credit.base_url.clone()
        })],
    );
    // A stale snapshot: the retirement is stored but has not reached this replica's snapshot.
    engine.reload.abort();
    engine
        .source
        .set_status(1, AccountStatus::Retired, "quota gone: confirmed by probe")
        .await
        .expect("status stored");
    assert_eq!(
        engine.report(1, OutcomeClass::QuotaGone, 402).await,
        "confirming"
    );
    // The confirmation ends (its block lifted, its lock released) without a probe.
    eventually(Duration::from_secs(5), || async {
        (store.read(1).await.hard_block_ms == 0
            && store.health.confirm_state(1).await.ok().flatten().is_none())
        .then_some(())
    })
    .await
    .expect("the confirmation ended");
    assert_eq!(
        out_of_credit.seen_requests().len(),
        0,
        "no probe is sent to an account that is already retired"
    );
}

// --- usage windows (docs/DESIGN.md §5, "Spending what expires first") ---------------------------

const DAY_MS: i64 = 24 * 3_600_000;

fn reading(kind: WindowKind, scope: Scope, utilization: f64, reset_in_ms: i64) -> WindowReading {
    let now = now_ms();
    WindowReading {
        kind,
        scope,
        utilization: Some(utilization),
        reset_at_ms: now + reset_in_ms,
        length_ms: None,
        status: WindowStatus::Allowed,
        observed_at_ms: now,
    }
}

/// Sorted by utilization, so two stores' answers (a hash has no order) compare.
fn by_use(mut readings: Vec<WindowReading>) -> Vec<WindowReading> {
    readings.sort_by(|a, b| a.utilization.partial_cmp(&b.utilization).expect("finite"));
    readings
}

async fn usage_windows_keep_the_newest_reading_per_window_and_drop_long_past_resets(store: Store) {
    let health = &store.health;
    let week = reading(WindowKind::SevenDay, Scope::Account, 0.3, 5 * DAY_MS);
    let five_hours = reading(WindowKind::FiveHour, Scope::Account, 0.1, 3_600_000);
    let opus = reading(
        WindowKind::SevenDayModel,
        Scope::Models("opus".into()),
        0.6,
        5 * DAY_MS,
    );
    health
        .store_windows(1, &[week.clone(), five_hours.clone(), opus.clone()])
        .await
        .expect("stored");
    assert_eq!(
        by_use(health.read_windows(&[1]).await.expect("read").remove(0)),
        vec![five_hours.clone(), week.clone(), opus.clone()],
        "each window (kind and scope) is kept"
    );

    // A newer reading replaces its window's; an older one arriving late does not.
    let newer_week = WindowReading {
        utilization: Some(0.4),
        observed_at_ms: week.observed_at_ms + 1_000,
        ..week.clone()
    };
    health
        .store_windows(1, std::slice::from_ref(&newer_week))
        .await
        .expect("stored");
    let late_week = WindowReading {
        utilization: Some(0.35),
        observed_at_ms: week.observed_at_ms + 500,
        ..week.clone()
    };
    health
        .store_windows(1, std::slice::from_ref(&late_week))
        .await
        .expect("stored");
    // A later answer to an earlier request (observed last, less used, the same period) never
    // rolls the window back.
    let rolled_back = WindowReading {
        utilization: Some(0.32),
        observed_at_ms: week.observed_at_ms + 2_000,
        ..week.clone()
    };
    health
        .store_windows(1, std::slice::from_ref(&rolled_back))
        .await
        .expect("stored");
    // A reading whose reset passed two days ago is dropped; one past its reset by a minute is
    // kept (it reads as empty, which `assess` decides, not the store).
    let long_past = WindowReading {
        reset_at_ms: now_ms() - 2 * DAY_MS,
        ..reading(WindowKind::CodexPrimary, Scope::Account, 0.9, 0)
    };
    let just_past = WindowReading {
        reset_at_ms: now_ms() - 60_000,
        ..reading(WindowKind::CodexSecondary, Scope::Account, 0.8, 0)
    };
    health
        .store_windows(1, &[long_past, just_past.clone()])
        .await
        .expect("stored");
    health.store_windows(1, &[]).await.expect("nothing stored");
    assert_eq!(
        by_use(health.read_windows(&[1]).await.expect("read").remove(0)),
        vec![five_hours, newer_week.clone(), opus, just_past],
        "the newest reading per window, without the long-past one"
    );

    // In the order asked; an account never written has none.
    let other = reading(WindowKind::SevenDay, Scope::Account, 0.7, DAY_MS);
    health
        .store_windows(2, std::slice::from_ref(&other))
        .await
        .expect("stored");
    let read = health.read_windows(&[2, 3, 1]).await.expect("read");
    assert_eq!(read.len(), 3);
    assert_eq!(read[0], vec![other]);
    assert!(read[1].is_empty(), "never written: no readings");
    assert_eq!(read[2].len(), 4);
    assert!(health.read_windows(&[]).await.expect("read").is_empty());

    // The next period replaces the last, though less used; the last never comes back.
    let next_week = reading(WindowKind::SevenDay, Scope::Account, 0.02, 7 * DAY_MS);
    let old_period = WindowReading {
        utilization: Some(0.9),
        observed_at_ms: next_week.observed_at_ms + 1_000,
        ..newer_week.clone()
    };
    health
        .store_windows(2, &[next_week.clone(), old_period])
        .await
        .expect("stored");
    assert_eq!(
        health.read_windows(&[2]).await.expect("read").remove(0),
        vec![next_week]
    );
}

/// A week `used` and resetting in six days: not expiring (less left than time), so it orders by
/// headroom, or is shed at 0.9.
fn week_at(used: f64, status: WindowStatus) -> Vec<WindowReading> {
    vec![WindowReading {
        status,
        ..reading(WindowKind::SevenDay, Scope::Account, used, 6 * DAY_MS)
    }]
}

async fn a_nearly_full_week_orders_last_for_new_sessions_but_stays_in_the_plan_through_the_engine(
    store: Store,
) {
    let engine = Engine::new(
        &store,
        vec![account(1, "g", |_| {}), account(2, "g", |_| {})],
    );
    engine
        .selector
        .record_windows(1, week_at(0.95, WindowStatus::AllowedWarning))
        .await
        .expect("recorded");
    engine
        .selector
        .record_windows(2, week_at(0.2, WindowStatus::Allowed))
        .await
        .expect("recorded");
    engine
        .selector
        .record_windows(2, Vec::new())
        .await
        .expect("an empty list is no write");
    for _ in 0..20 {
        let plan = engine.plan(&query("g")).await;
        assert_eq!(
            ids(&plan),
            vec![2, 1],
            "the account with room first; the nearly full one last, never left out"
        );
    }
}

async fn an_account_with_no_window_readings_is_neither_empty_nor_full_through_the_engine(
    store: Store,
) {
    // 1: known, a fifth used; 2: never read; 3: nearly full (shed for new sessions).
    let engine = Engine::new(
        &store,
        vec![
            account(1, "g", |_| {}),
            account(2, "g", |_| {}),
            account(3, "g", |_| {}),
        ],
    );
    engine
        .selector
        .record_windows(1, week_at(0.2, WindowStatus::Allowed))
        .await
        .expect("recorded");
    engine
        .selector
        .record_windows(3, week_at(0.95, WindowStatus::AllowedWarning))
        .await
        .expect("recorded");
    let mut unknown_first = 0;
    for _ in 0..60 {
        let plan = engine.plan(&query("g")).await;
        let order = ids(&plan);
        assert_eq!(order.len(), 3, "every account is planned: {order:?}");
        assert_eq!(
            order[2], 3,
            "the unknown account is not ordered as full: {order:?}"
        );
        if order[0] == 2 {
            unknown_first += 1;
        }
    }
    // Empty (headroom 1.0) would put it before the account with 0.8 left every time.
    assert!(
        (1..60).contains(&unknown_first),
        "the unknown account shares the known peer's standing, first {unknown_first} of 60"
    );
}

/// A model-scoped weekly limit (the Opus one) that ran out keeps account 1 from Opus requests
/// until its reset, and only from them: Sonnet requests still plan both accounts.
async fn a_model_scoped_limit_that_ran_out_keeps_the_account_from_those_models_only(store: Store) {
    let engine = Engine::new(
        &store,
        vec![account(1, "g", |_| {}), account(2, "g", |_| {})],
    );
    let mut opus_week = reading(
        WindowKind::SevenDayModel,
        Scope::Models("opus".into()),
        1.0,
        2 * DAY_MS,
    );
    opus_week.status = WindowStatus::Rejected;
    engine
        .selector
        .record_windows(1, vec![opus_week])
        .await
        .expect("recorded");
    let opus = SelectQuery {
        model: "claude-opus-4".into(),
        ..query("g")
    };
    for _ in 0..10 {
        assert_eq!(
            ids(&engine.plan(&opus).await),
            vec![2],
            "the Opus limit keeps account 1 from Opus requests"
        );
    }
    let mut both = ids(&engine.plan(&query("g")).await);
    both.sort_unstable();
    assert_eq!(
        both,
        vec![1, 2],
        "the Opus limit does not apply to other models"
    );
    // With account 2 gone too, the plan says when the block ends.
    engine
        .selector
        .record_windows(
            2,
            vec![{
                let mut full = reading(
                    WindowKind::SevenDayModel,
                    Scope::Models("opus".into()),
                    1.0,
                    DAY_MS,
                );
                full.status = WindowStatus::Rejected;
                full
            }],
        )
        .await
        .expect("recorded");
    let plan = engine.plan(&opus).await;
    assert!(plan.accounts.is_empty());
    assert_eq!(plan.none_reason, Some(NoneReason::AllBlocked));
    assert!(
        plan.retry_after_ms > DAY_MS as u64 - 60_000 && plan.retry_after_ms <= DAY_MS as u64,
        "the earliest block ends in a day: {}",
        plan.retry_after_ms
    );
}

/// Readings come from relays, whose clocks the selector does not own: a reading stamped in the
/// future (a relay clock ahead) must not outrank the readings that follow it, and a reset further
/// out than any upstream window (a week) is refused rather than kept as a block for months.
async fn a_relay_clock_ahead_or_a_far_reset_cannot_pin_a_window_reading(store: Store) {
    let engine = Engine::new(&store, vec![account(1, "g", |_| {})]);
    let ahead = WindowReading {
        observed_at_ms: now_ms() + 3_600_000,
        ..reading(WindowKind::SevenDay, Scope::Account, 0.9, 3 * DAY_MS)
    };
    engine
        .selector
        .record_windows(1, vec![ahead])
        .await
        .expect("recorded");
    let stored = store
        .health
        .read_windows(&[1])
        .await
        .expect("read")
        .remove(0);
    assert!(
        stored[0].observed_at_ms <= now_ms(),
        "a stamp ahead of the selector's clock is kept as the selector's now"
    );
    store.pass(Duration::from_millis(5)).await;
    // The next period's first answer (less used, a later reset) replaces it.
    let next = reading(WindowKind::SevenDay, Scope::Account, 0.1, 7 * DAY_MS);
    engine
        .selector
        .record_windows(1, vec![next])
        .await
        .expect("recorded");
    let stored = store
        .health
        .read_windows(&[1])
        .await
        .expect("read")
        .remove(0);
    assert_eq!(stored.len(), 1);
    assert_eq!(
        stored[0].utilization,
        Some(0.1),
        "the next period's answer wins over one stamped by a clock an hour ahead"
    );
    let far = reading(
        WindowKind::SevenDayModel,
        Scope::Models("opus".into()),
        1.0,
        90 * DAY_MS,
    );
    assert!(
        engine.selector.record_windows(1, vec![far]).await.is_err(),
        "a reset three months out is no upstream window's"
    );
}

/// Group `strict` moves sessions at 0.9 (and sheds at 0.8); group `g` keeps the deployment's
/// 0.9 / 0.97. The same reading (a week 93 % used) keeps a session on its account in `g` and
/// moves it in `strict`, counted in the group's moved-sessions counter; the gauges count the shed
/// accounts and sum what is left per window kind, per group.
async fn a_groups_own_window_thresholds_move_its_sessions_sooner_and_show_in_its_gauges(
    store: Store,
) {
    let strict = GroupSettings {
        window_shed_at: Some(0.8),
        window_move_at: Some(0.9),
        ..GroupSettings::default()
    };
    let engine = Engine::with_groups(
        &store,
        vec![
            account(1, "g", |_| {}),
            account(2, "g", |_| {}),
            account(3, "strict", |_| {}),
            account(4, "strict", |_| {}),
        ],
        HashMap::from([("strict".to_owned(), strict)]),
    );
    for (id, used) in [(1, 0.93), (2, 0.2), (3, 0.93), (4, 0.2)] {
        engine
            .selector
            .record_windows(id, week_at(used, WindowStatus::Allowed))
            .await
            .expect("recorded");
    }
    for (group, hash, bound) in [("g", "s-g", 1), ("strict", "s-strict", 3)] {
        engine
            .selector
            .bind_session(group, hash, bound)
            .await
            .expect("bound");
    }
    let session = |group: &str, hash: &str| SelectQuery {
        session_hash: Some(hash.into()),
        ..query(group)
    };
    let kept = engine.plan(&session("g", "s-g")).await;
    assert_eq!(
        (ids(&kept), kept.sticky),
        (vec![1, 2], true),
        "below the deployment's move threshold the session stays"
    );
    let moved = engine.plan(&session("strict", "s-strict")).await;
    assert_eq!(
        (ids(&moved), moved.sticky),
        (vec![4, 3], false),
        "past the group's own move threshold the session moves, and the account still serves"
    );
    let metrics = engine.selector.metrics();
    let moved_count = |group: &str| {
        metrics
            .window_sessions_moved
            .with_label_values(&[group])
            .get()
    };
    assert_eq!((moved_count("g"), moved_count("strict")), (0, 1));
    for group in ["g", "strict"] {
        assert_eq!(
            metrics
                .window_shed_accounts
                .with_label_values(&[group])
                .get(),
            1,
            "one account of {group} is past its shed threshold"
        );
        let left = metrics
            .window_headroom
            .with_label_values(&[group, "7d"])
            .get();
        assert!(
            (left - 0.87).abs() < 1e-9,
            "{group}: 0.07 + 0.8 of a week left, got {left}"
        );
    }
}

/// A week the upstream reported used up (`rejected`, no overage paying for more) cannot serve:
/// the account is left out of plans until the week's reset, instead of earning a 429 per
/// request; when every account is out, the plan says so with the earliest reset.
async fn an_account_whose_plan_window_is_used_up_is_left_out_until_its_reset(store: Store) {
    let engine = Engine::new(
        &store,
        vec![account(1, "g", |_| {}), account(2, "g", |_| {})],
    );
    let used_up = |reset_in_ms: i64| {
        vec![WindowReading {
            status: WindowStatus::Rejected,
            ..reading(WindowKind::SevenDay, Scope::Account, 1.0, reset_in_ms)
        }]
    };
    engine
        .selector
        .record_windows(1, used_up(2 * DAY_MS))
        .await
        .expect("recorded");
    engine
        .selector
        .record_windows(2, week_at(0.5, WindowStatus::Allowed))
        .await
        .expect("recorded");
    assert_eq!(ids(&engine.plan(&query("g")).await), vec![2]);
    engine
        .selector
        .record_windows(2, used_up(6 * DAY_MS))
        .await
        .expect("recorded");
    let plan = engine.plan(&query("g")).await;
    assert_eq!(plan.none_reason, Some(NoneReason::AllBlocked));
    let two_days = 2 * DAY_MS as u64;
    assert!(
        (two_days - 60_000..=two_days).contains(&plan.retry_after_ms),
        "the earliest reset: {}",
        plan.retry_after_ms
    );
}
