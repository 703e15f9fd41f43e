//! The selector's probe takes its leases from the lease engine built by its one constructor
//! (`poolgate_lease::start`), so a release that fails while Redis restarts is retried until it
//! lands. Before, the probe's engine was built by hand without the retry task: such a lease
//! held the account's slot until its ttl (2 minutes).

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use poolgate_core::lease::LeaseTerms;
use poolgate_lease::start::RELEASE_RETRY_INTERVAL;
use poolgate_runtime::ports::ProbeLeases;
use poolgate_runtime::redis_keys::AccountKeys;
use poolgate_select::metrics::Metrics;
use poolgate_testkit::{RedisServer, eventually};
use selector_svc::server;
use support::{Backends, fast_settings};

async fn leases_held(redis: &RedisServer, account_id: i64) -> Option<u32> {
    let mut conn = redis.client().await.ok()?;
    redis::cmd("ZCARD")
        .arg(&AccountKeys::new(account_id).leases)
        .query_async(&mut conn)
        .await
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_release_that_failed_during_a_redis_restart_lands_within_the_retry_interval() {
    let mut backends = Backends::start().await;
    let metrics = Metrics::new();
    let built = server::build(&backends.config(fast_settings()), metrics.clone())
        .await
        .expect("selector builds");
    let leases: Arc<dyn ProbeLeases> = built.probe_leases.clone();
    let terms = LeaseTerms {
        account_id: 7,
        concurrency_limit: 1,
        rpm_limit: 0,
        user: None,
        session_hash: None,
        session_window_limit_micros: 0,
        session_bound: false,
        ignore_cooldown: true,
        key: None,
    };
    let lease = leases
        .acquire_probe(&terms, Duration::from_secs(1))
        .await
        .expect("redis answers")
        .expect("a free account grants the probe its lease");
    assert_eq!(leases_held(&backends.redis, 7).await, Some(1));
    let mut conn = backends.redis.client().await.expect("redis client");
    let _: () = redis::cmd("SET")
        .arg("test:survives-the-restart")
        .arg(1)
        .query_async(&mut conn)
        .await
        .expect("marker written");
    drop(conn);

    backends
        .redis
        .stop_keeping_data()
        .await
        .expect("redis stops");
    // Redis is down: the release cannot land now and is queued.
    leases.release_probe(&lease, &terms).await;
    backends
        .redis
        .start_again()
        .await
        .expect("redis starts again");
    let restarted = Instant::now();

    // The restart kept Redis's data, so the lease is still there unless a retry frees it.
    let mut conn = backends.redis.client().await.expect("redis client");
    let marker: Option<i64> = redis::cmd("GET")
        .arg("test:survives-the-restart")
        .query_async(&mut conn)
        .await
        .expect("marker read");
    assert_eq!(marker, Some(1), "the restart kept the data");

    // Within a few retry intervals (the connection comes back first), far below the lease ttl.
    let bound = RELEASE_RETRY_INTERVAL * 5;
    eventually(bound, || async {
        (leases_held(&backends.redis, 7).await == Some(0)).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!("the probe's lease is still held {bound:?} after Redis came back: its failed release was never retried")
    });
    assert!(restarted.elapsed() < bound);
    let text = metrics.render();
    let retries = text
        .lines()
        .find_map(|line| line.strip_prefix("admission_release_retries_total "))
        .and_then(|value| value.trim().parse::<f64>().ok());
    assert!(
        retries.is_some_and(|n| n >= 1.0),
        "the probe engine's release retry is counted in the selector's metrics: {retries:?}"
    );
}
