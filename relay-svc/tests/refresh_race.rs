//! A refused OAuth token is refreshed once, however many requests it was refused on
//! (docs/DESIGN.md §1 and §5). The relay says which token the upstream refused; the selector
//! refreshes only while that token is still the stored one, and refusals that arrive while the
//! probe or refresh of that token runs wait for its result and get the new token.
//!
//! - Many requests at once with a revoked access token (the refresh token still good), over two
//!   relays on two selectors sharing Redis and Postgres, and over one standalone relay, their
//!   refusals coming back spread over a second (during the refresh and after it): every request
//!   succeeds, and the token endpoint sees exactly one refresh.
//! - A refusal of the old token that arrives after the refresh (a request that went out before
//!   it) gets the new token, and no second refresh.
//! - Requests that arrive while the confirmation runs join it. Ten requests started
//!   over the confirmation of a revoked token (two at once, then one at a time, a little apart),
//!   on a one-account group over two relays and over one standalone relay, the race repeated
//!   `ROUNDS` times: the plans made meanwhile say `confirming` with a short retry hint (or, from
//!   a selector whose reading predates the block, include the account, which admission then
//!   refuses for its cooldown), the relays plan again, and every request is served with the new
//!   token after one refresh (before the fix, 5 of the 10 got a 503 in every round; with only
//!   the empty plans joined, 2 of the 10 still did over two relays, refused for the cooldown). A verdict that blocks the account (the refresh refused) ends the
//!   requests that joined the confirmation at once with the block's 503, and none of them
//!   reached the upstream meanwhile.

use crate::support;

use std::time::Duration;

use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::Scripted;
use serde_json::{Value, json};
use support::{Mode, Options, Pool, Spec};

const OLD: &str = "old-access";
const REFRESH: &str = "rt-race";
/// What the fake's token endpoint hands out for `REFRESH`.
const NEW: &str = "rt-race-access";
const REQUESTS: usize = 10;

async fn pool(mode: Mode) -> Pool {
    let mut sub = Spec::oauth("sub", OLD, REFRESH, 0);
    sub.concurrency = 20;
    let pool = Pool::start(
        mode,
        &[sub],
        Options {
            relays: 2,
            ..Options::default()
        },
    )
    .await;
    for token in [OLD, NEW] {
        pool.upstream.set_claude_code_only(token);
    }
    pool.upstream.revoke(OLD);
    // Refusals pile up behind the one refresh.
    pool.upstream.set_token_delay(Duration::from_millis(300));
    pool
}

/// The upstream's refusal of a revoked OAuth token.
fn revoked_answer() -> Scripted {
    Scripted::Fail {
        status: 401,
        headers: vec![],
        body: r#"{"type":"error","error":{"type":"authentication_error","message":"OAuth token has been revoked."}}"#.into(),
    }
}

/// What Claude Code 2.1.332 sends at `system[0]`: the subscription's own client.
const BILLING_BLOCK: &str =
    "x-anthropic-billing-header: cc_version=2.1.332.abc; cc_entrypoint=sdk-cli;";

/// A request as Claude Code sends one (its billing block first in `system`).
fn message(n: usize) -> Value {
    json!({
        "model": "claude-x",
        "max_tokens": 8,
        "system": [
            {"type": "text", "text": BILLING_BLOCK},
            {"type": "text", "text": "You are an interactive CLI tool."}
        ],
        "messages": [{"role": "user", "content": format!("race {n} {}", fastrand::u64(..))}]
    })
}

/// Client requests (not probes) the fake received with `token`.
fn served_with(pool: &Pool, token: &str) -> usize {
    pool.upstream
        .seen_requests()
        .iter()
        .filter(|r| !r.probe && r.credential() == token)
        .count()
}

