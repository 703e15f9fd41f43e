use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use poolgate_core::account::{
    Account, AccountStatus, ApiKeyRecord, CredentialKind, OAuthState, Platform, Secret,
};
use poolgate_core::health::{AccountHealth, Breaker};
use poolgate_core::view::AccountState;

use super::{PoolState, ViewFilter};
use crate::probe::tests::test_account;
use crate::snapshot::Snapshot;

fn account(id: i64, group: &str) -> Account {
    Account {
        id,
        name: format!("a{id}"),
        group: group.into(),
        ..test_account(
            Platform::Anthropic,
            CredentialKind::ApiKey,
            "sk-x",
            "http://u",
        )
    }
}

fn key(id: i64, group: &str) -> (Vec<u8>, ApiKeyRecord) {
    (
        vec![id as u8; 32],
        ApiKeyRecord {
            id,
            name: format!("k{id}"),
            prefix: "pg-".into(),
            user: "u".into(),
            group: group.into(),
            user_rpm_limit: 0,
            active: true,
            access: Default::default(),
            limits: Default::default(),
        },
    )
}

fn snapshot(accounts: Vec<Account>) -> Arc<Snapshot> {
    Arc::new(Snapshot::new(
        vec![],
        accounts,
        [key(1, "g"), key(2, "other")].into_iter().collect(),
        HashMap::new(),
    ))
}

fn healthy(id: i64) -> AccountState {
    AccountState {
        account_id: id,
        health: Some(AccountHealth::HEALTHY),
        confirming: false,
        windows: vec![],
    }
}

fn pool(snapshot: &Arc<Snapshot>, states: Vec<AccountState>, read_at: Instant) -> PoolState {
    PoolState {
        snapshot: snapshot.clone(),
        states: states.into_iter().map(|s| (s.account_id, s)).collect(),
        read_at,
        read: true,
    }
}

#[test]
fn a_relay_gets_its_groups_config_then_only_what_changed() {
    let mut oauth = account(3, "g");
    oauth.credential_kind = CredentialKind::OAuth;
    oauth.oauth = Some(OAuthState {
        refresh_token: Secret::new("refresh-secret"),
        expires_at_ms: 1,
        token_url: "http://t".into(),
        client_id: String::new(),
    });
    let mut disabled = account(4, "g");
    disabled.status = AccountStatus::Disabled;
    let snap = snapshot(vec![account(1, "g"), account(2, "other"), oauth, disabled]);
    let at = Instant::now();
    let deployment = poolgate_core::view::Deployment {
        unpriced: poolgate_core::price::UnpricedPolicy::Refuse,
        plan_size: 6,
        ..Default::default()
    };
    let mut filter = ViewFilter::new(vec!["g".into()], Duration::from_millis(200), deployment)
        .expect("valid groups");

    let first = filter.update(&pool(&snap, vec![healthy(1), healthy(2), healthy(3)], at));
    let config = first.config.expect("the first update holds the config");
    assert_eq!(
        config.groups,
        vec!["g".to_owned()],
        "only the groups asked for"
    );
    let ids: Vec<i64> = config.accounts.iter().map(|a| a.id).collect();
    assert_eq!(ids, vec![1, 3], "the group's active accounts only");
    assert!(
        config.accounts.iter().all(|a| a.oauth.is_none()),
        "a relay never gets a refresh token"
    );
    let keys: Vec<i64> = config.keys.iter().map(|(_, k)| k.id).collect();
    assert_eq!(keys, vec![1], "only the group's client keys");
    let states: Vec<i64> = first.states.iter().map(|s| s.account_id).collect();
    assert_eq!(states, vec![1, 3]);
    assert_eq!(first.period_ms, 200);

    // The same pool read again (even a new snapshot with the same content): a heartbeat.
    let again = filter.update(&pool(
        &snapshot(vec![account(1, "g"), account(2, "other"), {
            let mut a = account(3, "g");
            a.credential_kind = CredentialKind::OAuth;
            a
        }]),
        vec![healthy(1), healthy(2), healthy(3)],
        at + Duration::from_millis(200),
    ));
    assert!(
        again.config.is_none() && again.states.is_empty(),
        "{again:?}"
    );

    // A block on account 3, and a change in another group's account: only account 3.
    let mut blocked = healthy(3);
    blocked.health = Some(AccountHealth {
        hard_block_ms: 30_000,
        ..AccountHealth::HEALTHY
    });
    let mut other = healthy(2);
    other.health = Some(AccountHealth {
        inflight: Some(5),
        ..AccountHealth::HEALTHY
    });
    let later = at + Duration::from_millis(400);
    let changed = filter.update(&pool(
        &snap,
        vec![healthy(1), other, blocked.clone()],
        later,
    ));
    assert!(changed.config.is_none(), "{changed:?}");
    assert_eq!(changed.states, vec![blocked.clone()]);

    // The same block read a second later (less remaining, same end): unchanged.
    let mut same_end = blocked.clone();
    same_end.health = Some(AccountHealth {
        hard_block_ms: 29_000,
        ..AccountHealth::HEALTHY
    });
    let unchanged = filter.update(&pool(
        &snap,
        vec![healthy(1), same_end],
        later + Duration::from_secs(1),
    ));
    assert!(unchanged.states.is_empty(), "{unchanged:?}");

    // Extended (the end moved): sent.
    let mut extended = blocked;
    extended.health = Some(AccountHealth {
        hard_block_ms: 60_000,
        ..AccountHealth::HEALTHY
    });
    let moved = filter.update(&pool(
        &snap,
        vec![healthy(1), extended.clone()],
        later + Duration::from_secs(2),
    ));
    assert_eq!(moved.states, vec![extended]);
}

#[test]
fn an_open_breaker_and_a_confirmation_are_changes() {
    let snap = snapshot(vec![account(1, "g")]);
    let at = Instant::now();
    let mut filter = ViewFilter::new(vec![], Duration::from_millis(200), Default::default())
        .expect("every group");
    let _ = filter.update(&pool(&snap, vec![healthy(1)], at));
    let mut open = healthy(1);
    open.health = Some(AccountHealth {
        breaker: Breaker::Open(10_000),
        failures: 5,
        ..AccountHealth::HEALTHY
    });
    assert_eq!(
        filter
            .update(&pool(
                &snap,
                vec![open.clone()],
                at + Duration::from_millis(200)
            ))
            .states,
        vec![open]
    );
    let mut confirming = healthy(1);
    confirming.confirming = true;
    assert_eq!(
        filter
            .update(&pool(
                &snap,
                vec![confirming.clone()],
                at + Duration::from_millis(400)
            ))
            .states,
        vec![confirming]
    );
}

#[test]
fn bad_group_lists_are_refused_naming_the_field() {
    let period = Duration::from_millis(200);
    for groups in [
        vec![String::new()],
        vec!["x".repeat(129)],
        vec!["g".to_owned(); 1025],
    ] {
        match ViewFilter::new(groups, period, Default::default()) {
            Err(crate::engine::SelectorError::InvalidArgument { field, .. }) => {
                assert_eq!(field, "groups")
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
}
