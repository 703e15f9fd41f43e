//! The selector's port against callers it does not know: calls to paths it does not serve,
//! with or without the service token, add no metric series (they count as `unknown`); a wrong
//! admin token is answered only after a fixed delay, a flood of them past the cap is refused at
//! once, and the right token is never locked out.

use crate::support;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use poolgate_rpc::service_auth::SERVICE_TOKEN_HEADER;
use poolgate_runtime::failed_auth::{MAX_DELAYED_REFUSALS, REFUSAL_DELAY};
use poolgate_testkit::{call_empty, delayed_per_flood};
use support::{ADMIN_TOKEN, Backends, Replica, SERVICE_TOKEN, fast_settings};
use tonic::Code;
use tonic::transport::Channel;

const LIST_ACCOUNTS: &str = "/poolgate.selector.v1.SelectorAdmin/ListAccounts";

async fn channel(replica: &Replica) -> Channel {
    Channel::from_shared(format!("http://{}", replica.addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connects")
}

/// The sample lines of the selector's metrics.
fn series(page: &str) -> Vec<&str> {
    page.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

/// The gRPC server's series (other metrics move on their own: reloads, background work).
fn grpc_series(page: &str) -> Vec<&str> {
    series(page)
        .into_iter()
        .filter(|line| line.starts_with("grpc_server_"))
        .collect()
}

/// `grpc_server_requests_total` for a method and code (0 when absent).
fn requests(page: &str, method: &str, code: &str) -> u64 {
    let (method, code) = (format!("method=\"{method}\""), format!("code=\"{code}\""));
    series(page)
        .iter()
        .filter(|line| line.starts_with("grpc_server_requests_total{"))
        .find(|line| line.contains(&method) && line.contains(&code))
        .and_then(|line| line.rsplit(' ').next())
        .map_or(0, |value| value.trim().parse().expect("a count"))
}

/// A path the selector does not serve, different every call.
fn random_path(seed: &RandomState, n: u64) -> String {
    let r = seed.hash_one(n);
    match n % 4 {
        0 => format!("/pkg{r:x}.Svc{}/Method{}", r % 997, r >> 7),
        1 => format!("/poolgate.selector.v1.Selector/Nope{r:x}"),
        2 => format!("/poolgate.selector.v1.SelectorAdmin/Nope{r:x}"),
        _ => format!("/{}/{r:x}", "a".repeat(200 + (r % 50) as usize)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_calls_to_random_paths_add_no_series() {
    let backends = Backends::start().await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let metrics = replica.built.selector.metrics().clone();
    let channel = channel(&replica).await;
    let with_token = [(SERVICE_TOKEN_HEADER, SERVICE_TOKEN)];
    let seed = RandomState::new();
    // One unknown call of each kind first: the `unknown` series exist from then on.
    for metadata in [&[][..], &with_token[..]] {
        call_empty(channel.clone(), &random_path(&seed, 1_000_000), metadata)
            .await
            .expect("call");
    }
    let before = metrics.render();
    let mut sent = Vec::new();
    for n in 0..300 {
        let path = random_path(&seed, n);
        let with = n % 2 == 1;
        let metadata: &[(&str, &str)] = if with { &with_token } else { &[] };
        let (code, _) = call_empty(channel.clone(), &path, metadata)
            .await
            .expect("call");
        let expected = if with {
            Code::Unimplemented
        } else {
            Code::Unauthenticated
        };
        assert_eq!(code, expected, "{path}");
        sent.push(path);
    }
    let after = metrics.render();
    assert_eq!(
        grpc_series(&before).len(),
        grpc_series(&after).len(),
        "300 unknown paths added series: {:?}",
        grpc_series(&after)
            .into_iter()
            .filter(|line| {
                let name = line.rsplit_once(' ').map_or(*line, |(name, _)| name);
                !grpc_series(&before).iter().any(|b| b.starts_with(name))
            })
            .collect::<Vec<_>>()
    );
    for path in &sent {
        let method = path.rsplit('/').next().unwrap_or_default();
        assert!(!after.contains(method), "{path} reached a label");
    }
    // Refused calls stay visible, under one label.
    for code in ["Unauthenticated", "Unimplemented"] {
        assert_eq!(
            requests(&after, "unknown", code) - requests(&before, "unknown", code),
            150,
            "{code}"
        );
    }
    // A served method keeps its own label.
    let (code, _) = call_empty(
        channel,
        LIST_ACCOUNTS,
        &[
            (SERVICE_TOKEN_HEADER, SERVICE_TOKEN),
            ("authorization", &format!("Bearer {ADMIN_TOKEN}")),
        ],
    )
    .await
    .expect("call");
    assert_eq!(code, Code::Ok);
    assert_eq!(
        requests(&metrics.render(), "SelectorAdmin/ListAccounts", "Ok"),
        1
    );
}

/// One admin call with `bearer`; its code and how long it took.
async fn list_accounts(channel: Channel, bearer: &str) -> (Code, Duration) {
    let started = Instant::now();
    let bearer = format!("Bearer {bearer}");
    let (code, _) = call_empty(
        channel,
        LIST_ACCOUNTS,
        &[
            (SERVICE_TOKEN_HEADER, SERVICE_TOKEN),
            ("authorization", &bearer),
        ],
    )
    .await
    .expect("call");
    (code, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_admin_token_costs_a_delay_and_a_flood_never_locks_the_right_one_out() {
    let backends = Backends::start().await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let channel = channel(&replica).await;

    let (code, took) = list_accounts(channel.clone(), "wrong-token").await;
    assert_eq!(code, Code::Unauthenticated);
    assert!(took >= REFUSAL_DELAY, "a wrong token answered in {took:?}");
    let (code, _) = list_accounts(channel.clone(), ADMIN_TOKEN).await;
    assert_eq!(code, Code::Ok);

    // A flood of wrong tokens: at most the cap of them wait out the delay, the rest are refused
    // at once, and the right token gets through meanwhile.
    let flood = 3 * MAX_DELAYED_REFUSALS;
    let counts = delayed_per_flood(
        flood,
        REFUSAL_DELAY,
        1..=MAX_DELAYED_REFUSALS,
        || {
            let channel = channel.clone();
            async move {
                let (code, took) = list_accounts(channel, "wrong-token").await;
                assert_eq!(code, Code::Unauthenticated);
                took
            }
        },
        || async {
            let (code, _) = list_accounts(channel.clone(), ADMIN_TOKEN).await;
            assert_eq!(code, Code::Ok, "the right token during a flood");
        },
    )
    .await;
    assert!(
        counts
            .last()
            .is_some_and(|delayed| (1..=MAX_DELAYED_REFUSALS).contains(delayed)),
        "refusals that waited the delay, per flood of {flood}: {counts:?}"
    );
}