/// After the refresh: the account serves, unblocked, nothing counted, the new token stored.
async fn account_is_fine(pool: &Pool) {
    let block = pool.options.probe.block;
    let health = eventually(block + Duration::from_secs(2), || async {
        let h = pool.health_of("sub").await;
        (h.hard_block().is_none() && h.status == "active").then_some(h)
    })
    .await;
    let now = pool.health_of("sub").await;
    assert!(
        health.is_ok(),
        "{}: a refusal the refresh fixed must not block or count against the account: {now}",
        pool.mode
    );
    assert!(
        now.unauthorized.is_none_or(|n| n == 0),
        "{}: refusals of a token refreshed away are not counted: {now}",
        pool.mode
    );
    if let Some(stored) = pool.stored_credential("sub").await {
        assert_eq!(stored, NEW, "{}: the refreshed token is stored", pool.mode);
    }
}

async fn concurrent_refusals_share_one_refresh(mode: Mode) {
    let pool = pool(mode).await;
    // The refusals come back spread over a second: the first ones while the refresh runs
    // (300 ms), the later ones after it, from requests that went out with the old token before.
    pool.upstream.script_clients(
        OLD,
        (0..REQUESTS).map(|n| {
            Scripted::After(
                Duration::from_millis(100 * n as u64),
                Box::new(revoked_answer()),
            )
        }),
    );
    let calls = (0..REQUESTS).map(|n| {
        let pool = &pool;
        // Spread over the relays (distributed: each on its own selector).
        async move { pool.send(n, "/v1/messages", &message(n)).await }
    });
    let answers = futures_util::future::join_all(calls).await;
    let refreshes = pool.upstream.token_requests();
    let failed: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "{mode}: {REQUESTS} concurrent requests refused with the old token must all be served \
         with the new one; {} were not: {failed:?} ({} refresh(es))",
        failed.len(),
        refreshes.len()
    );
    assert_eq!(
        refreshes.len(),
        1,
        "{mode}: {REQUESTS} concurrent refusals of one token (over {} relay(s)) must share one \
         refresh; the token endpoint got {refreshes:?}",
        pool.bases.len()
    );
    let with_new = served_with(&pool, NEW);
    assert!(
        with_new >= REQUESTS,
        "{mode}: every request was retried with the new token: {with_new} of {REQUESTS}"
    );
    account_is_fine(&pool).await;
}

async fn a_late_refusal_gets_the_new_token(mode: Mode) {
    let pool = pool(mode).await;
    pool.upstream.set_token_delay(Duration::ZERO);
    // The first request with the old token is refused late: after the second one's refusal has
    // had the token refreshed.
    pool.upstream.script_clients(
        OLD,
        [Scripted::After(
            Duration::from_millis(1500),
            Box::new(revoked_answer()),
        )],
    );
    let late = {
        let pool = &pool;
        async move { pool.send(0, "/v1/messages", &message(0)).await }
    };
    let early = async {
        eventually(Duration::from_secs(5), || async {
            (served_with(&pool, OLD) >= 1).then_some(())
        })
        .await
        .expect("the late request reached the upstream");
        let answer = pool.send(1, "/v1/messages", &message(1)).await;
        let refreshes = pool.upstream.token_requests().len();
        (answer, refreshes)
    };
    let (late, (early, refreshed_before_late)) = tokio::join!(late, early);
    assert_eq!(
        early.0, 200,
        "{mode}: the request refused with the old token is served after the refresh: {}",
        early.1
    );
    assert_eq!(
        refreshed_before_late, 1,
        "{mode}: the second request's refusal refreshed the token before the late refusal came"
    );
    assert_eq!(
        late.0, 200,
        "{mode}: a refusal of the old token arriving after the refresh is retried with the new \
         token: {}",
        late.1
    );
    let refreshes = pool.upstream.token_requests();
    assert_eq!(
        refreshes.len(),
        1,
        "{mode}: the late refusal of a token already refreshed away must not refresh again (the \
         refresh token `{REFRESH}-next` was spent for nothing): {refreshes:?}"
    );
    assert_eq!(
        served_with(&pool, NEW),
        2,
        "{mode}: both requests were retried with the new token"
    );
    account_is_fine(&pool).await;
}

