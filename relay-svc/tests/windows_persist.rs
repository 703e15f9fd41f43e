//! Usage-window readings outlive the process that learned them (docs/DESIGN.md §5): a standalone
//! relay keeps them in its state file (written every few seconds and at shutdown) and reads them
//! back at start; distributed, Redis keeps them through a restart that keeps its data, and every
//! selector on that Redis orders by what any relay learned.
//!
//! Each case sees it in the selection: two accounts, `first` with a weekly window nearly used
//! (the fake upstream answers `allowed_warning`), `second` with room. A new conversation goes
//! to `second` only while the relay knows that; without the readings both accounts are unknown
//! and each new conversation reaches `first` about half the time.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::processes::{Process, binary};
use poolgate_core::AccountId;
use poolgate_select::health::Windows;
use poolgate_testkit::fake_upstream::{
    FakeUpstream, WARNING_AT, Window, WindowBudgets, WindowUnit,
};
use poolgate_testkit::{Scratch, eventually, free_port};
use relay_svc::proxy::RelaySettings;
use serde_json::{Value, json};

const KEY: &str = "sk-windows-persist";
/// `first`'s weekly window, in requests: warming it up with `WARNED` of them leaves its answers
/// saying `allowed_warning`, so it orders last for new sessions.
const CAPACITY: u64 = 10;
const WARNED: u64 = 8;
/// New conversations that must all go to `second`: by chance, without the readings, 1 in 1024.
const NEW_SESSIONS: usize = 10;

fn weekly(capacity: u64) -> WindowBudgets {
    WindowBudgets {
        unit: WindowUnit::Requests,
        weekly: Some(Window::new(Duration::from_secs(7 * 24 * 3600), capacity)),
        ..WindowBudgets::default()
    }
}

/// The two accounts' windows; `first` serves only `claude-warm` besides `claude-x`, `second` only
/// `claude-fresh`, so the warm-up reaches each account whatever the order.
fn windows_on(upstream: &FakeUpstream) {
    assert!(WARNED as f64 / CAPACITY as f64 >= WARNING_AT);
    upstream.set_windows("cred-first", weekly(CAPACITY));
    upstream.set_windows("cred-second", weekly(10_000));
}

fn served(upstream: &FakeUpstream, name: &str) -> u64 {
    upstream.stats(&format!("cred-{name}")).total
}

async fn message(base: &str, key: &str, model: &str, turn: &str) -> u16 {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
        .post(format!("{base}/v1/messages"))
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": turn}]}))
        .send()
        .await
        .map(|answer| answer.status().as_u16())
        .unwrap_or(0)
}

/// `first` answers `WARNED` times (its week nearly used), `second` once (room).
async fn warm_up(upstream: &FakeUpstream, base: &str, key: &str) {
    for n in 0..WARNED {
        assert_eq!(
            message(base, key, "claude-warm", &format!("warm {n}")).await,
            200
        );
    }
    assert_eq!(message(base, key, "claude-fresh", "fresh").await, 200);
    assert_eq!(
        (served(upstream, "first"), served(upstream, "second")),
        (WARNED, 1)
    );
}

/// New conversations, each its own session: all of them go to `second`.
async fn new_sessions_avoid_first(upstream: &FakeUpstream, base: &str, key: &str, what: &str) {
    let before = served(upstream, "first");
    for n in 0..NEW_SESSIONS {
        let turn = format!("new conversation {n} {}", fastrand::u64(..));
        assert_eq!(message(base, key, "claude-x", &turn).await, 200);
    }
    assert_eq!(
        served(upstream, "first") - before,
        0,
        "{what}: a new session went to the account whose week is nearly used (its readings \
         were not known)"
    );
}

// --- Standalone: the state file ---------------------------------------------------------

struct Relay {
    process: Process,
    base: String,
}

async fn start(config: &Path, state_file: &Path) -> Relay {
    let port = free_port().expect("port");
    let process = Process(
        Command::new(binary("relay-svc"))
            .args(["--standalone", "--config"])
            .arg(config)
            .arg("--state-file")
            .arg(state_file)
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .env_remove("RUST_LOG")
            .env_remove("RELAY_ADMIN_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("relay starts"),
    );
    eventually(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(|_| ())
    })
    .await
    .expect("relay listens");
    Relay {
        process,
        base: format!("http://127.0.0.1:{port}"),
    }
}

/// `first`'s saved readings, when the state file has any.
fn saved_readings_of_first(state_file: &Path) -> Option<Vec<Value>> {
    let saved: Value = serde_json::from_slice(&std::fs::read(state_file).ok()?).ok()?;
    saved["windows"]["first"].as_array().cloned()
}

#[derive(Clone, Copy)]
enum Stop {
    /// SIGTERM: the write at shutdown carries the readings.
    Graceful,
    /// `kill -9` once the periodic write has the readings in the file.
    Crash,
}

