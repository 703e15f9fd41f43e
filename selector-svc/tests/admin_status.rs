//! The operator's `status` (the status page's data) against a running selector, over real
//! Postgres and Redis: `ReadStatus` answers every account with its live status, its leases and
//! what it used of its RPM and session-window limits (admission's own counts), its usage windows
//! and the block that decides its status with its reason and time left; and admission's failure
//! policy and state from the replica registry. Only with the admin token.

use crate::support;

use std::time::Duration;

use clap::Parser;
use poolgate_core::Clock;
use poolgate_core::account::AccountStatus;
use poolgate_core::lease::{LeaseTerms, Settings};
use poolgate_core::windows::{Scope, WindowKind, WindowReading, WindowStatus};
use poolgate_lease::metrics::Metrics;
use poolgate_lease::policy::{FailurePolicy, PolicySettings};
use poolgate_lease::{AcquireOutcome, LeaseStore};
use poolgate_operator::grpc::SelectorAdmin;
use poolgate_operator::{AdminEndpoint, OperatorError, Verb};
use poolgate_proto::convert;
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_select::health::Health;
use support::{ADMIN_TOKEN, Backends, Replica, SERVICE_TOKEN, credential, fast_settings};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

fn verb(args: &[&str]) -> Verb {
    Cli::try_parse_from(std::iter::once("admin").chain(args.iter().copied()))
        .expect("a verb")
        .verb
}

fn terms(account_id: i64) -> LeaseTerms {
    LeaseTerms {
        account_id,
        concurrency_limit: 5,
        rpm_limit: 60,
        user: None,
        session_hash: None,
        session_window_limit_micros: 10_000_000,
        session_bound: false,
        ignore_cooldown: false,
        key: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_status_shows_each_accounts_live_status_load_windows_and_block_and_admissions_state() {
    let backends = Backends::start().await;
    let limited = backends
        .account("limited", "g", |a| {
            a.rpm_limit = 60;
            a.session_window_limit_usd = 10.0;
        })
        .await;
    let blocked = backends.account("blocked", "g", |_| {}).await;
    let parked = backends.account("parked", "h", |_| {}).await;
    backends
        .store
        .set_status(parked, AccountStatus::Disabled, "maintenance")
        .await
        .expect("status set");
    // One admission replica on the same Redis, registered under `divided`.
    let _admission = poolgate_lease::start(
        &LeaseStore::Redis {
            target: RedisTarget::Single(backends.redis.url()),
            options: RedisOptions::default(),
            policy: PolicySettings {
                policy: FailurePolicy::Divided,
                ..PolicySettings::default()
            },
        },
        Settings::default(),
        Metrics::new(),
        Clock::system(),
    )
    .await
    .expect("an admission replica starts");
    let replica = Replica::start(backends.config(fast_settings())).await;

    // `blocked` is hard-blocked as a confirmed refusal blocks it; `limited` holds two leases and
    // finished a third request that spent $1.25.
    replica
        .built
        .health
        .hard_block(blocked, 60_000, "quota_gone", 402, "credit balance too low")
        .await
        .expect("blocked");
    let leases = &replica.built.probe_leases;
    let cancel = CancellationToken::new();
    let mut held = Vec::new();
    for _ in 0..3 {
        match leases
            .acquire(&terms(limited), Duration::from_secs(1), &cancel, |_| {})
            .await
            .expect("redis answers")
        {
            AcquireOutcome::Granted(lease) => held.push(lease),
            other => panic!("a lease, got {other:?}"),
        }
    }
    let finished = held.pop().expect("three leases");
    leases
        .release(&finished, Some(&terms(limited)), 1_250_000)
        .await;
    let now = poolgate_core::now_ms();
    let reading = WindowReading {
        kind: WindowKind::FiveHour,
        scope: Scope::Account,
        utilization: Some(0.42),
        reset_at_ms: now + 3_600_000,
        length_ms: Some(5 * 3_600_000),
        status: WindowStatus::Allowed,
        observed_at_ms: now - 5_000,
    };
    replica
        .client
        .clone()
        .record_windows(convert::windows_request([(limited, vec![reading])]))
        .await
        .expect("recorded");

    let operator = SelectorAdmin::connect(
        &format!("http://{}", replica.addr),
        ADMIN_TOKEN,
        Some(SERVICE_TOKEN),
    )
    .await
    .expect("the admin API answers");
    let status = operator.status().await.expect("status");
    assert_eq!(
        (status.admission.as_str(), status.failure_policy.as_str()),
        ("ok", "divided")
    );
    assert_eq!(status.admission_replicas.len(), 1);
    assert_eq!(status.admission_replicas[0].state, "ok");
    let ids: Vec<i64> = status.accounts.iter().map(|a| a.id).collect();
    assert_eq!(ids, [limited, blocked, parked], "every account, by id");

    let row = &status.accounts[0];
    assert_eq!(
        (row.name.as_str(), row.status.as_str(), row.leases),
        ("limited", "active", Some(2)),
        "the live leases are counted"
    );
    assert_eq!(row.rpm_used, Some(3), "every admitted request this minute");
    assert_eq!((row.rpm_limit, row.concurrency_limit), (60, 5));
    assert_eq!(row.session_spend_usd, Some(1.25));
    assert_eq!(row.session_window_limit_usd, 10.0);
    assert_eq!(row.windows.len(), 1);
    assert_eq!(
        (row.windows[0].kind.as_str(), row.windows[0].utilization),
        ("5h", Some(0.42))
    );
    assert!(row.windows[0].age_ms >= 5_000);
    assert_eq!((row.block_reason.as_str(), row.block_left_ms), ("", 0));
    let secret = credential("limited");
    assert!(secret.ends_with(row.credential_masked.trim_start_matches('…')));
    assert!(row.credential_masked.chars().count() <= 5);

    let row = &status.accounts[1];
    assert_eq!(row.status, "hard_blocked");
    assert_eq!(
        row.block_reason,
        "hard quota_gone 402: credit balance too low"
    );
    assert!(
        row.block_left_ms > 0 && row.block_left_ms <= 60_000,
        "{}",
        row.block_left_ms
    );
    assert_eq!(row.leases, Some(0));
    assert_eq!(row.rpm_used, None, "no RPM limit: not counted");
    assert_eq!(row.session_spend_usd, None);

    let row = &status.accounts[2];
    assert_eq!(
        (row.status.as_str(), row.status_reason.as_str()),
        ("disabled", "maintenance")
    );

    // The CLI's text: the admission line, then one line per account.
    let text = poolgate_operator::execute(&operator, &verb(&["status"]))
        .await
        .expect("status");
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("admission=ok\tfailure_policy=divided\treplicas="),
        "{text}"
    );
    assert!(
        lines[1]
            .contains("status=active\tleases=2/5\trpm=3/60\tsession_usd=1.25/10\twindows=5h=42%"),
        "{text}"
    );
    assert!(
        lines[2].contains("status=hard_blocked\t")
            && lines[2].contains("block=hard quota_gone 402"),
        "{text}"
    );
    assert!(!text.contains(&secret), "never the credential");

    // Without the admin token, nothing.
    let stranger = SelectorAdmin::connect(
        &format!("http://{}", replica.addr),
        "not-the-token",
        Some(SERVICE_TOKEN),
    )
    .await
    .expect("connects");
    assert!(matches!(
        stranger.status().await,
        Err(OperatorError::Unauthenticated(_))
    ));
    drop(held);
}
