//! "Busy is not broken" (docs/DESIGN.md §1 and §5): what each outcome class does to an account,
//! through the gRPC API, against real Postgres and Redis.

use crate::support;

use std::time::Duration;

use poolgate_proto::selector::v1 as pb;
use poolgate_runtime::redis_keys::AccountKeys;
use poolgate_testkit::eventually;
use support::{Backends, Replica, admin, credential, fast_settings, select_request, upstream};

fn report(
    account_id: i64,
    class: pb::OutcomeClass,
    status: u32,
    reset_at_ms: u64,
) -> pb::ReportOutcomeRequest {
    pb::ReportOutcomeRequest {
        account_id,
        class: class as i32,
        status,
        reset_at_ms,
        reason: format!("test {status}"),
        after_refresh: false,
        refused_credential_fingerprint: String::new(),
        before_send: false,
    }
}

/// No answer because the connection failed before anything was sent: applies at once.
fn connect_failure(account_id: i64) -> pb::ReportOutcomeRequest {
    pb::ReportOutcomeRequest {
        before_send: true,
        ..report(account_id, pb::OutcomeClass::Broken, 0, 0)
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

async fn primary(replica: &Replica) -> Option<i64> {
    let mut client = replica.client.clone();
    let plan = client
        .select(select_request("g", "claude"))
        .await
        .expect("select")
        .into_inner();
    plan.accounts.first().map(|a| a.account_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_429_and_529_never_hard_blocks_never_opens_the_breaker_and_keeps_the_account_primary()
 {
    let backends = Backends::start().await;
    let id = backends.account("only", "g", |_| {}).await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let mut client = replica.client.clone();
    for n in 0..40 {
        let status = if n % 2 == 0 { 429 } else { 529 };
        let applied = client
            .report_outcome(report(id, pb::OutcomeClass::Busy, status, 0))
            .await
            .expect("report")
            .into_inner();
        assert_eq!(support::effect(&applied), "soft_block");
    }
    // Soft-blocked only: still the primary of the next plan (it is the only account).
    assert_eq!(primary(&replica).await, Some(id));
    let mut conn = backends.redis.client().await.expect("redis");
    let cooldown: i64 = redis::cmd("PTTL")
        .arg(AccountKeys::new(id).cooldown)
        .query_async(&mut conn)
        .await
        .expect("pttl");
    assert_eq!(cooldown, -2, "no hard block: admission does not refuse it");
    let blocks = replica
        .admin
        .clone()
        .list_blocks(admin(pb::ListBlocksRequest {}))
        .await
        .expect("blocks")
        .into_inner();
    assert!(
        blocks.blocks.iter().all(|b| b.kind == "soft"),
        "{:?}",
        blocks.blocks
    );
    assert!(
        blocks
            .blocks
            .iter()
            .any(|b| b.kind == "soft" && b.status == 529 && b.class == "busy")
    );
    let account = backends.store.load_account(id).await.expect("account");
    assert_eq!(
        account.status,
        poolgate_core::account::AccountStatus::Active,
        "never retired or errored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_a_reset_two_hours_ahead_hard_blocks_until_then() {
    let backends = Backends::start().await;
    let id = backends.account("only", "g", |_| {}).await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let mut client = replica.client.clone();
    let reset = now_ms() + 2 * 3600 * 1000;
    let applied = client
        .report_outcome(report(id, pb::OutcomeClass::WindowExhausted, 429, reset))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(support::effect(&applied), "hard_block");
    assert!(
        applied.block_ms > 2 * 3600 * 1000 - 60_000,
        "{}",
        applied.block_ms
    );
    let plan = client
        .select(select_request("g", "claude"))
        .await
        .expect("select")
        .into_inner();
    assert!(plan.accounts.is_empty());
    assert_eq!(plan.reason, pb::NoneReason::AllBlocked as i32);
    assert!(plan.retry_after_ms > 2 * 3600 * 1000 - 60_000);
    let gauge = &replica.built.selector.metrics().active_blocks;
    assert_eq!(
        gauge.with_label_values(&["hard"]).get(),
        1,
        "the active blocks gauge shows it"
    );
    // Admission refuses it in its own script: the cooldown key holds the block.
    let mut conn = backends.redis.client().await.expect("redis");
    let cooldown: i64 = redis::cmd("PTTL")
        .arg(AccountKeys::new(id).cooldown)
        .query_async(&mut conn)
        .await
        .expect("pttl");
    assert!(cooldown > 2 * 3600 * 1000 - 60_000, "{cooldown}");
    // An earlier deadline never shortens the later one.
    let applied = client
        .report_outcome(report(
            id,
            pb::OutcomeClass::WindowExhausted,
            429,
            now_ms() + 120_000,
        ))
        .await
        .expect("report")
        .into_inner();
    assert!(
        applied.block_ms > 2 * 3600 * 1000 - 60_000,
        "kept the later deadline: {}",
        applied.block_ms
    );
    let broken = client
        .report_outcome(connect_failure(id))
        .await
        .expect("report")
        .into_inner();
    assert!(
        broken.block_ms > 2 * 3600 * 1000 - 60_000,
        "a network failure's 2-minute block does not shorten it: {}",
        broken.block_ms
    );
}

async fn breaker_failures(backends: &Backends, id: i64) -> u32 {
    let mut conn = backends.redis.client().await.expect("redis");
    let failures: Option<u32> = redis::cmd("HGET")
        .arg(poolgate_runtime::redis_keys::breaker(id))
        .arg("failures")
        .query_async(&mut conn)
        .await
        .expect("hget");
    failures.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_failures_open_the_breaker_and_the_selectors_own_probe_closes_it() {
    let backends = Backends::start().await;
    let upstream = upstream(500, API_ERROR, Duration::ZERO).await;
    let id = backends
        .account("flaky", "g", |a| a.base_url = upstream.base_url.clone())
        .await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let mut client = replica.client.clone();
    // A connect failure: nothing of a request left, so nothing in it shaped that; it applies
    // at once.
    let applied = client
        .report_outcome(connect_failure(id))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(support::effect(&applied), "hard_block");
    // A 5xx answer may have been shaped by the request: the probe confirms each one.
    for n in 2..=5 {
        eventually(Duration::from_secs(5), || async {
            let applied = replica
                .client
                .clone()
                .report_outcome(report(id, pb::OutcomeClass::Broken, 500, 0))
                .await
                .ok()?
                .into_inner();
            (support::effect(&applied) == "confirming").then_some(())
        })
        .await
        .expect("a confirmation starts once the last one is over");
        eventually(Duration::from_secs(5), || async {
            (breaker_failures(&backends, id).await == n).then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("failure {n} confirmed by the probe"));
    }
    assert_eq!(
        upstream.probe_count(&credential("flaky")),
        4,
        "one probe per 5xx"
    );
    // The fifth opened the breaker (400 ms): not selectable.
    let plan = client
        .select(select_request("g", "claude"))
        .await
        .expect("select")
        .into_inner();
    assert!(plan.accounts.is_empty());
    // Half-open after 400 ms: the select that sees it starts the probe and leaves the account
    // out (no client request is the probe); once the probe answers, the breaker is closed.
    upstream.set_standing_answer(None);
    let back = eventually(Duration::from_secs(5), || async {
        let primary = primary(&replica).await;
        primary.filter(|_| upstream.probe_count(&credential("flaky")) > 4)
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "closed by the probe; calls {}",
            upstream.probe_count(&credential("flaky"))
        )
    });
    assert_eq!(back, id);
    assert_eq!(
        upstream.probe_count(&credential("flaky")),
        5,
        "one half-open probe, cluster-wide"
    );
    let metrics = replica.built.selector.metrics().render();
    assert!(
        metrics.contains("selector_breaker_changes_total{change=\"closed\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_the_probe_does_not_confirm_changes_nothing() {
    let backends = Backends::start().await;
    let upstream = upstream(200, OK, Duration::ZERO).await;
    let id = backends
        .account("fine", "g", |a| a.base_url = upstream.base_url.clone())
        .await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let applied = replica
        .client
        .clone()
        .report_outcome(report(id, pb::OutcomeClass::Broken, 500, 0))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(support::effect(&applied), "confirming");
    eventually(Duration::from_secs(5), || async {
        let mut conn = backends.redis.client().await.ok()?;
        let cooldown: i64 = redis::cmd("PTTL")
            .arg(AccountKeys::new(id).cooldown)
            .query_async(&mut conn)
            .await
            .ok()?;
        (upstream.probe_count(&credential("fine")) == 1 && cooldown == -2).then_some(())
    })
    .await
    .expect("probed, confirming block lifted");
    assert_eq!(breaker_failures(&backends, id).await, 0, "not counted");
    assert_eq!(primary(&replica).await, Some(id));
    // A client repeating the request the upstream chokes on: quiet for a while, no new probe,
    // no block.
    let again = replica
        .client
        .clone()
        .report_outcome(report(id, pb::OutcomeClass::Broken, 500, 0))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(support::effect(&again), "none");
    // The engine decided before it answered: quiet, so no confirmation started (a probe is only
    // ever sent by a started one).
    let confirmations = |result: &str| {
        replica
            .built
            .selector
            .metrics()
            .confirmations
            .with_label_values(&["broken", result])
            .get()
    };
    assert_eq!(
        (confirmations("started"), confirmations("already_running")),
        (1, 1)
    );
    assert_eq!(
        upstream.probe_count(&credential("fine")),
        1,
        "no second probe"
    );
    assert_eq!(primary(&replica).await, Some(id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_probe_reopens_the_breaker_for_twice_as_long() {
    failed_probe_reopens(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_breaker_is_checked_on_the_selectors_own_timer_without_any_select() {
    // Relays select at the edge and never start a check: the selector's timer must.
    failed_probe_reopens(false).await;
}

/// Five connect failures open an account's breaker; its upstream fails the half-open probe, so
/// the breaker reopens for twice as long, after one probe. `selects`: selects run meanwhile
/// (they start the check too); without any, the selector's own timer must start it.
async fn failed_probe_reopens(selects: bool) {
    let backends = Backends::start().await;
    let upstream = upstream(500, API_ERROR, Duration::ZERO).await;
    let id = backends
        .account("flaky", "g", |a| a.base_url = upstream.base_url.clone())
        .await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let mut client = replica.client.clone();
    for _ in 0..5 {
        client
            .report_outcome(connect_failure(id))
            .await
            .expect("report");
    }
    let conn = backends.redis.client().await.expect("redis");
    let open_ms = eventually(Duration::from_secs(5), || {
        let mut conn = conn.clone();
        let replica = &replica;
        async move {
            if selects {
                let _ = primary(replica).await;
            }
            let open_ms: Option<u64> = redis::cmd("HGET")
                .arg(poolgate_runtime::redis_keys::breaker(id))
                .arg("open_ms")
                .query_async(&mut conn)
                .await
                .ok()?;
            open_ms.filter(|ms| *ms > 400)
        }
    })
    .await
    .expect("the half-open probe failed and reopened the breaker");
    assert_eq!(open_ms, 800, "400 ms doubled");
    assert_eq!(
        upstream.probe_count(&credential("flaky")),
        1,
        "the half-open probe"
    );
    assert_eq!(primary(&replica).await, None, "open again: not selectable");
}

const API_ERROR: &str =
    r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#;

const OK: &str = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"p"}],"usage":{"input_tokens":1,"output_tokens":1}}"#;

const BILLING: &str = r#"{"type":"error","error":{"type":"billing_error","message":"Your account has run out of credit."}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_outcome_retires_only_after_the_probe_confirms_it_and_a_restore_brings_it_back() {
    let backends = Backends::start().await;
    let upstream = upstream(402, BILLING, Duration::from_millis(300)).await;
    let id = backends
        .account("spent", "g", |a| {
            a.base_url = upstream.base_url.clone();
            a.concurrency_limit = 1;
        })
        .await;
    let other = backends.account("spare", "g", |_| {}).await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let mut client = replica.client.clone();
    let applied = client
        .report_outcome(report(id, pb::OutcomeClass::QuotaGone, 402, 0))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(
        support::effect(&applied),
        "confirming",
        "never a retirement by itself"
    );
    let account = backends.store.load_account(id).await.expect("account");
    assert_eq!(
        account.status,
        poolgate_core::account::AccountStatus::Active,
        "still active while the probe runs"
    );
    // Hard-blocked ("confirming") meanwhile: plans leave it out.
    let plan = client
        .select(select_request("g", "claude"))
        .await
        .expect("select")
        .into_inner();
    assert_eq!(
        plan.accounts
            .iter()
            .map(|a| a.account_id)
            .collect::<Vec<_>>(),
        vec![other]
    );
    // A second report while the probe runs starts nothing (one confirmation at a time).
    let again = client
        .report_outcome(report(id, pb::OutcomeClass::QuotaGone, 402, 0))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(support::effect(&again), "none");
    eventually(Duration::from_secs(10), || async {
        let account = backends.store.load_account(id).await.ok()?;
        (account.status == poolgate_core::account::AccountStatus::Retired).then_some(())
    })
    .await
    .expect("retired once the probe got the same answer");
    assert_eq!(upstream.probe_count(&credential("spent")), 1, "one probe");
    let probe = upstream.probes(&credential("spent"))[0].clone();
    assert_eq!(
        probe.body["model"], "claude-haiku-4-5",
        "the platform's probe model"
    );
    assert_eq!(probe.body["max_tokens"], 1);
    assert_eq!(
        probe.headers.get("x-api-key").and_then(|v| v.to_str().ok()),
        Some("sk-ant-spent-secret-credential")
    );
    let account = backends.store.load_account(id).await.expect("account");
    assert!(
        account.status_reason.contains("confirmed by probe")
            && account.status_reason.contains("402")
            && account.status_reason.contains("billing_error")
            && !account.status_reason.contains("run out of credit"),
        "type and status, never the message: {}",
        account.status_reason
    );
    // Gone from plans once the snapshot reloaded (NOTIFY).
    eventually(Duration::from_secs(2), || async {
        let plan = replica
            .client
            .clone()
            .select(select_request("g", "claude"))
            .await
            .ok()?
            .into_inner();
        (plan.accounts.len() == 1 && plan.accounts[0].account_id == other).then_some(())
    })
    .await
    .expect("retired account left the plans");
    let restored = replica
        .admin
        .clone()
        .restore_account(admin(pb::RestoreAccountRequest { account_id: id }))
        .await
        .expect("restore")
        .into_inner();
    assert_eq!(restored.status, "active");
    let plan = client
        .select(select_request("g", "claude"))
        .await
        .expect("select")
        .into_inner();
    assert_eq!(
        plan.accounts.len(),
        2,
        "back in the pool, its block cleared"
    );
    let metrics = replica.built.selector.metrics().render();
    assert!(
        metrics.contains(
            "selector_confirmations_total{result=\"confirmed\",suspect=\"quota_gone\"} 1"
        ),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_outcome_the_probe_does_not_confirm_leaves_the_account_active_and_unblocked() {
    let backends = Backends::start().await;
    let upstream = upstream(200, OK, Duration::ZERO).await;
    let id = backends
        .account("healthy", "g", |a| {
            a.base_url = upstream.base_url.clone();
            a.probe_model = Some("claude-probe-override".into());
        })
        .await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let applied = replica
        .client
        .clone()
        .report_outcome(report(id, pb::OutcomeClass::QuotaGone, 400, 0))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(support::effect(&applied), "confirming");
    eventually(Duration::from_secs(10), || async {
        let mut conn = backends.redis.client().await.ok()?;
        let cooldown: i64 = redis::cmd("PTTL")
            .arg(AccountKeys::new(id).cooldown)
            .query_async(&mut conn)
            .await
            .ok()?;
        (upstream.probe_count(&credential("healthy")) == 1 && cooldown == -2).then_some(())
    })
    .await
    .expect("the probe ran and the confirming block was lifted");
    let account = backends.store.load_account(id).await.expect("account");
    assert_eq!(
        account.status,
        poolgate_core::account::AccountStatus::Active
    );
    assert_eq!(
        upstream.probes(&credential("healthy"))[0].body["model"],
        "claude-probe-override",
        "the account's probe model wins"
    );
    assert_eq!(primary(&replica).await, Some(id), "selectable again");
}

const AUTHENTICATION_ERROR: &str =
    r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;

/// The account's unauthorized count, as Redis holds it.
async fn unauthorized_count(backends: &Backends, id: i64) -> u64 {
    let Ok(mut conn) = backends.redis.client().await else {
        return 0;
    };
    redis::cmd("ZCARD")
        .arg(poolgate_runtime::redis_keys::unauthorized_events(id))
        .query_async(&mut conn)
        .await
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_unauthorized_outcomes_the_probe_confirms_within_an_hour_mark_the_account_error() {
    let backends = Backends::start().await;
    let upstream = upstream(401, AUTHENTICATION_ERROR, Duration::ZERO).await;
    let id = backends
        .account("revoked", "g", |a| a.base_url = upstream.base_url.clone())
        .await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let client = replica.client.clone();
    for round in 1..=3u64 {
        let applied = eventually(Duration::from_secs(5), || {
            let mut client = client.clone();
            async move {
                let applied = client
                    .report_outcome(report(id, pb::OutcomeClass::Unauthorized, 401, 0))
                    .await
                    .ok()?
                    .into_inner();
                let applied = support::effect(&applied);
                // While the last verdict's block holds, a report starts nothing.
                (applied == "confirming").then_some(applied)
            }
        })
        .await;
        assert_eq!(applied.as_deref(), Ok("confirming"), "round {round}");
        eventually(Duration::from_secs(5), || async {
            (unauthorized_count(&backends, id).await == round).then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("round {round}: the refused probe counts"));
    }
    eventually(Duration::from_secs(5), || async {
        let account = backends.store.load_account(id).await.ok()?;
        (account.status == poolgate_core::account::AccountStatus::Error).then_some(())
    })
    .await
    .expect("three confirmed refusals: error");
    assert_eq!(
        upstream.probe_count(&credential("revoked")),
        3,
        "one probe per refusal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_the_probe_does_not_confirm_blocks_nothing_and_counts_nothing() {
    let backends = Backends::start().await;
    let upstream = upstream(200, OK, Duration::from_millis(200)).await;
    let id = backends
        .account("fine", "g", |a| a.base_url = upstream.base_url.clone())
        .await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let mut client = replica.client.clone();
    // A restricted key's 401 for an endpoint the client chose, a 403 for a model: whatever the
    // client made the upstream say, the probe with the stored key is answered.
    for _ in 0..5 {
        let answer = client
            .report_outcome(report(id, pb::OutcomeClass::Unauthorized, 401, 0))
            .await
            .expect("report")
            .into_inner();
        assert!(
            ["confirming", "none"].contains(&support::effect(&answer)),
            "{}",
            support::effect(&answer)
        );
    }
    eventually(Duration::from_secs(5), || async {
        (upstream.probe_count(&credential("fine")) == 1 && primary(&replica).await == Some(id))
            .then_some(())
    })
    .await
    .expect("one probe; the confirming block lifted");
    assert_eq!(
        unauthorized_count(&backends, id).await,
        0,
        "nothing counted"
    );
    let account = backends.store.load_account(id).await.expect("account");
    assert_eq!(
        account.status,
        poolgate_core::account::AccountStatus::Active
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_sessions_bind_after_success_and_count_hit_and_rebind() {
    let backends = Backends::start().await;
    let a = backends.account("a", "g", |_| {}).await;
    let b = backends.account("b", "g", |_| {}).await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let mut client = replica.client.clone();
    let bind = |account| pb::BindSessionRequest {
        group: "g".into(),
        session_hash: "session-1".into(),
        account_id: account,
    };
    assert_eq!(
        client
            .bind_session(bind(b))
            .await
            .expect("bind")
            .into_inner()
            .result,
        "bound"
    );
    assert_eq!(
        client
            .bind_session(bind(b))
            .await
            .expect("bind")
            .into_inner()
            .result,
        "hit"
    );
    for _ in 0..20 {
        let mut request = select_request("g", "claude");
        request.session_hash = "session-1".into();
        let plan = client.select(request).await.expect("select").into_inner();
        assert!(plan.sticky);
        assert_eq!(
            plan.accounts[0].account_id, b,
            "the bound account goes first"
        );
    }
    assert_eq!(
        client
            .bind_session(bind(a))
            .await
            .expect("bind")
            .into_inner()
            .result,
        "rebind"
    );
    let metrics = replica.built.selector.metrics();
    assert_eq!(
        metrics
            .sticky
            .with_label_values(&["rebind", "anthropic"])
            .get(),
        1
    );
    assert_eq!(
        metrics
            .sticky
            .with_label_values(&["hit", "anthropic"])
            .get(),
        1
    );
    // A soft-blocked sticky account is not put first.
    client
        .report_outcome(report(a, pb::OutcomeClass::Busy, 429, 0))
        .await
        .expect("report");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let mut request = select_request("g", "claude");
    request.session_hash = "session-1".into();
    let plan = client.select(request).await.expect("select").into_inner();
    assert_eq!(plan.accounts[0].account_id, b);
    assert!(!plan.sticky);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_degrades_selection_and_never_fails_it() {
    let mut backends = Backends::start().await;
    let a = backends.account("a", "g", |_| {}).await;
    let b = backends.account("b", "g", |_| {}).await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let mut client = replica.client.clone();
    client
        .report_outcome(report(
            a,
            pb::OutcomeClass::WindowExhausted,
            429,
            now_ms() + 3_600_000,
        ))
        .await
        .expect("report");
    client
        .bind_session(pb::BindSessionRequest {
            group: "g".into(),
            session_hash: "s".into(),
            account_id: b,
        })
        .await
        .expect("bind");
    let plan = client
        .select(select_request("g", "claude"))
        .await
        .expect("select")
        .into_inner();
    assert_eq!(
        plan.accounts
            .iter()
            .map(|a| a.account_id)
            .collect::<Vec<_>>(),
        vec![b]
    );
    backends.redis.kill();
    tokio::time::sleep(Duration::from_millis(250)).await;
    for session in ["", "s", "other"] {
        let mut request = select_request("g", "claude");
        request.session_hash = session.into();
        let plan = client
            .select(request)
            .await
            .expect("selection never fails on a Redis outage")
            .into_inner();
        assert_eq!(
            plan.accounts
                .iter()
                .map(|a| a.account_id)
                .collect::<Vec<_>>(),
            vec![b],
            "the last known block still holds"
        );
    }
}
