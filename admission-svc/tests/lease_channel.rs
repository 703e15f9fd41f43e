//! The lease channel (`LeaseChannel`, docs/DESIGN.md §4) against real Redis: many leases on one
//! stream, each conversation answered on its tag exactly as a `Lease` stream would be; `close`
//! of one tag orphans only its lease (resumable within the grace on another replica, by a
//! `Lease` stream or a channel); the channel's end orphans every lease on it; a waiting acquire
//! withdrawn; bad input ends one conversation; tags reused after their end; the bound on open
//! conversations.

use crate::support;

use std::collections::HashSet;
use std::time::Duration;

use poolgate_core::lease::Settings;
use poolgate_lease::channel::ChannelSettings;
use poolgate_proto::admission::v1 as pb;
use poolgate_rpc::service_auth::CallerCheck;
use poolgate_testkit::eventually;
use support::{
    Answer, LeaseChannel, LeaseStream, SERVICE_TOKEN, Said, Store, TestServer, acquire, inflight,
    inflight_one, test_settings,
};

/// A server on `store` with these settings and channel bound.
async fn server(store: &Store, settings: Settings, channel: ChannelSettings) -> TestServer {
    TestServer::start_with(admission_svc::Config {
        settings,
        backend: store.backend_config(),
        callers: CallerCheck::Token(SERVICE_TOKEN.into()),
        channel,
        ..admission_svc::Config::default()
    })
    .await
}

/// Long ttl, so only an orphaning frees a lease while a test runs.
fn long_ttl(orphan_grace: Duration) -> Settings {
    Settings {
        lease_ttl: Duration::from_secs(60),
        orphan_grace,
        ..test_settings()
    }
}

