//! Issue 22: a refused OAuth token is refreshed once, however many requests it was refused on
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

mod support;

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

fn message(n: usize) -> Value {
    json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": format!("race {n} {}", fastrand::u64(..))}]})
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
