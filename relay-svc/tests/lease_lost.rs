//! What the relay does when admission answers `Lost` under a running request (issue 12): a
//! released lease is not resumed, the response finishes, and the loss is counted by reason.

mod common;

use std::time::Duration;

use admission_svc::domain::{LeaseId, Settings};
use poolgate_testkit::eventually;
use relay_svc::fake_upstream::FakeUpstream;
use relay_svc::proxy::RelaySettings;
use serde_json::json;

/// The lease ids live on `account` in Redis.
async fn lease_ids(conn: &mut redis::aio::MultiplexedConnection, account: i64) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(poolgate_proto::keys::AccountKeys::new(account).leases)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .expect("zrange")
}

fn counter(metrics: &str, line_start: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(line_start))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_released_under_a_running_request_is_not_resumed_and_the_response_finishes() {
    let backends = common::backends().await;
    let upstream = FakeUpstream::start().await.expect("upstream");
    let account_id = backends
        .store
        .upsert_account(&common::account("only", &upstream.base_url, 1, 0))
        .await
        .expect("account");
    let (_, key) = backends
        .store
        .create_api_key("test", "alice", "default", 0)
        .await
        .expect("key");
    let (_selector, selector_addr) = common::selector(&backends).await;
    // A short ttl: the relay heartbeats every 300 ms.
    let settings = Settings {
        lease_ttl: Duration::from_millis(900),
        ..Settings::default()
    };
    let (admission, admission_addr) = common::admission(&backends.redis.url(), settings).await;
    let (handle, relay) = common::relay_with_handle(
        vec![format!("http://{selector_addr}")],
        vec![format!("http://{admission_addr}")],
        RelaySettings {
            max_wait: Duration::from_secs(10),
            ..RelaySettings::default()
        },
    )
    .await;
    upstream.set_delay(Duration::from_millis(1_500));
    let http = reqwest::Client::new();
    let request = {
        let http = http.clone();
        let key = key.expose().to_owned();
        tokio::spawn(async move {
            http.post(format!("http://{relay}/v1/messages"))
                .header("x-api-key", key)
                .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
                .expect("relay answers")
                .status()
                .as_u16()
        })
    };
    let mut conn = backends.redis.client().await.expect("redis");
    let lease = eventually(Duration::from_secs(5), || {
        let mut conn = conn.clone();
        async move { lease_ids(&mut conn, account_id).await.into_iter().next() }
    })
    .await
    .expect("the request holds a lease");
    // Someone releases the lease by id (the unary RPC) while the request runs.
    let lease_id = LeaseId::parse(&lease).expect("lease id");
    assert!(admission.release(&lease_id, None, 0).await);
    // The relay's next heartbeat is answered Lost{released}: counted, not resumed.
    eventually(Duration::from_secs(3), || {
        let text = handle.metrics.render();
        async move {
            (counter(&text, "relay_lease_lost_total{reason=\"released\"}") == 1.0).then_some(())
        }
    })
    .await
    .expect("relay_lease_lost_total{reason=\"released\"} counts the loss");
    assert!(
        lease_ids(&mut conn, account_id).await.is_empty(),
        "the released lease was not resumed"
    );
    assert_eq!(
        request.await.expect("request task"),
        200,
        "the response finished"
    );
    let text = handle.metrics.render();
    assert_eq!(counter(&text, "relay_lease_resumed_total"), 0.0);
    assert_eq!(counter(&text, "relay_lease_lost_total"), 1.0);
}
