//! A one-model limit blocks one model, in both modes (standalone: engines in
//! process; distributed: Postgres, Redis, selector and admission over gRPC).
//!
//! A Claude subscription (OAuth) account whose weekly Opus limit is used up gets the upstream's
//! model-scoped 429 (`anthropic-ratelimit-unified-status: rejected`, representative claim
//! `seven_day_opus`, its 5h and 7d windows `allowed`; the fake's model-scoped limits,
//! `tests/src/fake_upstream/windows.rs`). The Opus request fails over to the group's other
//! account; the subscription account serves Sonnet at once, every request of it; no block is
//! listed for it (the operator's `blocks`), no breaker count; and the reading the 429 carried
//! keeps Opus off it, so later Opus requests go straight to the other account.

use crate::support;

use std::time::Duration;

use poolgate_core::account::Platform;
use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::{ModelFamily, ModelWindow, Window, WindowBudgets};
use serde_json::{Value, json};
use support::{Mode, Options, Pool, Spec};

const ACCESS: &str = "sk-ant-oat01-model-limits-access";
const OPUS: &str = "claude-opus-4-5-20251101";
const SONNET: &str = "claude-sonnet-4-5-20250929";
const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

/// A request as Claude Code sends it: its billing block first in `system`.
fn request(model: &str, turn: usize) -> Value {
    json!({
        "model": model,
        "max_tokens": 16,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.a1b; cc_entrypoint=cli;"}],
        "messages": [{"role": "user", "content": format!("turn {turn}")}],
    })
}

async fn an_opus_only_weekly_limit_leaves_sonnet_served_on_the_account(mode: Mode) {
    let pool = Pool::start(
        mode,
        &[
            Spec::oauth("subscription", ACCESS, "rt-model-limits", 0),
            Spec::api_key("key", Platform::Anthropic, 1),
        ],
        Options::default(),
    )
    .await;
    // The account's 5-hour and weekly windows have room; its Opus limit has none.
    pool.upstream.set_windows(
        ACCESS,
        WindowBudgets {
            five_hour: Some(Window::new(Duration::from_secs(5 * 3600), 1_000)),
            weekly: Some(Window::new(WEEK, 10_000)),
            models: vec![ModelWindow {
                family: ModelFamily::Opus,
                window: Window::new(WEEK, 0),
            }],
            ..WindowBudgets::default()
        },
    );
    let served = |name: &str| match name {
        "subscription" => pool.upstream.stats(ACCESS).total,
        _ => pool.upstream.stats("cred-key").total,
    };

    let (status, body) = pool.send(0, "/v1/messages", &request(OPUS, 0)).await;
    assert_eq!(status, 200, "{mode}: the Opus request fails over: {body}");
    assert_eq!(
        (served("subscription"), served("key")),
        (1, 1),
        "{mode}: refused by the subscription's Opus limit, served by the other account"
    );

    // At once: every Sonnet request on the subscription account (the first tier).
    for turn in 1..=4 {
        let (status, body) = pool.send(0, "/v1/messages", &request(SONNET, turn)).await;
        assert_eq!(status, 200, "{mode}: {body}");
    }
    assert_eq!(
        (served("subscription"), served("key")),
        (5, 1),
        "{mode}: 4/4 Sonnet requests served by the subscription account after its Opus 429"
    );

    // Nothing account-wide was written: no block listed, no breaker count.
    let health = pool.health_of("subscription").await;
    assert!(health.blocks.is_empty(), "{mode}: {health}");
    assert_eq!(health.status, "active", "{mode}: {health}");
    assert!(health.failures.unwrap_or(0) == 0, "{mode}: {health}");

    // The 429's reading keeps Opus off the account: Opus goes straight to the other account,
    // once the reading has reached the selection (off the latency path; bounded).
    let mut turn = 10;
    let kept_off = eventually(Duration::from_secs(10), || {
        turn += 1;
        let request = request(OPUS, turn);
        let pool = &pool;
        async move {
            let before = pool.upstream.stats(ACCESS).total;
            let (status, _) = pool.send(0, "/v1/messages", &request).await;
            (status == 200 && pool.upstream.stats(ACCESS).total == before).then_some(())
        }
    })
    .await;
    assert!(
        kept_off.is_ok(),
        "{mode}: Opus requests still reach the account whose Opus limit is used up"
    );
    // And Sonnet still goes to it.
    let before = served("subscription");
    let (status, body) = pool.send(0, "/v1/messages", &request(SONNET, 99)).await;
    assert_eq!(status, 200, "{mode}: {body}");
    assert_eq!(served("subscription"), before + 1, "{mode}");
    assert!(
        pool.health_of("subscription").await.blocks.is_empty(),
        "{mode}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_an_opus_only_weekly_limit_leaves_sonnet_served_on_the_account() {
    an_opus_only_weekly_limit_leaves_sonnet_served_on_the_account(Mode::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_an_opus_only_weekly_limit_leaves_sonnet_served_on_the_account() {
    an_opus_only_weekly_limit_leaves_sonnet_served_on_the_account(Mode::Distributed).await;
}
