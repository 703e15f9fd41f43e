//! The pool's status gauges (docs/METRICS.md): `selector_accounts{group,status}` shows every
//! account in the one status an operator sees it in, every status of every group present, and
//! `selector_group_eligible{group}` follows the selection engine's own rules. Real Postgres and
//! Redis; the blocks are written through the engine's health store, as outcomes write them.

use crate::support;

use std::time::Duration;

use poolgate_core::account::AccountStatus;
use poolgate_core::windows::{Scope, WindowKind, WindowReading, WindowStatus};
use poolgate_testkit::eventually;
use support::{Backends, Replica, fast_settings};

/// The value of the series `name{labels}` in a Prometheus text rendering (labels in any order).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            let rest = rest.strip_suffix('}')?;
            if metric != name {
                return None;
            }
            let mut found: Vec<(&str, &str)> = rest
                .split(',')
                .filter(|pair| !pair.is_empty())
                .filter_map(|pair| {
                    let (key, value) = pair.split_once('=')?;
                    Some((key, value.trim_matches('"')))
                })
                .collect();
            let mut wanted = labels.to_vec();
            found.sort_unstable();
            wanted.sort_unstable();
            (found == wanted).then(|| value.parse().ok()).flatten()
        })
}

/// A plan window used up an hour from its reset, with no overage paying for more.
fn used_up() -> WindowReading {
    let now = poolgate_core::now_ms();
    WindowReading {
        kind: WindowKind::FiveHour,
        scope: Scope::Account,
        utilization: Some(1.0),
        reset_at_ms: now + 3_600_000,
        length_ms: None,
        status: WindowStatus::Rejected,
        observed_at_ms: now,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_status_of_every_group_shows_and_eligibility_follows_the_engine() {
    let backends = Backends::start().await;
    let mut ids = std::collections::HashMap::new();
    for name in [
        "ok",
        "soft",
        "hard",
        "confirm",
        "breaker",
        "half_open",
        "used_up",
        "retired",
        "disabled",
        "error",
    ] {
        ids.insert(name, backends.account(name, "g", |_| {}).await);
    }
    backends.account("other", "h", |_| {}).await;
    for (name, status) in [
        ("retired", AccountStatus::Retired),
        ("disabled", AccountStatus::Disabled),
        ("error", AccountStatus::Error),
    ] {
        backends
            .store
            .set_status(ids[name], status, "test")
            .await
            .expect("status set");
    }
    let replica = Replica::start(backends.config(fast_settings())).await;
    let selector = &replica.built.selector;
    let health = selector.health();
    health
        .soft_block(ids["soft"], 600_000, "busy", 429, "test")
        .await
        .expect("soft block");
    health
        .hard_block(ids["hard"], 600_000, "window_exhausted", 429, "test")
        .await
        .expect("hard block");
    health
        .block_confirming(ids["confirm"], 600_000, "broken", 502, "run:test")
        .await
        .expect("confirming block");
    health
        .breaker_failure(ids["breaker"], 1, 600_000, 600_000)
        .await
        .expect("breaker opened");
    // Open for a moment only: half-open once it lapses (only the selector's probe goes through).
    health
        .breaker_failure(ids["half_open"], 1, 1, 1)
        .await
        .expect("breaker opened");
    health
        .store_windows(ids["used_up"], &[used_up()])
        .await
        .expect("windows stored");
    let expected_g = [
        // ok, used_up (active, yet not eligible), half_open (its breaker is not open)
        ("active", 3.0),
        ("soft_blocked", 1.0),
        ("hard_blocked", 1.0),
        ("confirming", 1.0),
        ("breaker_open", 1.0),
        ("retired", 1.0),
        ("disabled", 1.0),
        ("error", 1.0),
    ];
    // A background pass may have read the stores before the writes above: recompute until the
    // gauges show them.
    let shown = eventually(Duration::from_secs(10), || async {
        selector.update_status_gauges().await;
        let text = selector.metrics().render();
        expected_g
            .iter()
            .all(|(status, count)| {
                sample(
                    &text,
                    "selector_accounts",
                    &[("group", "g"), ("status", status)],
                ) == Some(*count)
            })
            .then_some(text)
    })
    .await;
    let text = match shown {
        Ok(text) => text,
        Err(_) => panic!(
            "selector_accounts for g never showed {expected_g:?}:\n{}",
            selector.metrics().render()
        ),
    };
    // Eligible in g: ok and soft (a soft block only orders last). Not: hard, confirming, an
    // open or half-open breaker, a used-up window, and the three out of service.
    assert_eq!(
        sample(&text, "selector_group_eligible", &[("group", "g")]),
        Some(2.0),
        "{text}"
    );
    // The other group: one active account, and every other status present at 0.
    assert_eq!(
        sample(&text, "selector_group_eligible", &[("group", "h")]),
        Some(1.0),
        "{text}"
    );
    for status in poolgate_core::health::LiveStatus::ALL {
        let want = if status.label() == "active" { 1.0 } else { 0.0 };
        assert_eq!(
            sample(
                &text,
                "selector_accounts",
                &[("group", "h"), ("status", status.label())]
            ),
            Some(want),
            "group h, status {}: {text}",
            status.label()
        );
    }
    // Limits of the stored-active accounts: seven in g, five each; none leased.
    assert_eq!(
        sample(&text, "selector_group_concurrency_limit", &[("group", "g")]),
        Some(35.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "selector_group_leases", &[("group", "g")]),
        Some(0.0),
        "{text}"
    );
    // The engine's own plan agrees with the gauge: it plans exactly the eligible accounts.
    let plan = selector
        .select(&poolgate_select::engine::SelectQuery {
            group: "g".into(),
            model: "claude".into(),
            max_accounts: 20,
            ..Default::default()
        })
        .await
        .expect("plan");
    let mut planned: Vec<i64> = plan.accounts.iter().map(|a| a.id).collect();
    planned.sort_unstable();
    let mut eligible = vec![ids["ok"], ids["soft"]];
    eligible.sort_unstable();
    assert_eq!(planned, eligible);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifting_a_block_raises_the_groups_eligible_count() {
    let backends = Backends::start().await;
    let id = backends.account("only", "g", |_| {}).await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let selector = &replica.built.selector;
    selector
        .health()
        .hard_block(id, 600_000, "window_exhausted", 429, "test")
        .await
        .expect("hard block");
    let eligible = |want: f64| async move {
        selector.update_status_gauges().await;
        let text = selector.metrics().render();
        (sample(&text, "selector_group_eligible", &[("group", "g")]) == Some(want)).then_some(())
    };
    assert_eq!(
        eventually(Duration::from_secs(10), || eligible(0.0)).await,
        Ok(()),
        "{}",
        selector.metrics().render()
    );
    selector.health().clear(id).await.expect("cleared");
    assert_eq!(
        eventually(Duration::from_secs(10), || eligible(1.0)).await,
        Ok(()),
        "{}",
        selector.metrics().render()
    );
}