async fn standalone_restart_keeps_the_readings(stop: Stop) {
    let upstream = FakeUpstream::start().await.expect("upstream");
    windows_on(&upstream);
    let dir = Scratch::new("windows-persist").expect("scratch");
    let config = dir.path().join("relay.yaml");
    std::fs::write(
        &config,
        format!(
            "api_keys:\n  - {{key: {KEY}, group: default, user: u}}\naccounts:\n  - {{name: first, platform: anthropic, base_url: \"{base}\", api_key: cred-first, models: [claude-x, claude-warm]}}\n  - {{name: second, platform: anthropic, base_url: \"{base}\", api_key: cred-second, models: [claude-x, claude-fresh]}}\n",
            base = upstream.base_url
        ),
    )
    .expect("config");
    let state_file = dir.path().join("state.json");

    let relay = start(&config, &state_file).await;
    warm_up(&upstream, &relay.base, KEY).await;
    match stop {
        Stop::Graceful => {
            relay.process.terminate();
            let mut process = relay.process;
            let _ = process.0.wait();
        }
        Stop::Crash => {
            // Written within the period (5 s), without a shutdown.
            eventually(Duration::from_secs(15), || async {
                saved_readings_of_first(&state_file).filter(|readings| !readings.is_empty())
            })
            .await
            .expect("the periodic write keeps the readings");
            relay.process.kill9();
        }
    }
    let saved = saved_readings_of_first(&state_file).unwrap_or_default();
    assert!(
        !saved.is_empty(),
        "the state file keeps first's readings: {saved:?}"
    );

    // The same config and state file: the readings are known before any answer is.
    let relay = start(&config, &state_file).await;
    new_sessions_avoid_first(&upstream, &relay.base, KEY, "after the restart").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_window_readings_survive_a_graceful_restart_through_the_state_file() {
    standalone_restart_keeps_the_readings(Stop::Graceful).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_window_readings_reach_the_state_file_within_seconds_and_survive_a_crash() {
    standalone_restart_keeps_the_readings(Stop::Crash).await;
}

// --- Distributed: Redis ------------------------------------------------------------------

struct Stack {
    backends: common::Backends,
    key: String,
    first: AccountId,
    admission: String,
}

async fn stack(upstream: &FakeUpstream) -> Stack {
    let backends = common::backends().await.expect("backends start");
    let mut ids = Vec::new();
    for (name, models) in [
        ("first", ["claude-x", "claude-warm"]),
        ("second", ["claude-x", "claude-fresh"]),
    ] {
        let mut account = common::account(name, &upstream.base_url, 8, 0);
        account.allowed_models = models.iter().map(|m| m.to_string()).collect();
        ids.push(
            backends
                .store
                .upsert_account(&account)
                .await
                .expect("account"),
        );
    }
    let (_, key) = backends
        .store
        .create_api_key("windows", "alice", "default", 0)
        .await
        .expect("key");
    let (_admission, admission) = common::admission(&backends.redis.url(), Default::default())
        .await
        .expect("admission starts");
    Stack {
        key: key.expose().to_owned(),
        first: ids[0],
        admission: format!("http://{admission}"),
        backends,
    }
}

impl Stack {
    /// A selector on the stack's Postgres and Redis, and a relay of its own in front of it.
    async fn selector_and_relay(&self) -> (selector_svc::server::Built, String) {
        let (built, selector) = common::selector(&self.backends)
            .await
            .expect("selector starts");
        let relay = common::relay(
            vec![format!("http://{selector}")],
            vec![self.admission.clone()],
            RelaySettings {
                max_wait: Duration::from_secs(5),
                ..RelaySettings::default()
            },
        )
        .await
        .expect("relay starts");
        (built, format!("http://{relay}"))
    }
}

/// Waits until Redis has `first`'s warning (the relay sends readings with its reports, every
/// 50 ms), read through `selector`'s store.
async fn readings_stored(selector: &selector_svc::server::Built, first: AccountId) {
    eventually(Duration::from_secs(10), || async {
        let readings = selector.health.read_windows(&[first]).await.ok()?;
        readings
            .first()?
            .iter()
            .any(|r| r.utilization.is_some_and(|used| used >= WARNING_AT))
            .then_some(())
    })
    .await
    .expect("first's readings reach Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_readings_survive_a_redis_restart_that_keeps_its_data() {
    let upstream = FakeUpstream::start().await.expect("upstream");
    windows_on(&upstream);
    let mut stack = stack(&upstream).await;
    let (selector, relay) = stack.selector_and_relay().await;
    warm_up(&upstream, &relay, &stack.key).await;
    readings_stored(&selector, stack.first).await;

    stack
        .backends
        .redis
        .stop_keeping_data()
        .await
        .expect("redis stops");
    stack
        .backends
        .redis
        .start_again()
        .await
        .expect("redis starts");
    // Back on Redis: a request only `second` serves goes through (selector and admission
    // reconnected) without an answer from `first`.
    eventually(Duration::from_secs(15), || async {
        (message(&relay, &stack.key, "claude-fresh", "after the restart").await == 200)
            .then_some(())
    })
    .await
    .expect("the stack serves again after the Redis restart");
    // The same selector, whose cached readings (one load-cache period) are long gone: what it
    // orders by now, it read from Redis.
    new_sessions_avoid_first(&upstream, &relay, &stack.key, "after the Redis restart").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_readings_learned_through_one_relay_order_another_selectors_new_sessions() {
    let upstream = FakeUpstream::start().await.expect("upstream");
    windows_on(&upstream);
    let stack = stack(&upstream).await;
    // Two selectors on one Redis and Postgres, each with its relay.
    let (selector_a, relay_a) = stack.selector_and_relay().await;
    let (_selector_b, relay_b) = stack.selector_and_relay().await;
    warm_up(&upstream, &relay_a, &stack.key).await;
    readings_stored(&selector_a, stack.first).await;
    // Selector B never saw an answer of `first`'s: it orders by what relay A's answers said,
    // and relay B plans by selector B's view of it, at most a view period (200 ms) behind
    // (docs/DESIGN.md §2): given a second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    new_sessions_avoid_first(&upstream, &relay_b, &stack.key, "through the other relay").await;
}