/// Races of `joining_the_confirmation`: the code before the relay joined confirmations (a 503 for
/// a request that met the "confirming" block) failed every one of them.
const ROUNDS: usize = 12;
/// How long the upstream takes to refuse the confirmation's probe.
const PROBE_TAKES: Duration = Duration::from_millis(400);
/// Between two requests of a round: ten of them span the probe and the refresh (300 ms).
const STAGGER: Duration = Duration::from_millis(80);

/// The pool of `joining_the_confirmation`: as `pool`, with a refresh floor short enough for the
/// next round to refresh the token again.
async fn joining_pool(mode: Mode) -> Pool {
    let mut sub = Spec::oauth("sub", OLD, REFRESH, 0);
    sub.concurrency = 20;
    let mut options = Options {
        relays: 2,
        ..Options::default()
    };
    options.probe.refresh_floor = Duration::from_millis(500);
    let pool = Pool::start(mode, &[sub], options).await;
    pool.upstream.set_token_delay(Duration::from_millis(300));
    pool
}

/// `ROUNDS` times: the stored access token is revoked, and `REQUESTS` requests start one after
/// another over the relays while its probe and refresh run. Every one is served, with one
/// refresh a round.
async fn joining_the_confirmation(mode: Mode) {
    let pool = joining_pool(mode).await;
    let (mut access, mut refresh) = (OLD.to_owned(), REFRESH.to_owned());
    let mut refused = Vec::new();
    for round in 0..ROUNDS {
        let fresh = format!("{refresh}-access");
        for token in [&access, &fresh] {
            pool.upstream.set_claude_code_only(token);
        }
        pool.upstream.revoke(&access);
        // The usage endpoint answers a confirmation at once; without it the inference probe
        // confirms, and takes a while to come back (a real one does), the clients' refusals none.
        pool.upstream.set_usage_endpoints(false);
        pool.upstream
            .script_clients(&access, (0..2 * REQUESTS).map(|_| revoked_answer()));
        pool.upstream.script(
            &access,
            [Scripted::After(PROBE_TAKES, Box::new(revoked_answer()))],
        );
        let refreshes_before = pool.upstream.token_requests().len();
        // The first two at once, one on each relay (distributed: each selector reads the
        // account's health just before the confirming block), the others one after another.
        let calls = (0..REQUESTS).map(|n| {
            let pool = &pool;
            async move {
                tokio::time::sleep(STAGGER * n.saturating_sub(1) as u32).await;
                pool.send(n, "/v1/messages", &message(n)).await
            }
        });
        let answers = futures_util::future::join_all(calls).await;
        let refreshes = pool.upstream.token_requests().len() - refreshes_before;
        pool.upstream.clear_client_scripts();
        let failed: Vec<_> = answers
            .into_iter()
            .filter(|(status, _)| *status != 200)
            .collect();
        if !failed.is_empty() || refreshes != 1 {
            refused.push(format!(
                "round {round}: {} of {REQUESTS} not served, {refreshes} refresh(es): {failed:?}",
                failed.len()
            ));
        }
        if mode == Mode::Distributed {
            let stored = eventually(Duration::from_secs(5), || async {
                pool.stored_credential("sub")
                    .await
                    .filter(|stored| *stored == fresh)
            })
            .await;
            assert!(stored.is_ok(), "{mode}: round {round}: {fresh} is stored");
        }
        // The account is unblocked, and the next round's refusal is past the refresh floor.
        let unblocked = eventually(Duration::from_secs(10), || async {
            let h = pool.health_of("sub").await;
            (h.hard_block().is_none() && h.status == "active").then_some(h)
        })
        .await;
        assert!(
            unblocked.is_ok(),
            "{mode}: round {round}: the refreshed account serves again: {}",
            pool.health_of("sub").await
        );
        tokio::time::sleep(pool.options.probe.refresh_floor + Duration::from_millis(200)).await;
        access = fresh;
        refresh = format!("{refresh}-next");
    }
    assert!(
        refused.is_empty(),
        "{mode}: requests that meet a confirmation wait for its verdict and are served; in {} of \
         {ROUNDS} races some were not:\n{}",
        refused.len(),
        refused.join("\n")
    );
    // The races did meet confirmations: plans said so (and the relays planned again).
    let confirming = pool
        .counters()
        .sum("selector_selects_total", &[("result", "confirming")]);
    assert!(
        confirming >= ROUNDS as f64,
        "{mode}: requests met the confirmations ({confirming} plans said `confirming`)"
    );
}

