//! How stale a relay's view may be (docs/DESIGN.md §2, "Selection at the edge"): two relays
//! selecting at the edge from one selector; an upstream's window-exhausted answer reported by
//! relay A hard-blocks the account, and relay B's next plans leave it out within a second of the
//! report (measured: printed), without B asking the selector for a plan.

use std::time::{Duration, Instant};

use poolgate_core::account::Platform;
use poolgate_core::caller::KeyCheck;
use poolgate_core::outcome::{Outcome, OutcomeClass};
use poolgate_core::plan::PlanRequest;
use poolgate_stack::{self as stack, SERVICE_TOKEN};
use relay_svc::ports::SelectionApi;
use relay_svc::remote::{GrpcClient, remote_backends};

async fn edge_relay(
    selector: &str,
    admission: &str,
) -> (
    std::sync::Arc<dyn SelectionApi>,
    relay_svc::remote::metrics::Metrics,
) {
    let metrics = relay_svc::remote::metrics::Metrics::new();
    let (selection, _leases) = remote_backends(
        &[selector.to_owned()],
        &[admission.to_owned()],
        &GrpcClient {
            service_token: Some(SERVICE_TOKEN.into()),
            ..Default::default()
        },
        metrics.clone(),
        Some((
            Default::default(),
            relay_svc::server::edge_engine_settings(&Default::default()),
        )),
    )
    .expect("the clients are configured");
    (selection, metrics)
}

fn counter(metrics: &relay_svc::remote::metrics::Metrics, name: &str, label: &str) -> f64 {
    metrics
        .registry
        .gather()
        .iter()
        .filter(|family| family.name() == name)
        .flat_map(|family| family.get_metric().iter())
        .filter(|metric| {
            label.is_empty() || metric.get_label().iter().any(|pair| pair.value() == label)
        })
        .map(|metric| metric.get_counter().get_value())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_one_relay_reported_reaches_another_relays_plans_within_a_second() {
    let backends = stack::backends().await.expect("postgres and redis start");
    let mut ids = Vec::new();
    for name in ["first", "second"] {
        let input = stack::account(name, "http://127.0.0.1:9", 4, 0);
        ids.push(
            backends
                .store
                .upsert_account(&input)
                .await
                .expect("account"),
        );
    }
    let (_, key) = backends
        .store
        .create_api_key("edge", "edge", "default", 0)
        .await
        .expect("client key");
    let (_selector, selector_addr) = stack::selector(&backends).await.expect("selector starts");
    let (_admission, admission_addr) = stack::admission(&backends.redis.url(), Default::default())
        .await
        .expect("admission starts");
    let (selector, admission) = (
        format!("http://{selector_addr}"),
        format!("http://{admission_addr}"),
    );
    let (a, a_metrics) = edge_relay(&selector, &admission).await;
    let (b, b_metrics) = edge_relay(&selector, &admission).await;
    for metrics in [&a_metrics, &b_metrics] {
        poolgate_testkit::eventually(Duration::from_secs(10), || async {
            (counter(metrics, "relay_view_updates_total", "") > 0.0).then_some(())
        })
        .await
        .expect("the view arrives");
    }
    let KeyCheck::Known(caller) = b.check_key(key.expose()).await.expect("answers") else {
        panic!("the key is known at the edge");
    };
    let request = PlanRequest {
        service: Default::default(),
        api_key_id: caller.api_key_id,
        group: "default".into(),
        platform: Platform::Anthropic,
        model: "claude-x".into(),
        session_hash: None,
        previous_response_id: None,
        exclude: Vec::new(),
        opens_conversation: true,
    };
    let planned =
        |plan: &relay_svc::ports::Plan| plan.accounts.iter().map(|a| a.id).collect::<Vec<_>>();
    let before = b.plan(&request).await.expect("a plan");
    assert!(planned(&before).contains(&ids[0]));

    // The upstream's answer, as the relay classifies it: the account's window ran out for an
    // hour (a hard block until its reset).
    let exhausted = Outcome {
        reset_at_ms: Some(poolgate_core::now_ms() + 3_600_000),
        reason: "rate_limit_error".into(),
        ..Outcome::new(ids[0], OutcomeClass::WindowExhausted, 429)
    };
    let reported = Instant::now();
    a.report(exhausted).await.expect("applied");
    let edge_before = counter(&b_metrics, "relay_edge_plans_total", "edge");
    let mut polls = 0;
    let reached = loop {
        let plan = b.plan(&request).await.expect("a plan");
        polls += 1;
        if !planned(&plan).contains(&ids[0]) {
            break reported.elapsed();
        }
        assert!(
            reported.elapsed() < Duration::from_secs(1),
            "relay B still plans the blocked account a second after relay A reported it"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    eprintln!("the block reached the other relay's plans {reached:?} after the report");
    assert_eq!(
        counter(&b_metrics, "relay_edge_plans_total", "edge") - edge_before,
        f64::from(polls),
        "every plan of relay B was made at the edge"
    );
    assert_eq!(
        counter(&b_metrics, "relay_edge_plans_total", "no_view"),
        0.0
    );
}
