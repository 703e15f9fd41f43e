use std::time::Duration;

use poolgate_core::health::{AccountHealth, Breaker};
use poolgate_core::plan::Effect;
use poolgate_core::view::{AccountState, ViewConfig, ViewUpdate};

use super::{EdgeView, Known, ViewHealth};
use crate::health::{HardBlock, Health};

fn state(id: i64, health: AccountHealth, confirming: bool) -> AccountState {
    AccountState {
        account_id: id,
        health: Some(health),
        confirming,
        windows: vec![],
    }
}

fn config(ids: &[i64]) -> ViewConfig {
    ViewConfig {
        groups: vec!["g".into()],
        accounts: ids
            .iter()
            .map(|id| poolgate_core::account::Account {
                id: *id,
                group: "g".into(),
                ..crate::probe::tests::test_account(
                    poolgate_core::account::Platform::Anthropic,
                    poolgate_core::account::CredentialKind::ApiKey,
                    "sk",
                    "http://u",
                )
            })
            .collect(),
        ..ViewConfig::default()
    }
}

#[tokio::test]
async fn remaining_times_count_down_from_when_the_update_arrived() {
    let view = std::sync::Arc::new(EdgeView::new());
    assert!(view.age().is_none(), "no view before the first update");
    view.apply(ViewUpdate {
        config: Some(config(&[1, 2, 3])),
        states: vec![
            state(
                1,
                AccountHealth {
                    hard_block_ms: 150,
                    ..AccountHealth::HEALTHY
                },
                false,
            ),
            state(
                2,
                AccountHealth {
                    breaker: Breaker::Open(150),
                    ..AccountHealth::HEALTHY
                },
                false,
            ),
            state(
                3,
                AccountHealth {
                    hard_block_ms: 60_000,
                    ..AccountHealth::HEALTHY
                },
                true,
            ),
        ],
        period_ms: 200,
    });
    let health = ViewHealth(view.clone());
    let now = health.read_batch(&[1, 2, 3, 4]).await.expect("reads");
    assert!(now[0].hard_block_ms > 0 && now[0].hard_block_ms <= 150);
    assert!(matches!(now[1].breaker, Breaker::Open(_)));
    assert_eq!(now[3].inflight, None, "an account never read is unknown");
    assert_eq!(
        health.hard_blocks(&[1, 3, 4]).await.expect("reads"),
        vec![HardBlock::Other, HardBlock::Confirming, HardBlock::None]
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let later = health.read_batch(&[1, 2]).await.expect("reads");
    assert_eq!(later[0].hard_block_ms, 0, "the block ended");
    assert_eq!(
        later[1].breaker,
        Breaker::HalfOpen,
        "the open period ended: half-open (the selector's probe decides), never closed"
    );
    assert!(
        !crate::health::Locks::lock_confirm(&health, 2, "o", 1000)
            .await
            .expect("answers"),
        "the edge never takes the confirmation lock: it starts no check"
    );
    assert!(
        health.hard_block(1, 1000, "busy", 429, "r").await.is_err(),
        "the view is read-only"
    );
}

#[test]
fn a_new_config_drops_the_states_of_accounts_gone_from_it() {
    let view = EdgeView::new();
    view.apply(ViewUpdate {
        config: Some(config(&[1, 2])),
        states: vec![state(2, AccountHealth::HEALTHY, false)],
        period_ms: 200,
    });
    assert!(view.held(2).is_some());
    view.apply(ViewUpdate {
        config: Some(config(&[1])),
        states: vec![],
        period_ms: 200,
    });
    assert!(view.held(2).is_none());
    assert!(view.snapshot().account(2).is_none());
    assert!(view.snapshot().account(1).is_some());
}

#[test]
fn the_selectors_answer_to_a_report_counts_before_the_next_update() {
    let view = EdgeView::new();
    view.apply(ViewUpdate {
        config: Some(config(&[1])),
        states: vec![state(1, AccountHealth::HEALTHY, false)],
        period_ms: 200,
    });
    view.note_applied(1, Effect::HardBlock, 30_000);
    let held = view.held(1).expect("held");
    let health = held.health(std::time::Instant::now()).expect("read");
    assert!(health.hard_block_ms > 29_000);
    view.note_applied(1, Effect::BreakerOpen, 10_000);
    let health = view
        .held(1)
        .and_then(|held| held.health(std::time::Instant::now()))
        .expect("read");
    assert!(matches!(health.breaker, Breaker::Open(_)));
    view.note_applied(1, Effect::None, 0);
    assert!(
        view.held(1)
            .and_then(|held| held.health(std::time::Instant::now()))
            .is_some_and(|h| h.hard_block_ms > 0),
        "nothing applied changes nothing"
    );
}

#[test]
fn a_refreshed_token_ends_the_confirmation_even_against_an_update_read_before_it() {
    let view = EdgeView::new();
    let confirming = AccountHealth {
        hard_block_ms: 10_000,
        ..AccountHealth::HEALTHY
    };
    view.apply(ViewUpdate {
        config: Some(config(&[1])),
        states: vec![state(1, confirming, true)],
        period_ms: 200,
    });
    let blocked = |view: &EdgeView| {
        view.held(1).is_some_and(|held| {
            held.state.confirming
                || held
                    .health(std::time::Instant::now())
                    .is_some_and(|h| h.hard_block_ms > 0)
        })
    };
    assert!(blocked(&view));
    // The selector answered this relay's report with the refreshed token.
    view.note_applied(1, Effect::Refreshed, 0);
    assert!(!blocked(&view), "the confirmation is over");
    // An update the publisher read before the refresh still shows it confirming: not taken.
    view.apply(ViewUpdate {
        config: None,
        states: vec![state(1, confirming, true)],
        period_ms: 200,
    });
    assert!(
        !blocked(&view),
        "a stale confirming state is not taken back"
    );
    // Once an update shows it not confirming, a confirming one is a new confirmation.
    view.apply(ViewUpdate {
        config: None,
        states: vec![state(1, AccountHealth::HEALTHY, false)],
        period_ms: 200,
    });
    view.apply(ViewUpdate {
        config: None,
        states: vec![state(1, confirming, true)],
        period_ms: 200,
    });
    assert!(blocked(&view), "a new confirmation is taken");
}

#[test]
fn bindings_are_trusted_for_the_trust_time_then_stale() {
    let view = EdgeView::new();
    let trust = Duration::from_millis(50);
    assert_eq!(view.session("g", "k1:s", trust), Known::Unknown);
    view.learn_session("g", "k1:s", 7);
    assert_eq!(view.session("g", "k1:s", trust), Known::Trusted(7));
    assert_eq!(
        view.session("h", "k1:s", trust),
        Known::Unknown,
        "per group"
    );
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(view.session("g", "k1:s", trust), Known::Stale(7));
    view.learn_response("k1:resp_1", 9);
    assert_eq!(view.response("k1:resp_1"), Some(9));
    assert_eq!(view.response("k2:resp_1"), None, "another key's name");
}