/// A confirmation whose verdict blocks the account (the token endpoint refuses the refresh): the
/// requests that joined it end at the verdict with the block's answer, long before their
/// deadline, and none of them reached the upstream meanwhile.
async fn a_verdict_that_blocks_ends_the_joined_requests(mode: Mode) {
    let pool = joining_pool(mode).await;
    pool.upstream.set_token_delay(Duration::ZERO);
    // The refresh token is spent already: the refresh after the refused probe is refused.
    let spent = pool
        .http
        .post(format!("{}/oauth/token", pool.upstream.base_url))
        .json(&json!({"grant_type": "refresh_token", "refresh_token": REFRESH, "client_id": "x"}))
        .send()
        .await
        .expect("token endpoint");
    assert!(spent.status().is_success());
    pool.upstream.revoke(OLD);
    pool.upstream
        .script_clients(OLD, (0..2 * REQUESTS).map(|_| revoked_answer()));
    pool.upstream.script(
        OLD,
        [Scripted::After(PROBE_TAKES, Box::new(revoked_answer()))],
    );
    let started = std::time::Instant::now();
    let calls = (0..REQUESTS).map(|n| {
        let pool = &pool;
        async move {
            tokio::time::sleep(STAGGER * n as u32 / 2).await;
            pool.send(n, "/v1/messages", &message(n)).await
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    let took = started.elapsed();
    let max_wait = pool.options.relay.max_wait;
    assert!(
        took < max_wait / 2,
        "{mode}: the verdict ends the requests that joined it, not their deadline ({max_wait:?}): \
         {took:?}"
    );
    let refused_upstream = answers.iter().filter(|(status, _)| *status == 401).count();
    let blocked: Vec<_> = answers
        .iter()
        .filter(|(status, body)| *status == 503 && body.contains("all_blocked"))
        .collect();
    assert_eq!(
        refused_upstream + blocked.len(),
        REQUESTS,
        "{mode}: each request got the upstream's refusal or the block's 503: {answers:?}"
    );
    assert!(
        !blocked.is_empty(),
        "{mode}: requests met the confirmation and then its block: {answers:?}"
    );
    assert_eq!(
        served_with(&pool, OLD),
        refused_upstream,
        "{mode}: only the requests sent before the confirming block reached the upstream"
    );
    let hard = pool.health_of("sub").await;
    assert!(
        hard.hard_block()
            .is_some_and(|b| !b.reason.starts_with("confirming")),
        "{mode}: the verdict's block is in place: {hard}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verdict_that_blocks_ends_the_requests_that_joined_the_confirmation_distributed() {
    a_verdict_that_blocks_ends_the_joined_requests(Mode::Distributed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verdict_that_blocks_ends_the_requests_that_joined_the_confirmation_standalone() {
    a_verdict_that_blocks_ends_the_joined_requests(Mode::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_meet_a_confirmation_join_it_on_two_relays_and_selectors() {
    joining_the_confirmation(Mode::Distributed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_meet_a_confirmation_join_it_on_a_standalone_relay() {
    joining_the_confirmation(Mode::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_refusals_of_one_token_on_two_relays_and_selectors_share_one_refresh() {
    concurrent_refusals_share_one_refresh(Mode::Distributed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_refusals_of_one_token_on_a_standalone_relay_share_one_refresh() {
    concurrent_refusals_share_one_refresh(Mode::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_refusal_of_a_refreshed_token_gets_the_new_one_without_a_second_refresh_distributed()
{
    a_late_refusal_gets_the_new_token(Mode::Distributed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_refusal_of_a_refreshed_token_gets_the_new_one_without_a_second_refresh_standalone()
{
    a_late_refusal_gets_the_new_token(Mode::Standalone).await;
}
