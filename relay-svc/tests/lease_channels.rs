//! The relay's leases end to end through admission's lease channel, and without it: by default a
//! relay holds its leases on a few lease channels (the distributed suites run that way), and
//! `--lease-channels 0` gives every lease its own `Lease` stream, as before the channel. Either
//! way the requests are served and every slot is free after the answers.

use crate::common;

use std::time::Duration;

use common::account;
use poolgate_runtime::redis_keys::AccountKeys;
use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::FakeUpstream;
use relay_svc::proxy::RelaySettings;
use serde_json::json;

/// Two admission replicas, a selector, one account; `lease_channels` on the relay.
struct Stack {
    backends: common::Backends,
    _upstream: FakeUpstream,
    _selector: selector_svc::server::Built,
    _admissions: Vec<std::sync::Arc<poolgate_lease::LeaseEngine>>,
    relay: std::sync::Arc<relay_svc::proxy::Relay>,
    base: String,
    key: String,
    account: i64,
}

async fn start(lease_channels: usize) -> Stack {
    let backends = common::backends().await.expect("backends start");
    let upstream = FakeUpstream::start().await.expect("upstream");
    upstream.set_delay(Duration::from_millis(20));
    let account = backends
        .store
        .upsert_account(&account("a", &upstream.base_url, 50, 0))
        .await
        .expect("account");
    let (_, key) = backends
        .store
        .create_api_key("t", "u", "default", 0)
        .await
        .expect("key");
    let (selector, selector_addr) = common::selector(&backends).await.expect("selector starts");
    let mut admissions = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..2 {
        let (engine, address) = common::admission(&backends.redis.url(), Default::default())
            .await
            .expect("admission starts");
        admissions.push(engine);
        urls.push(format!("http://{address}"));
    }
    let (relay, address) = common::relay_with_lease_channels(
        vec![format!("http://{selector_addr}")],
        urls,
        RelaySettings::default(),
        lease_channels,
    )
    .await
    .expect("relay starts");
    Stack {
        backends,
        _upstream: upstream,
        _selector: selector,
        _admissions: admissions,
        relay,
        base: format!("http://{address}"),
        key: key.expose().to_owned(),
        account,
    }
}

impl Stack {
    /// `count` requests at once (every other one streaming): the statuses.
    async fn requests(&self, count: usize) -> Vec<u16> {
        let http = reqwest::Client::new();
        let requests: Vec<_> = (0..count)
            .map(|n| {
                let (http, url, key) = (
                    http.clone(),
                    format!("{}/v1/messages", self.base),
                    self.key.clone(),
                );
                tokio::spawn(async move {
                    let response = http
                        .post(url)
                        .header("x-api-key", key)
                        .json(
                            &json!({"model": "claude-x", "max_tokens": 8, "stream": n % 2 == 0,
                            "messages": [{"role": "user", "content": "hi"}]}),
                        )
                        .send()
                        .await;
                    match response {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            // The whole answer: a stream's lease is held to its last byte.
                            let _ = response.bytes().await;
                            status
                        }
                        Err(_) => 0,
                    }
                })
            })
            .collect();
        let mut statuses = Vec::new();
        for request in requests {
            statuses.push(request.await.unwrap_or(0));
        }
        statuses
    }

    /// Live leases of the account in Redis.
    async fn leases(&self) -> u32 {
        let mut conn = self.backends.redis.client().await.expect("redis");
        redis::cmd("ZCOUNT")
            .arg(AccountKeys::new(self.account).leases)
            .arg(0)
            .arg("+inf")
            .query_async(&mut conn)
            .await
            .expect("zcount")
    }

    async fn all_slots_free(&self) {
        eventually(Duration::from_secs(10), || async {
            (self.leases().await == 0).then_some(())
        })
        .await
        .expect("every slot free after the answers");
    }
}

fn channel_events(metrics: &str, event: &str) -> u64 {
    let line = format!("relay_lease_channel_events_total{{event=\"{event}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_hold_their_leases_on_a_few_channels_over_both_replicas() {
    let stack = start(relay_svc::remote::DEFAULT_LEASE_CHANNELS).await;
    let statuses = stack.requests(40).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    stack.all_slots_free().await;
    let metrics = stack.relay.metrics.render();
    assert_eq!(
        channel_events(&metrics, "opened"),
        relay_svc::remote::DEFAULT_LEASE_CHANNELS as u64,
        "the channels, spread over the two replicas, carry every lease: {metrics}"
    );
    assert!(
        metrics.contains(r#"method="Admission/LeaseChannel""#),
        "{metrics}"
    );
    assert!(
        !metrics.contains(r#"method="Admission/Lease""#),
        "no lease has a stream of its own: {metrics}"
    );
    assert_eq!(channel_events(&metrics, "broken"), 0);
    assert_eq!(channel_events(&metrics, "fallback"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_lease_channels_every_lease_is_its_own_stream() {
    let stack = start(0).await;
    let statuses = stack.requests(40).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    stack.all_slots_free().await;
    let metrics = stack.relay.metrics.render();
    assert!(metrics.contains(r#"method="Admission/Lease""#), "{metrics}");
    assert!(
        !metrics.contains(r#"method="Admission/LeaseChannel""#),
        "{metrics}"
    );
    assert_eq!(channel_events(&metrics, "opened"), 0);
}
