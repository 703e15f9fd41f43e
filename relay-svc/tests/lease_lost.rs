//! What the relay does when admission answers `Lost` under a running request: a
//! released lease is not resumed, the response finishes, and the loss is counted by reason.

use crate::common;

use std::time::Duration;

use poolgate_core::lease::{LeaseId, Settings};
use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::FakeUpstream;
use relay_svc::proxy::RelaySettings;
use serde_json::json;

/// The lease ids live on `account` in Redis.
async fn lease_ids(conn: &mut redis::aio::MultiplexedConnection, account: i64) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(poolgate_runtime::redis_keys::AccountKeys::new(account).leases)
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

/// A distributed stack over `accounts` (limit 1 each) with a short lease ttl (the relay
/// heartbeats every 300 ms); the relay's handle, its address and a client key.
struct Stack {
    backends: common::Backends,
    upstream: FakeUpstream,
    admission: std::sync::Arc<poolgate_lease::LeaseEngine>,
    handle: std::sync::Arc<relay_svc::proxy::Relay>,
    relay: std::net::SocketAddr,
    key: String,
    _selector: selector_svc::server::Built,
}

async fn stack(accounts: &[&str]) -> Stack {
    let backends = common::backends().await.expect("backends start");
    let upstream = FakeUpstream::start().await.expect("upstream");
    for (priority, name) in accounts.iter().enumerate() {
        backends
            .store
            .upsert_account(&common::account(
                name,
                &upstream.base_url,
                1,
                priority as i32,
            ))
            .await
            .expect("account");
    }
    let (_, key) = backends
        .store
        .create_api_key("test", "alice", "default", 0)
        .await
        .expect("key");
    let (selector, selector_addr) = common::selector(&backends).await.expect("selector starts");
    let settings = Settings {
        lease_ttl: Duration::from_millis(900),
        ..Settings::default()
    };
    let (admission, admission_addr) = common::admission(&backends.redis.url(), settings)
        .await
        .expect("admission starts");
    let (handle, relay) = common::relay_with_handle(
        vec![format!("http://{selector_addr}")],
        vec![format!("http://{admission_addr}")],
        RelaySettings {
            max_wait: Duration::from_secs(10),
            ..RelaySettings::default()
        },
    )
    .await
    .expect("relay starts");
    Stack {
        backends,
        upstream,
        admission,
        handle,
        relay,
        key: key.expose().to_owned(),
        _selector: selector,
    }
}

impl Stack {
    fn send(&self, stream: bool) -> tokio::task::JoinHandle<(u16, String)> {
        let (relay, key) = (self.relay, self.key.clone());
        tokio::spawn(async move {
            let response = reqwest::Client::new()
                .post(format!("http://{relay}/v1/messages"))
                .header("x-api-key", key)
                .json(&json!({"model": "claude-x", "max_tokens": 8, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
                .expect("relay answers");
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        })
    }

    /// Waits for the request's lease on `account` and releases it by id (the unary RPC).
    async fn release_the_lease_of(&self, account: i64) {
        let mut conn = self.backends.redis.client().await.expect("redis");
        let lease = eventually(Duration::from_secs(5), || {
            let mut conn = conn.clone();
            async move { lease_ids(&mut conn, account).await.into_iter().next() }
        })
        .await
        .expect("the request holds a lease");
        let lease_id = LeaseId::parse(&lease).expect("lease id");
        assert!(self.admission.release(&lease_id, None, 0).await);
        assert!(lease_ids(&mut conn, account).await.is_empty());
    }

    async fn lost_released(&self) {
        eventually(Duration::from_secs(3), || {
            let text = self.handle.metrics.render();
            async move {
                (counter(&text, "relay_lease_lost_total{reason=\"released\"}") == 1.0).then_some(())
            }
        })
        .await
        .expect("relay_lease_lost_total{reason=\"released\"} counts the loss");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_released_after_the_first_byte_is_not_resumed_and_the_response_finishes() {
    let stack = stack(&["only"]).await;
    // The first event goes out at once; the rest of the stream takes a while.
    stack.upstream.set_chunk_delay(Duration::from_millis(400));
    let request = stack.send(true);
    stack.release_the_lease_of(1).await;
    // The relay's next heartbeat is answered Lost{released}: counted, not resumed.
    stack.lost_released().await;
    let mut conn = stack.backends.redis.client().await.expect("redis");
    assert!(
        lease_ids(&mut conn, 1).await.is_empty(),
        "the released lease was not resumed"
    );
    let (status, text) = request.await.expect("request task");
    assert_eq!(status, 200, "the response finished");
    assert!(text.contains("message_stop"), "{text}");
    let metrics = stack.handle.metrics.render();
    assert_eq!(counter(&metrics, "relay_lease_resumed_total"), 0.0);
    assert_eq!(counter(&metrics, "relay_lease_lost_total"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_released_before_the_first_byte_fails_the_request_over() {
    let stack = stack(&["first", "second"]).await;
    // The upstream takes 1.5 s to answer: the release lands before any byte.
    stack.upstream.set_delay(Duration::from_millis(1_500));
    let request = stack.send(false);
    stack.release_the_lease_of(1).await;
    stack.lost_released().await;
    let (status, text) = request.await.expect("request task");
    assert_eq!(status, 200, "{text}");
    assert!(
        stack.upstream.stats("cred-second").total >= 1,
        "served by the other account"
    );
    let failovers = stack
        .handle
        .metrics
        .failovers
        .with_label_values(&["lease_lost", "failover"])
        .get();
    assert_eq!(failovers, 1);
}
