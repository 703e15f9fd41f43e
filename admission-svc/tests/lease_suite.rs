//! The lease semantics suite, written once and run against every backend: the memory backend and
//! a real, private Redis per test (docs/DESIGN.md §4).

use crate::support;

use std::time::Duration;

use poolgate_proto::admission::v1 as pb;
use poolgate_testkit::eventually;
use support::{
    Answer, LeaseStream, Store, TestServer, acquire, acquire_then_withdraw, inflight, inflight_one,
    record_spend,
};

macro_rules! backend_suite {
    (manual_clock: [$($name:ident),* $(,)?], real_time: [$($real:ident),* $(,)?] $(,)?) => {
        mod on_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Store::memory_on_a_manual_clock().await).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $real() {
                    super::$real(super::Store::memory().await).await;
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
// those that wait, with a sleep or an `eventually`, for the server to notice a stream's end as
// much as for time to pass (the orphan grace runs from when the server cuts the lease).
backend_suite!(
    manual_clock: [
        concurrency_gate_grants_up_to_the_limit_then_denies,
        release_frees_the_slot_at_once,
        refused_acquire_consumes_nothing_at_any_gate,
        rpm_gate_denies_with_a_retry_after,
        cooling_account_is_refused,
        a_cleared_cooldown_admits_at_once,
        session_window_refuses_unbound_sessions_and_bound_ones_use_the_reserve,
        user_rpm_is_charged_first_and_refunded_when_the_account_refuses,
        attempt_charges_account_rpm_and_a_refusal_keeps_the_lease,
        resume_within_the_grace_keeps_the_lease,
        resume_of_an_unknown_lease_is_denied,
        unary_release_is_idempotent,
        unlimited_account_is_granted_without_state,
        inflight_reads_many_accounts_in_request_order,
        waiter_is_woken_by_a_release,
        full_wait_queue_is_denied_queue_full,
        a_release_before_the_answer_withdraws_the_acquire_and_leaves_no_orphan,
        a_unary_release_is_not_undone_by_the_old_holders_heartbeat,
        a_lost_lease_comes_back_only_with_room_and_a_recent_heartbeat,
        a_refused_acquire_is_one_round_trip_and_writes_nothing,
        a_unary_release_keeps_the_spend,
        attempts_after_a_resume_are_charged_as_new_events,
        a_key_at_its_limit_is_refused_key_concurrency_across_accounts_until_a_release,
    ],
    real_time: [
        abandoned_stream_frees_the_slot_after_the_orphan_grace,
        an_old_stream_ending_after_a_resume_does_not_cut_the_resumed_lease,
        waiter_that_goes_away_leaves_the_queue,
        a_new_acquire_does_not_take_the_slot_a_waiter_is_waiting_for,
        a_second_resume_of_a_held_lease_takes_it_over_and_one_release_ends_it_for_all,
        a_lease_reaped_after_the_orphan_grace_stays_released,
    ],
);

async fn a_key_at_its_limit_is_refused_key_concurrency_across_accounts_until_a_release(
    store: Store,
) {
    let server = TestServer::on(&store).await;
    let keyed = |account| pb::Acquire {
        api_key_id: 9,
        key_concurrency_limit: 2,
        ..acquire(account, 5)
    };
    let (first, answer) = LeaseStream::acquire(&server.client, keyed(1001)).await;
    assert!(answer.is_granted(), "{answer:?}");
    let (_second, answer) = LeaseStream::acquire(&server.client, keyed(1002)).await;
    assert!(answer.is_granted(), "{answer:?}");
    let (_, refused) = LeaseStream::acquire(&server.client, keyed(1003)).await;
    assert_eq!(
        refused.denied_reason(),
        Some(pb::DenyReason::KeyConcurrency)
    );
    let metrics = server.admission.metrics().render();
    assert!(
        metrics.contains("reason=\"key_concurrency\""),
        "refusals counted by limit kind"
    );
    assert!(!metrics.contains("\"9\""), "never by key id");
    first.release(0.0).await;
    let (_, again) = LeaseStream::acquire(&server.client, keyed(1003)).await;
    assert!(again.is_granted(), "{again:?}");
}

async fn concurrency_gate_grants_up_to_the_limit_then_denies(store: Store) {
    let server = TestServer::on(&store).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let (stream, answer) = LeaseStream::acquire(&server.client, acquire(11, 3)).await;
        assert!(answer.is_granted(), "{answer:?}");
        held.push(stream);
    }
    let (_, answer) = LeaseStream::acquire(&server.client, acquire(11, 3)).await;
    assert_eq!(answer.denied_reason(), Some(pb::DenyReason::Concurrency));
    assert_eq!(inflight_one(&server.client, 11).await, 3);
    // Another account is not affected.
    let (_, other) = LeaseStream::acquire(&server.client, acquire(12, 1)).await;
    assert!(other.is_granted());
}

async fn release_frees_the_slot_at_once(store: Store) {
    let server = TestServer::on(&store).await;
    let (stream, answer) = LeaseStream::acquire(&server.client, acquire(21, 1)).await;
    assert!(answer.is_granted());
    stream.release(0.0).await;
    assert_eq!(inflight_one(&server.client, 21).await, 0);
    let (_, again) = LeaseStream::acquire(&server.client, acquire(21, 1)).await;
    assert!(again.is_granted(), "{again:?}");
}

async fn refused_acquire_consumes_nothing_at_any_gate(store: Store) {
    let server = TestServer::on(&store).await;
    let terms = pb::Acquire {
        rpm_limit: 3,
        ..acquire(31, 1)
    };
    let (first, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
    assert!(answer.is_granted());
    for _ in 0..5 {
        let (_, refused) = LeaseStream::acquire(&server.client, terms.clone()).await;
        assert_eq!(refused.denied_reason(), Some(pb::DenyReason::Concurrency));
    }
    if let Some(redis) = store.redis_server() {
        let keys = poolgate_runtime::redis_keys::AccountKeys::new(31);
        let mut conn = redis.client().await.expect("redis client");
        let leases: u32 = redis::cmd("ZCARD")
            .arg(&keys.leases)
            .query_async(&mut conn)
            .await
            .expect("zcard");
        let events: u32 = redis::cmd("ZCARD")
            .arg(&keys.rpm)
            .query_async(&mut conn)
            .await
            .expect("zcard");
        assert_eq!((leases, events), (1, 1), "refusals wrote nothing");
    }
    first.release(0.0).await;
    // Had the five refusals charged RPM, the budget of 3 would be gone already.
    for _ in 0..2 {
        let (stream, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
        assert!(answer.is_granted(), "{answer:?}");
        stream.release(0.0).await;
    }
    let (_, over) = LeaseStream::acquire(&server.client, terms).await;
    assert_eq!(over.denied_reason(), Some(pb::DenyReason::Rpm));
}

async fn rpm_gate_denies_with_a_retry_after(store: Store) {
    let server = TestServer::on(&store).await;
    let terms = pb::Acquire {
        rpm_limit: 2,
        ..acquire(41, 0)
    };
    for _ in 0..2 {
        let (stream, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
        assert!(answer.is_granted());
        stream.release(0.0).await;
    }
    match LeaseStream::acquire(&server.client, terms).await.1 {
        Answer::Denied(pb::DenyReason::Rpm, retry) => {
            assert!(retry > 50_000 && retry <= 60_000, "retry after {retry} ms")
        }
        other => panic!("expected an rpm denial, got {other:?}"),
    }
}

async fn cooling_account_is_refused(store: Store) {
    let server = TestServer::on(&store).await;
    server
        .admission
        .set_cooldown(51, Duration::from_secs(30))
        .await
        .expect("cooldown set");
    // A shorter block never shortens the later deadline.
    server
        .admission
        .set_cooldown(51, Duration::from_secs(1))
        .await
        .expect("cooldown set");
    match LeaseStream::acquire(&server.client, acquire(51, 5)).await.1 {
        Answer::Denied(pb::DenyReason::Cooling, retry) => assert!(retry > 25_000, "retry {retry}"),
        other => panic!("expected cooling, got {other:?}"),
    }
    assert_eq!(inflight_one(&server.client, 51).await, 0);
}

async fn a_cleared_cooldown_admits_at_once(store: Store) {
    let server = TestServer::on(&store).await;
    server
        .admission
        .set_cooldown(52, Duration::from_secs(30))
        .await
        .expect("cooldown set");
    let (_, refused) = LeaseStream::acquire(&server.client, acquire(52, 5)).await;
    assert_eq!(refused.denied_reason(), Some(pb::DenyReason::Cooling));
    server
        .admission
        .clear_cooldown(52)
        .await
        .expect("cooldown cleared");
    let (_, answer) = LeaseStream::acquire(&server.client, acquire(52, 5)).await;
    assert!(answer.is_granted(), "{answer:?}");
    // Clearing an account without a block does nothing.
    server
        .admission
        .clear_cooldown(53)
        .await
        .expect("nothing to clear");
}

async fn session_window_refuses_unbound_sessions_and_bound_ones_use_the_reserve(store: Store) {
    let server = TestServer::on(&store).await;
    let unbound = pb::Acquire {
        session_window_limit_usd: 10.0,
        session_hash: Some("s-1".into()),
        ..acquire(61, 0)
    };
    let bound = pb::Acquire {
        session_bound: true,
        ..unbound.clone()
    };
    let (stream, answer) = LeaseStream::acquire(&server.client, unbound.clone()).await;
    assert!(answer.is_granted());
    stream.release(6.0).await;
    assert_eq!(record_spend(&server.client, 61, 4.0).await, 10.0);
    match LeaseStream::acquire(&server.client, unbound.clone())
        .await
        .1
    {
        Answer::Denied(pb::DenyReason::SessionWindow, retry) => {
            assert!(
                retry > 4 * 3600 * 1000,
                "the window ends about 5 h after its first spend: {retry}"
            )
        }
        other => panic!("expected session_window, got {other:?}"),
    }
    // The bound session continues up to limit × 1.1 = 11 USD.
    let (stream, answer) = LeaseStream::acquire(&server.client, bound.clone()).await;
    assert!(answer.is_granted(), "{answer:?}");
    stream.release(0.5).await;
    let (stream, answer) = LeaseStream::acquire(&server.client, bound.clone()).await;
    assert!(answer.is_granted(), "10.5 < 11: {answer:?}");
    stream.release(0.5).await;
    let (_, answer) = LeaseStream::acquire(&server.client, bound).await;
    assert_eq!(answer.denied_reason(), Some(pb::DenyReason::SessionWindow));
}

async fn user_rpm_is_charged_first_and_refunded_when_the_account_refuses(store: Store) {
    let server = TestServer::on(&store).await;
    let with_user = |account| pb::Acquire {
        user_id: Some("alice".into()),
        user_rpm_limit: 2,
        ..acquire(account, 1)
    };
    let (held, answer) = LeaseStream::acquire(&server.client, with_user(71)).await;
    assert!(answer.is_granted());
    // The account refuses three times; each user charge is refunded.
    for _ in 0..3 {
        let (_, refused) = LeaseStream::acquire(&server.client, with_user(71)).await;
        assert_eq!(refused.denied_reason(), Some(pb::DenyReason::Concurrency));
    }
    if let Some(redis) = store.redis_server() {
        let mut conn = redis.client().await.expect("redis client");
        let events: u32 = redis::cmd("ZCARD")
            .arg(poolgate_runtime::redis_keys::user_rpm("alice"))
            .query_async(&mut conn)
            .await
            .expect("zcard");
        assert_eq!(events, 1, "only the granted acquire is charged");
    }
    held.release(0.0).await;
    let (second, answer) = LeaseStream::acquire(&server.client, with_user(72)).await;
    assert!(
        answer.is_granted(),
        "user budget 2: second request granted: {answer:?}"
    );
    let (_, answer) = LeaseStream::acquire(&server.client, with_user(73)).await;
    assert_eq!(answer.denied_reason(), Some(pb::DenyReason::UserRpm));
    // A denied user charge took no account slot.
    assert_eq!(inflight_one(&server.client, 73).await, 0);
    second.release(0.0).await;
    // Without a user limit nothing is charged to the user.
    let (_, answer) = LeaseStream::acquire(
        &server.client,
        pb::Acquire {
            user_id: Some("alice".into()),
            ..acquire(74, 1)
        },
    )
    .await;
    assert!(answer.is_granted());
}

async fn attempt_charges_account_rpm_and_a_refusal_keeps_the_lease(store: Store) {
    let server = TestServer::on(&store).await;
    let terms = pb::Acquire {
        rpm_limit: 2,
        ..acquire(81, 1)
    };
    let (mut stream, answer) = LeaseStream::acquire(&server.client, terms).await;
    assert!(answer.is_granted());
    assert!(matches!(
        stream.attempt().await,
        Ok(Some(pb::lease_event::Kind::AttemptAccepted(_)))
    ));
    match stream.attempt().await {
        Ok(Some(pb::lease_event::Kind::Denied(denied))) => {
            assert_eq!(denied.reason(), pb::DenyReason::Rpm)
        }
        other => panic!("expected Denied(rpm), got {other:?}"),
    }
    // The lease is still held and still renews.
    assert_eq!(inflight_one(&server.client, 81).await, 1);
    assert!(matches!(
        stream.heartbeat().await,
        Ok(Some(pb::lease_event::Kind::Renewed(_)))
    ));
    stream.release(0.0).await;
    assert_eq!(inflight_one(&server.client, 81).await, 0);
}

async fn abandoned_stream_frees_the_slot_after_the_orphan_grace(store: Store) {
    let server = TestServer::on(&store).await;
    let (stream, answer) = LeaseStream::acquire(&server.client, acquire(91, 1)).await;
    assert!(answer.is_granted());
    let started = std::time::Instant::now();
    stream.abandon();
    eventually(Duration::from_secs(2), || async {
        (inflight_one(&server.client, 91).await == 0).then_some(())
    })
    .await
    .expect("slot freed after the 300 ms grace, well before the 3 s ttl");
    assert!(started.elapsed() < Duration::from_secs(2));
    let (_, again) = LeaseStream::acquire(&server.client, acquire(91, 1)).await;
    assert!(again.is_granted());
}

async fn resume_within_the_grace_keeps_the_lease(store: Store) {
    let server = TestServer::on(&store).await;
    let terms = acquire(101, 1);
    let (stream, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
    let Answer::Granted(lease_id) = answer else {
        panic!("{answer:?}")
    };
    stream.abandon();
    let (mut resumed, answer) = LeaseStream::resume(&server.client, &lease_id, terms.clone()).await;
    assert_eq!(answer, Answer::Granted(lease_id.clone()));
    // Well past the grace, the resumed lease still holds the slot.
    store.pass(Duration::from_millis(600)).await;
    assert_eq!(inflight_one(&server.client, 101).await, 1);
    let (_, refused) = LeaseStream::acquire(&server.client, terms).await;
    assert_eq!(refused.denied_reason(), Some(pb::DenyReason::Concurrency));
    assert!(matches!(
        resumed.heartbeat().await,
        Ok(Some(pb::lease_event::Kind::Renewed(_)))
    ));
    resumed.release(0.0).await;
    assert_eq!(inflight_one(&server.client, 101).await, 0);
}

async fn an_old_stream_ending_after_a_resume_does_not_cut_the_resumed_lease(store: Store) {
    let server = TestServer::on(&store).await;
    let terms = acquire(105, 1);
    let (old, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
    let Answer::Granted(lease_id) = answer else {
        panic!("{answer:?}")
    };
    // The relay resumed elsewhere before this replica noticed the old stream's end.
    let (resumed, answer) = LeaseStream::resume(&server.client, &lease_id, terms.clone()).await;
    assert_eq!(answer, Answer::Granted(lease_id));
    old.abandon();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        inflight_one(&server.client, 105).await,
        1,
        "the late orphan did not cut the resumed lease"
    );
    resumed.release(0.0).await;
    assert_eq!(inflight_one(&server.client, 105).await, 0);
}

async fn resume_of_an_unknown_lease_is_denied(store: Store) {
    let server = TestServer::on(&store).await;
    let (_, answer) = LeaseStream::resume(&server.client, "111.abc.9", acquire(111, 1)).await;
    assert_eq!(answer.denied_reason(), Some(pb::DenyReason::LeaseUnknown));
}

async fn unary_release_is_idempotent(store: Store) {
    let server = TestServer::on(&store).await;
    let (_stream, answer) = LeaseStream::acquire(&server.client, acquire(121, 1)).await;
    let Answer::Granted(lease_id) = answer else {
        panic!("{answer:?}")
    };
    let mut client = server.client.clone();
    let first = client
        .release(pb::ReleaseRequest {
            lease_id: lease_id.clone(),
            ..Default::default()
        })
        .await
        .expect("release")
        .into_inner();
    let second = client
        .release(pb::ReleaseRequest {
            lease_id,
            ..Default::default()
        })
        .await
        .expect("release again")
        .into_inner();
    assert!(first.released);
    assert!(!second.released);
    assert_eq!(inflight_one(&server.client, 121).await, 0);
}

async fn unlimited_account_is_granted_without_state(store: Store) {
    let server = TestServer::on(&store).await;
    let terms = pb::Acquire {
        concurrency_limit: -1,
        rpm_limit: 0,
        session_window_limit_usd: -5.0,
        ..acquire(131, 0)
    };
    let mut streams = Vec::new();
    for _ in 0..20 {
        let (stream, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
        assert!(answer.is_granted());
        streams.push(stream);
    }
    let (mut one, _) = LeaseStream::acquire(&server.client, terms).await;
    assert!(matches!(
        one.heartbeat().await,
        Ok(Some(pb::lease_event::Kind::Renewed(_)))
    ));
    assert!(matches!(
        one.attempt().await,
        Ok(Some(pb::lease_event::Kind::AttemptAccepted(_)))
    ));
    one.release(1.0).await;
    for stream in streams.drain(..10) {
        stream.release(0.0).await;
    }
    for stream in streams {
        stream.abandon();
    }
    assert_eq!(inflight_one(&server.client, 131).await, 0);
    if let Some(redis) = store.redis_server() {
        let mut conn = redis.client().await.expect("redis client");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .expect("keys");
        // The replica registry (and its replicas' reports) is admission's own; no key belongs to
        // the account.
        let registry = [
            poolgate_runtime::redis_keys::admission_replicas(),
            poolgate_runtime::redis_keys::admission_replica_reports(),
        ];
        let account_keys: Vec<&String> = keys.iter().filter(|k| !registry.contains(k)).collect();
        assert!(
            account_keys.is_empty(),
            "an unlimited account leaves no key: {keys:?}"
        );
    }
}

async fn inflight_reads_many_accounts_in_request_order(store: Store) {
    let server = TestServer::on(&store).await;
    let mut held = Vec::new();
    for (account, count) in [(141, 1), (142, 3), (143, 2)] {
        for _ in 0..count {
            let (stream, answer) = LeaseStream::acquire(&server.client, acquire(account, 10)).await;
            assert!(answer.is_granted());
            held.push(stream);
        }
    }
    assert_eq!(
        inflight(&server.client, &[143, 144, 141, 142]).await,
        vec![2, 0, 1, 3]
    );
}

async fn waiter_is_woken_by_a_release(store: Store) {
    // Waiters poll every 2.5-7.5 s here, so only the release's wake-up can grant within 900 ms.
    let mut settings = support::test_settings();
    settings.wait_poll_initial = Duration::from_secs(5);
    settings.wait_poll_max = Duration::from_secs(5);
    let server = TestServer::on_with(&store, settings).await;
    let (holder, answer) = LeaseStream::acquire(&server.client, acquire(151, 1)).await;
    assert!(answer.is_granted());
    let (mut waiter, position) = LeaseStream::queued(
        &server.client,
        pb::Acquire {
            wait_ms: 10_000,
            ..acquire(151, 1)
        },
    )
    .await;
    assert_eq!(position, 1);
    let released_at = std::time::Instant::now();
    holder.release(0.0).await;
    let answer = waiter.answer().await;
    assert!(answer.is_granted(), "{answer:?}");
    // Woken by the release, not by a poll (the first one is 2.5 s away at the earliest).
    assert!(
        released_at.elapsed() < Duration::from_millis(900),
        "{:?}",
        released_at.elapsed()
    );
}

async fn full_wait_queue_is_denied_queue_full(store: Store) {
    let mut settings = support::test_settings();
    settings.max_waiting = 2;
    let server = TestServer::on_with(&store, settings).await;
    let (_holder, answer) = LeaseStream::acquire(&server.client, acquire(161, 1)).await;
    assert!(answer.is_granted());
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let (waiter, _) = LeaseStream::queued(
            &server.client,
            pb::Acquire {
                wait_ms: 1_500,
                ..acquire(161, 1)
            },
        )
        .await;
        waiters.push(waiter);
    }
    let (_, answer) = LeaseStream::acquire(
        &server.client,
        pb::Acquire {
            wait_ms: 1_500,
            ..acquire(161, 1)
        },
    )
    .await;
    assert_eq!(answer.denied_reason(), Some(pb::DenyReason::QueueFull));
    for mut waiter in waiters {
        let answer = waiter.answer().await;
        assert_eq!(
            answer.denied_reason(),
            Some(pb::DenyReason::Concurrency),
            "timed out waiting"
        );
    }
}

async fn waiter_that_goes_away_leaves_the_queue(store: Store) {
    let mut settings = support::test_settings();
    settings.max_waiting = 1;
    let server = TestServer::on_with(&store, settings).await;
    let (_holder, answer) = LeaseStream::acquire(&server.client, acquire(171, 1)).await;
    assert!(answer.is_granted());
    let client = server.client.clone();
    let waiter = tokio::spawn(async move {
        LeaseStream::acquire(
            &client,
            pb::Acquire {
                wait_ms: 60_000,
                ..acquire(171, 1)
            },
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    waiter.abort();
    // Once the first waiter's stream is gone its queue place frees up: a second waiter fits.
    eventually(Duration::from_secs(3), || {
        let client = server.client.clone();
        async move {
            let (_, answer) = LeaseStream::acquire(
                &client,
                pb::Acquire {
                    wait_ms: 100,
                    ..acquire(171, 1)
                },
            )
            .await;
            (answer.denied_reason() == Some(pb::DenyReason::Concurrency)).then_some(())
        }
    })
    .await
    .expect("the abandoned waiter left the queue");
}

async fn a_release_before_the_answer_withdraws_the_acquire_and_leaves_no_orphan(store: Store) {
    let server = TestServer::on(&store).await;
    // A free slot: the grant and the withdrawal race; either way the slot is free at once, not
    // after the orphan grace.
    for _ in 0..5 {
        let events = acquire_then_withdraw(&server.client, acquire(181, 1), Duration::ZERO).await;
        assert!(
            matches!(events.last(), Some(pb::lease_event::Kind::Released(_))),
            "{events:?}"
        );
        assert_eq!(inflight_one(&server.client, 181).await, 0, "{events:?}");
    }
    // A waiting acquire: withdrawn from the queue, answered `Released`, never granted.
    let (holder, answer) = LeaseStream::acquire(&server.client, acquire(182, 1)).await;
    assert!(answer.is_granted());
    let waiting = pb::Acquire {
        wait_ms: 30_000,
        ..acquire(182, 1)
    };
    let events = acquire_then_withdraw(&server.client, waiting, Duration::from_millis(200)).await;
    assert!(
        events
            .iter()
            .all(|e| !matches!(e, pb::lease_event::Kind::Granted(_))),
        "{events:?}"
    );
    assert!(
        matches!(events.last(), Some(pb::lease_event::Kind::Released(_))),
        "{events:?}"
    );
    holder.release(0.0).await;
    assert_eq!(inflight_one(&server.client, 182).await, 0);
}

async fn a_new_acquire_does_not_take_the_slot_a_waiter_is_waiting_for(store: Store) {
    // Waiters poll every 1-3 s here, and the slot frees without waking anyone (the holder's
    // stream ends: the slot is free after the 300 ms orphan grace), so without fairness the
    // newcomer would find the slot free long before the waiter looks again.
    let mut settings = support::test_settings();
    settings.wait_poll_initial = Duration::from_secs(2);
    settings.wait_poll_max = Duration::from_secs(2);
    let server = TestServer::on_with(&store, settings).await;
    let (holder, answer) = LeaseStream::acquire(&server.client, acquire(191, 1)).await;
    assert!(answer.is_granted());
    let client = server.client.clone();
    let waiter = tokio::spawn(async move {
        let terms = pb::Acquire {
            wait_ms: 10_000,
            ..acquire(191, 1)
        };
        LeaseStream::acquire(&client, terms).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    holder.abandon();
    eventually(Duration::from_secs(2), || async {
        (inflight_one(&server.client, 191).await == 0).then_some(())
    })
    .await
    .expect("the abandoned slot frees after the grace");
    // The slot is free, but it is the waiter's: a newcomer that will not wait is refused, and
    // its try nudges the waiter, which takes the slot at once instead of at its next poll.
    let (_, barging) = LeaseStream::acquire(&server.client, acquire(191, 1)).await;
    assert_eq!(
        barging.denied_reason(),
        Some(pb::DenyReason::Concurrency),
        "{barging:?}"
    );
    let nudged = std::time::Instant::now();
    let (_held, answer) = waiter.await.expect("waiter task");
    assert!(answer.is_granted(), "the waiter got the slot: {answer:?}");
    assert!(
        nudged.elapsed() < Duration::from_millis(900),
        "woken by the newcomer's nudge, not its 1-3 s poll: {:?}",
        nudged.elapsed()
    );
}

fn lost_reason(event: Result<Option<pb::lease_event::Kind>, tonic::Status>) -> pb::LostReason {
    match event {
        Ok(Some(pb::lease_event::Kind::Lost(lost))) => lost.lost_reason(),
        other => panic!("expected Lost, got {other:?}"),
    }
}

async fn unary_release(server: &TestServer, lease_id: &str) -> bool {
    let mut client = server.client.clone();
    client
        .release(pb::ReleaseRequest {
            lease_id: lease_id.to_owned(),
            ..Default::default()
        })
        .await
        .expect("release")
        .into_inner()
        .released
}

/// On a limit of 1, L1 released by the unary RPC, L2 granted, then L1's holder
/// heartbeats: it used to get `Renewed{restored}` and the account held 2 leases.
async fn a_unary_release_is_not_undone_by_the_old_holders_heartbeat(store: Store) {
    let server = TestServer::on(&store).await;
    let (mut old, answer) = LeaseStream::acquire(&server.client, acquire(201, 1)).await;
    let Answer::Granted(old_id) = answer else {
        panic!("{answer:?}")
    };
    assert!(unary_release(&server, &old_id).await);
    let (new, answer) = LeaseStream::acquire(&server.client, acquire(201, 1)).await;
    assert!(answer.is_granted(), "{answer:?}");
    assert_eq!(lost_reason(old.heartbeat().await), pb::LostReason::Released);
    assert_eq!(inflight_one(&server.client, 201).await, 1);
    // Released stays released: not resumable either, and the new lease is untouched.
    let (_, resumed) = LeaseStream::resume(&server.client, &old_id, acquire(201, 1)).await;
    assert_eq!(resumed, Answer::Lost(pb::LostReason::Released));
    new.release(0.0).await;
    assert_eq!(inflight_one(&server.client, 201).await, 0);
    // Without a new grant in between, the old holder does not get the lease back either.
    let (mut held, answer) = LeaseStream::acquire(&server.client, acquire(202, 1)).await;
    let Answer::Granted(held_id) = answer else {
        panic!("{answer:?}")
    };
    assert!(unary_release(&server, &held_id).await);
    assert_eq!(
        lost_reason(held.heartbeat().await),
        pb::LostReason::Released
    );
    assert_eq!(inflight_one(&server.client, 202).await, 0);
}

/// A lease the backend lost comes back with its holder's heartbeat only while the account has
/// room and the holder kept heartbeating: one silent for a whole ttl is told `Lost{EXPIRED}`
/// (its slot may have gone to someone else, its release fence may have fallen).
async fn a_lost_lease_comes_back_only_with_room_and_a_recent_heartbeat(store: Store) {
    let mut settings = support::test_settings();
    settings.lease_ttl = Duration::from_millis(800);
    let server = TestServer::on_with(&store, settings).await;
    let (mut silent, answer) = LeaseStream::acquire(&server.client, acquire(211, 2)).await;
    assert!(answer.is_granted());
    store.pass(Duration::from_millis(1_000)).await;
    assert_eq!(
        lost_reason(silent.heartbeat().await),
        pb::LostReason::Expired
    );
    assert_eq!(inflight_one(&server.client, 211).await, 0, "not re-added");
    let Some(redis) = store.redis_server() else {
        return;
    };
    // Redis loses the lease alone (the account's state kept: no wipe): limit 1, a new grant
    // took the slot.
    let (mut old, answer) = LeaseStream::acquire(&server.client, acquire(212, 1)).await;
    assert!(answer.is_granted());
    let (mut roomy, answer) = LeaseStream::acquire(&server.client, acquire(213, 2)).await;
    assert!(answer.is_granted());
    let mut conn = redis.client().await.expect("redis");
    for account in [212, 213] {
        let _: i64 = redis::cmd("DEL")
            .arg(poolgate_runtime::redis_keys::AccountKeys::new(account).leases)
            .query_async(&mut conn)
            .await
            .expect("lease set deleted");
    }
    let (_newer, answer) = LeaseStream::acquire(&server.client, acquire(212, 1)).await;
    assert!(answer.is_granted(), "{answer:?}");
    assert_eq!(lost_reason(old.heartbeat().await), pb::LostReason::NoRoom);
    assert_eq!(inflight_one(&server.client, 212).await, 1);
    if let Some(policy) = server.admission.policy() {
        // The lost leases (`silent`, `old`) left the held set: a later outage does not adopt
        // them. `roomy` and `_newer` are held.
        assert_eq!(policy.held_count(), 2);
    }
    // With room, the heartbeat restores its lease.
    match roomy.heartbeat().await {
        Ok(Some(pb::lease_event::Kind::Renewed(renewed))) => assert!(renewed.restored),
        other => panic!("expected Renewed{{restored}}, got {other:?}"),
    }
    assert_eq!(inflight_one(&server.client, 213).await, 1);
}

/// The decision for a second `Resume` of a lease that is still held: granted, the last resume
/// holds it, it stays one slot, and one release ends it for every stream.
async fn a_second_resume_of_a_held_lease_takes_it_over_and_one_release_ends_it_for_all(
    store: Store,
) {
    let server = TestServer::on(&store).await;
    let terms = acquire(221, 1);
    let (mut first, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
    let Answer::Granted(lease_id) = answer else {
        panic!("{answer:?}")
    };
    let (mut second, answer) = LeaseStream::resume(&server.client, &lease_id, terms.clone()).await;
    assert_eq!(answer, Answer::Granted(lease_id.clone()));
    let (third, answer) = LeaseStream::resume(&server.client, &lease_id, terms.clone()).await;
    assert_eq!(answer, Answer::Granted(lease_id.clone()));
    assert_eq!(inflight_one(&server.client, 221).await, 1, "still one slot");
    // The earlier holders' streams ending do not cut the lease: the last resume holds it.
    second
        .send(pb::lease_request::Kind::Heartbeat(pb::Heartbeat {}))
        .await;
    assert!(matches!(
        second.next_event().await,
        Ok(Some(pb::lease_event::Kind::Renewed(_)))
    ));
    second.abandon();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        inflight_one(&server.client, 221).await,
        1,
        "not cut by a stale holder"
    );
    third.release(0.0).await;
    assert_eq!(inflight_one(&server.client, 221).await, 0);
    assert_eq!(
        lost_reason(first.heartbeat().await),
        pb::LostReason::Released
    );
    let (_, again) = LeaseStream::resume(&server.client, &lease_id, terms).await;
    assert_eq!(again, Answer::Lost(pb::LostReason::Released));
}

/// The orphan reaper is a release path too: once the grace ran out the lease is fenced.
async fn a_lease_reaped_after_the_orphan_grace_stays_released(store: Store) {
    let server = TestServer::on(&store).await;
    let terms = acquire(231, 1);
    let (stream, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
    let Answer::Granted(lease_id) = answer else {
        panic!("{answer:?}")
    };
    stream.abandon();
    eventually(Duration::from_secs(2), || async {
        (inflight_one(&server.client, 231).await == 0).then_some(())
    })
    .await
    .expect("reaped after the 300 ms grace");
    let (_, answer) = LeaseStream::resume(&server.client, &lease_id, terms).await;
    assert_eq!(answer, Answer::Lost(pb::LostReason::Released));
    assert_eq!(inflight_one(&server.client, 231).await, 0);
}

/// Invariant 3: on one node the user RPM gate joins the account gates in one script, so a
/// refusal at any gate is one round trip and writes nothing (it used to be a user charge, the
/// account script and a refund: three, on every try).
async fn a_refused_acquire_is_one_round_trip_and_writes_nothing(store: Store) {
    let server = TestServer::on(&store).await;
    let terms = |account| pb::Acquire {
        user_id: Some("bob".into()),
        user_rpm_limit: 5,
        rpm_limit: 100,
        ..acquire(account, 1)
    };
    let (_held, answer) = LeaseStream::acquire(&server.client, terms(241)).await;
    assert!(answer.is_granted());
    let round_trips = || server.admission.policy().map(|p| p.redis_round_trips());
    let before = round_trips();
    const REFUSALS: u64 = 20;
    for _ in 0..REFUSALS {
        let (_, refused) = LeaseStream::acquire(&server.client, terms(241)).await;
        assert_eq!(refused.denied_reason(), Some(pb::DenyReason::Concurrency));
    }
    if let (Some(before), Some(after)) = (before, round_trips()) {
        // The replica registry heartbeats once a second on its own: allow two of those.
        assert!(
            after - before <= REFUSALS + 2,
            "{} round trips for {REFUSALS} refusals",
            after - before
        );
    }
    if let Some(redis) = store.redis_server() {
        let mut conn = redis.client().await.expect("redis client");
        let user_events: u32 = redis::cmd("ZCARD")
            .arg(poolgate_runtime::redis_keys::user_rpm("bob"))
            .query_async(&mut conn)
            .await
            .expect("zcard");
        let account_events: u32 = redis::cmd("ZCARD")
            .arg(poolgate_runtime::redis_keys::AccountKeys::new(241).rpm)
            .query_async(&mut conn)
            .await
            .expect("zcard");
        assert_eq!(
            (user_events, account_events),
            (1, 1),
            "refusals wrote nothing"
        );
    }
    // The user's budget is intact: 4 more requests on other accounts, then the user gate.
    for account in 242..246 {
        let (_, answer) = LeaseStream::acquire(&server.client, terms(account)).await;
        assert!(answer.is_granted(), "{answer:?}");
    }
    let (_, answer) = LeaseStream::acquire(&server.client, terms(246)).await;
    assert_eq!(answer.denied_reason(), Some(pb::DenyReason::UserRpm));
    assert_eq!(inflight_one(&server.client, 246).await, 0);
}

/// `ReleaseRequest.spend_usd`: a holder whose stream broke releases by id and keeps its spend.
async fn a_unary_release_keeps_the_spend(store: Store) {
    let server = TestServer::on(&store).await;
    let terms = pb::Acquire {
        session_window_limit_usd: 10.0,
        ..acquire(251, 1)
    };
    let (_stream, answer) = LeaseStream::acquire(&server.client, terms).await;
    let Answer::Granted(lease_id) = answer else {
        panic!("{answer:?}")
    };
    let mut client = server.client.clone();
    let released = client
        .release(pb::ReleaseRequest {
            lease_id,
            spend_usd: 2.5,
            tokens: 0,
        })
        .await
        .expect("release")
        .into_inner();
    assert!(released.released);
    assert_eq!(record_spend(&server.client, 251, 0.0).await, 2.5);
    assert_eq!(inflight_one(&server.client, 251).await, 0);
}

/// Attempt event ids are unique across resumes: a resumed stream counts its attempts from 1
/// again, and the same event id would have been charged once for two upstream calls.
async fn attempts_after_a_resume_are_charged_as_new_events(store: Store) {
    let server = TestServer::on(&store).await;
    let terms = pb::Acquire {
        rpm_limit: 3,
        ..acquire(261, 1)
    };
    let (mut first, answer) = LeaseStream::acquire(&server.client, terms.clone()).await;
    let Answer::Granted(lease_id) = answer else {
        panic!("{answer:?}")
    };
    assert!(matches!(
        first.attempt().await,
        Ok(Some(pb::lease_event::Kind::AttemptAccepted(_)))
    ));
    first.abandon();
    let (mut resumed, answer) = LeaseStream::resume(&server.client, &lease_id, terms).await;
    assert!(answer.is_granted(), "{answer:?}");
    assert!(matches!(
        resumed.attempt().await,
        Ok(Some(pb::lease_event::Kind::AttemptAccepted(_)))
    ));
    // The acquire and two attempts used the budget of 3.
    match resumed.attempt().await {
        Ok(Some(pb::lease_event::Kind::Denied(denied))) => {
            assert_eq!(denied.reason(), pb::DenyReason::Rpm)
        }
        other => panic!("expected Denied(rpm), got {other:?}"),
    }
    resumed.release(0.0).await;
}