/// Waits until the accounts' live leases are `expected`.
async fn wait_inflight(server: &TestServer, accounts: &[i64], expected: &[u32]) {
    let client = &server.client;
    let waited = eventually(Duration::from_secs(15), || async move {
        let live = inflight(client, accounts).await;
        (live == expected).then_some(())
    })
    .await;
    assert!(
        waited.is_ok(),
        "inflight {:?}, expected {expected:?}",
        inflight(client, accounts).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_leases_on_one_channel_are_each_answered_on_their_tag() {
    let store = Store::redis().await;
    let server = TestServer::on(&store).await;
    let accounts: Vec<i64> = (100..110).collect();
    let mut channel = LeaseChannel::open(&server.client).await;
    // 50 acquires sent before any answer is read: 5 per account, each account's limit.
    for tag in 1..=50u64 {
        let account = accounts[(tag % 10) as usize];
        assert!(channel.send_acquire(tag, acquire(account, 5)).await);
    }
    let mut ids = HashSet::new();
    for tag in 1..=50u64 {
        match channel.answer(tag, &mut Vec::new()).await {
            Answer::Granted(id) => {
                let account = accounts[(tag % 10) as usize];
                assert!(id.starts_with(&format!("{account}.")), "{tag}: {id}");
                assert!(ids.insert(id));
            }
            other => panic!("tag {tag}: {other:?}"),
        }
    }
    assert_eq!(inflight(&server.client, &accounts).await, vec![5; 10]);
    // Over the limit: refused on its own tag, ended, the others untouched.
    assert_eq!(
        channel
            .acquire(51, acquire(accounts[0], 5))
            .await
            .denied_reason(),
        Some(pb::DenyReason::Concurrency)
    );
    assert_eq!(channel.finish(51).await, vec![]);
    for tag in 1..=50u64 {
        assert!(
            matches!(
                channel.heartbeat(tag).await,
                Ok(Some(pb::lease_event::Kind::Renewed(_)))
            ),
            "tag {tag}"
        );
    }
    for tag in 1..=50u64 {
        assert!(
            matches!(
                channel.attempt(tag).await,
                Ok(Some(pb::lease_event::Kind::AttemptAccepted(_)))
            ),
            "tag {tag}"
        );
    }
    for tag in (1..=50u64).rev() {
        assert!(
            matches!(
                channel.release(tag).await,
                Ok(Some(pb::lease_event::Kind::Released(_)))
            ),
            "tag {tag}"
        );
    }
    assert_eq!(inflight(&server.client, &accounts).await, vec![0; 10]);
    // Every conversation ended; the channel ends cleanly when the holder's side does.
    channel.half_close();
    assert_eq!(channel.next_any().await, None);
    assert!(matches!(channel.ended, Some(None)), "{:?}", channel.ended);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_one_tag_orphans_only_its_lease_resumable_on_another_replica() {
    let store = Store::redis().await;
    let settings = long_ttl(Duration::from_secs(3));
    let one = server(&store, settings.clone(), ChannelSettings::default()).await;
    let two = server(&store, settings, ChannelSettings::default()).await;
    let account = 200;
    let terms = acquire(account, 10);
    let mut channel = LeaseChannel::open(&one.client).await;
    let mut ids = Vec::new();
    for tag in 1..=3u64 {
        let Answer::Granted(id) = channel.acquire(tag, terms.clone()).await else {
            panic!("tag {tag} not granted");
        };
        ids.push(id);
    }
    assert!(channel.close(1).await);
    assert_eq!(
        channel.finish(1).await,
        vec![],
        "close ends the conversation"
    );
    // The other tags hold on.
    for tag in [2, 3] {
        assert!(matches!(
            channel.heartbeat(tag).await,
            Ok(Some(pb::lease_event::Kind::Renewed(_)))
        ));
    }
    // Orphaned, not released: resumable on the other replica within the grace, on a lease
    // stream …
    let (mut stream, answer) = LeaseStream::resume(&two.client, &ids[0], terms.clone()).await;
    assert_eq!(answer, Answer::Granted(ids[0].clone()));
    // … or on a channel there.
    assert!(channel.close(2).await);
    assert_eq!(channel.finish(2).await, vec![]);
    let mut elsewhere = LeaseChannel::open(&two.client).await;
    assert_eq!(
        elsewhere.resume(9, &ids[1], terms.clone()).await,
        Answer::Granted(ids[1].clone())
    );
    assert_eq!(inflight_one(&one.client, account).await, 3);
    // Past the grace nothing was cut: every lease is still held where it is now.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert_eq!(inflight_one(&one.client, account).await, 3);
    assert!(matches!(
        stream.heartbeat().await,
        Ok(Some(pb::lease_event::Kind::Renewed(_)))
    ));
    assert!(matches!(
        elsewhere.heartbeat(9).await,
        Ok(Some(pb::lease_event::Kind::Renewed(_)))
    ));
    assert!(matches!(
        channel.heartbeat(3).await,
        Ok(Some(pb::lease_event::Kind::Renewed(_)))
    ));
    // A closed tag, unresumed, is cut to the grace: close tag 3 and nothing holds it after.
    assert!(channel.close(3).await);
    assert_eq!(channel.finish(3).await, vec![]);
    wait_inflight(&one, &[account], &[2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_channel_orphans_every_lease_on_it_at_once() {
    let store = Store::redis().await;
    // A ttl far longer than the test: only the orphaning can free these leases.
    let settings = long_ttl(Duration::from_secs(2));
    let one = server(&store, settings.clone(), ChannelSettings::default()).await;
    let two = server(&store, settings, ChannelSettings::default()).await;
    let accounts = [300, 301];
    let mut channel = LeaseChannel::open(&one.client).await;
    let mut ids = Vec::new();
    for tag in 1..=10u64 {
        let terms = acquire(accounts[(tag % 2) as usize], 10);
        let Answer::Granted(id) = channel.acquire(tag, terms).await else {
            panic!("tag {tag} not granted");
        };
        ids.push((id, accounts[(tag % 2) as usize]));
    }
    // A waiting acquire on the channel too: withdrawn with it.
    let full = 302;
    let mut holder = LeaseChannel::open(&one.client).await;
    assert!(holder.acquire(1, acquire(full, 1)).await.is_granted());
    assert!(
        channel
            .send_acquire(
                11,
                pb::Acquire {
                    wait_ms: 30_000,
                    ..acquire(full, 1)
                }
            )
            .await
    );
    // The wait is registered once `Queued` comes back.
    assert!(matches!(
        channel.next(11).await,
        Some(Said::Event(pb::lease_event::Kind::Queued(_)))
    ));
    assert_eq!(inflight(&one.client, &accounts).await, vec![5, 5]);
    channel.drop_channel();
    // Orphaned, not released: one resumes on the other replica within the grace.
    let (id, account) = ids[0].clone();
    let (mut resumed, answer) = LeaseStream::resume(&two.client, &id, acquire(account, 10)).await;
    assert_eq!(answer, Answer::Granted(id));
    // Every other lease on the channel is cut to the grace (the ttl is a minute).
    let expected = accounts.map(|other| u32::from(other == account));
    wait_inflight(&one, &accounts, &expected).await;
    // The withdrawn acquire took nothing when the holder let go.
    assert!(matches!(
        holder.release(1).await,
        Ok(Some(pb::lease_event::Kind::Released(_)))
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(inflight_one(&one.client, full).await, 0);
    assert!(matches!(
        resumed.heartbeat().await,
        Ok(Some(pb::lease_event::Kind::Renewed(_)))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_is_withdrawn_by_release_or_close_before_its_answer() {
    let store = Store::redis().await;
    let server = TestServer::on(&store).await;
    let account = 400;
    let mut channel = LeaseChannel::open(&server.client).await;
    assert!(channel.acquire(1, acquire(account, 1)).await.is_granted());
    let waiting = pb::Acquire {
        wait_ms: 30_000,
        ..acquire(account, 1)
    };
    for tag in [2, 3] {
        assert!(channel.send_acquire(tag, waiting.clone()).await);
        assert!(matches!(
            channel.next(tag).await,
            Some(Said::Event(pb::lease_event::Kind::Queued(_)))
        ));
    }
    // `Release` withdraws the wait: answered `Released`, then the end.
    assert!(matches!(
        channel.release(2).await,
        Ok(Some(pb::lease_event::Kind::Released(_)))
    ));
    // `close` withdraws it silently.
    assert!(channel.close(3).await);
    assert_eq!(channel.finish(3).await, vec![]);
    // The holder lets go: neither withdrawn acquire takes the slot.
    assert!(matches!(
        channel.release(1).await,
        Ok(Some(pb::lease_event::Kind::Released(_)))
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(inflight_one(&server.client, account).await, 0);
    assert!(channel.acquire(4, acquire(account, 1)).await.is_granted());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_in_one_tag_ends_it_with_code_3_naming_the_field_while_the_others_go_on() {
    let store = Store::redis().await;
    let server = TestServer::on(&store).await;
    let account = 500;
    let mut channel = LeaseChannel::open(&server.client).await;
    assert!(channel.acquire(1, acquire(account, 5)).await.is_granted());
    assert!(channel.acquire(2, acquire(account, 5)).await.is_granted());
    // An acquire without an account.
    assert!(channel.send_acquire(3, acquire(0, 5)).await);
    match channel.finish(3).await.as_slice() {
        [Said::Error(tonic::Code::InvalidArgument, message)] => {
            assert!(message.contains("acquire.account_id"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    // A request without a kind, on a held lease's tag: that conversation ends (its lease is
    // orphaned, as a lease stream's would be).
    assert!(
        channel
            .send_raw(pb::ChannelRequest {
                tag: 2,
                kind: Some(pb::channel_request::Kind::Request(pb::LeaseRequest {
                    kind: None
                })),
                ..Default::default()
            })
            .await
    );
    match channel.finish(2).await.as_slice() {
        [Said::Error(tonic::Code::InvalidArgument, message)] => {
            assert!(message.contains("kind"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    // A release with a spend that is not a number.
    assert!(channel.acquire(4, acquire(account, 5)).await.is_granted());
    assert!(
        channel
            .send(
                4,
                pb::lease_request::Kind::Release(pb::Release {
                    spend_usd: f64::NAN,
                    tokens: 0,
                }),
            )
            .await
    );
    match channel.finish(4).await.as_slice() {
        [Said::Error(tonic::Code::InvalidArgument, message)] => {
            assert!(message.contains("release.spend_usd"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    // A second acquire on a held tag breaks that lease's protocol, as on a lease stream.
    assert!(channel.acquire(5, acquire(account, 5)).await.is_granted());
    assert!(channel.send_acquire(5, acquire(account, 5)).await);
    match channel.finish(5).await.as_slice() {
        [Said::Error(tonic::Code::FailedPrecondition, _)] => {}
        other => panic!("{other:?}"),
    }
    // Tag 1 goes on.
    assert!(matches!(
        channel.heartbeat(1).await,
        Ok(Some(pb::lease_event::Kind::Renewed(_)))
    ));
    assert!(matches!(
        channel.release(1).await,
        Ok(Some(pb::lease_event::Kind::Released(_)))
    ));
    // The ended conversations' leases were orphaned, cut to the grace.
    wait_inflight(&server, &[account], &[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_is_reused_after_its_end_and_a_message_crossing_an_end_is_ignored() {
    let store = Store::redis().await;
    let server = TestServer::on(&store).await;
    let account = 600;
    let mut channel = LeaseChannel::open(&server.client).await;
    let mut ids = HashSet::new();
    for _ in 0..3 {
        let Answer::Granted(id) = channel.acquire(7, acquire(account, 1)).await else {
            panic!("not granted");
        };
        assert!(ids.insert(id));
        assert!(matches!(
            channel.release(7).await,
            Ok(Some(pb::lease_event::Kind::Released(_)))
        ));
    }
    // After a denial's end too.
    assert!(channel.acquire(8, acquire(account, 1)).await.is_granted());
    assert_eq!(
        channel
            .acquire(7, acquire(account, 1))
            .await
            .denied_reason(),
        Some(pb::DenyReason::Concurrency)
    );
    assert_eq!(channel.finish(7).await, vec![]);
    // A heartbeat for a tag with no conversation (it crossed its conversation's end) is not
    // answered: the tag's next conversation gets only its own answers.
    assert!(
        channel
            .send(7, pb::lease_request::Kind::Heartbeat(pb::Heartbeat {}))
            .await
    );
    assert!(
        channel
            .send(
                7,
                pb::lease_request::Kind::Release(pb::Release {
                    spend_usd: 0.0,
                    tokens: 0
                })
            )
            .await
    );
    assert!(channel.close(7).await);
    assert!(matches!(
        channel.release(8).await,
        Ok(Some(pb::lease_event::Kind::Released(_)))
    ));
    assert!(channel.acquire(7, acquire(account, 1)).await.is_granted());
    assert!(matches!(
        channel.heartbeat(7).await,
        Ok(Some(pb::lease_event::Kind::Renewed(_)))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_over_the_bound_are_refused_with_code_8() {
    let store = Store::redis().await;
    let server = server(
        &store,
        test_settings(),
        ChannelSettings {
            max_conversations: 3,
        },
    )
    .await;
    let account = 700;
    let mut channel = LeaseChannel::open(&server.client).await;
    for tag in 1..=3 {
        assert!(
            channel
                .acquire(tag, acquire(account, 10))
                .await
                .is_granted()
        );
    }
    assert!(channel.send_acquire(4, acquire(account, 10)).await);
    match channel.finish(4).await.as_slice() {
        [Said::Error(tonic::Code::ResourceExhausted, message)] => {
            assert!(message.contains("at most 3"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(inflight_one(&server.client, account).await, 3);
    // Another channel has its own bound.
    let mut other = LeaseChannel::open(&server.client).await;
    assert!(other.acquire(1, acquire(account, 10)).await.is_granted());
    // Once a conversation ends, a new one fits.
    assert!(matches!(
        channel.release(2).await,
        Ok(Some(pb::lease_event::Kind::Released(_)))
    ));
    assert!(channel.acquire(4, acquire(account, 10)).await.is_granted());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_channel_message_fails_the_channel_and_orphans_its_leases() {
    let store = Store::redis().await;
    let server = server(
        &store,
        long_ttl(Duration::from_millis(300)),
        ChannelSettings::default(),
    )
    .await;
    let account = 800;
    for malformed in [
        pb::ChannelRequest {
            tag: 0,
            kind: Some(pb::channel_request::Kind::Close(pb::ChannelClose {})),
            ..Default::default()
        },
        pb::ChannelRequest {
            tag: 5,
            ..Default::default()
        },
    ] {
        let mut channel = LeaseChannel::open(&server.client).await;
        assert!(channel.acquire(1, acquire(account, 10)).await.is_granted());
        assert!(channel.send_raw(malformed.clone()).await);
        while channel.next_any().await.is_some() {}
        let field = if malformed.tag == 0 { "tag" } else { "kind" };
        match &channel.ended {
            Some(Some(status)) => {
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
                assert!(status.message().contains(field), "{status}");
            }
            other => panic!("{other:?}"),
        }
        wait_inflight(&server, &[account], &[0]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holders_half_closing_ends_every_conversation_on_the_channel() {
    let store = Store::redis().await;
    let server = server(
        &store,
        long_ttl(Duration::from_millis(300)),
        ChannelSettings::default(),
    )
    .await;
    let account = 900;
    let mut channel = LeaseChannel::open(&server.client).await;
    for tag in 1..=5 {
        assert!(
            channel
                .acquire(tag, acquire(account, 10))
                .await
                .is_granted()
        );
    }
    // A waiting acquire too.
    assert!(
        channel
            .send_acquire(
                6,
                pb::Acquire {
                    wait_ms: 30_000,
                    ..acquire(account, 5)
                }
            )
            .await
    );
    assert!(matches!(
        channel.next(6).await,
        Some(Said::Event(pb::lease_event::Kind::Queued(_)))
    ));
    // The holder still reads: each conversation ends with `end`, then the channel cleanly.
    channel.half_close();
    for tag in 1..=6 {
        assert_eq!(channel.finish(tag).await, vec![], "tag {tag}");
    }
    assert_eq!(channel.next_any().await, None);
    assert!(matches!(channel.ended, Some(None)), "{:?}", channel.ended);
    // Orphaned (the ttl is a minute), and the withdrawn acquire took nothing.
    wait_inflight(&server, &[account], &[0]).await;
}
