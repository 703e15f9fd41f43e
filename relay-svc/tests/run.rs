//! The relay process as `main` runs it: `relay_svc::run` in process on port 0 owns, in
//! standalone mode, the admin endpoint and the state file's last write at shutdown; the binary
//! exits 2 for a configuration that cannot run and 1 for a failure while running.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use poolgate_core::account::Secret;
use poolgate_testkit::fake_upstream::FakeUpstream;
use poolgate_testkit::{Scratch, eventually};
use relay_svc::proxy::RelaySettings;
use relay_svc::run::{Config, Listeners};
use relay_svc::server::{self, Mode};
use relay_svc::standalone::StandaloneFile;
use serde_json::{Value, json};
use tokio::net::TcpListener;

const KEY: &str = "sk-run-client";
const ADMIN_TOKEN: &str = "run-admin-token";

async fn loopback() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind")
}

/// `relay-svc` with `args`, none of its settings taken from this process's environment.
fn relay_binary(args: &[&str]) -> Command {
    let mut command = Command::new(PathBuf::from(env!("CARGO_BIN_EXE_relay-svc")));
    command.args(args);
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if name.starts_with("RELAY_") || name.starts_with("POOLGATE_") {
            command.env_remove(name);
        }
    }
    command.env_remove("RUST_LOG").stdin(Stdio::null());
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_the_admin_endpoint_and_writes_the_state_file_at_shutdown() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let upstream = FakeUpstream::start().await.expect("upstream");
    let dir = Scratch::new("run").expect("scratch");
    let state_file = dir.path().join("state.json");
    let file = StandaloneFile::parse(&format!(
        "api_keys:\n  - {{key: {KEY}, group: default, user: u}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{}\", api_key: cred-a}}\nprices:\n  claude-x: {{input: 3, output: 15}}\n",
        upstream.base_url
    ))
    .expect("config");
    let config = Config {
        server: server::Config {
            mode: Mode::Standalone {
                file: Arc::new(file),
                state_file: Some(state_file.clone()),
            },
            relay: RelaySettings::default(),
            blocks: Default::default(),
            admission: Default::default(),
            shutdown_grace: Duration::from_secs(1),
        },
        admin_token: Some(Secret::new(ADMIN_TOKEN)),
    };
    assert!(config.serves_admin());
    let (client, admin) = (loopback().await, loopback().await);
    let (port, admin_port) = (
        client.local_addr().expect("addr").port(),
        admin.local_addr().expect("addr").port(),
    );
    let listeners = Listeners {
        client,
        metrics: None,
        admin: Some(admin),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let running = tokio::spawn(relay_svc::run(config, listeners, async {
        let _ = stopped.await;
    }));

    let http = reqwest::Client::new();
    let answer = http
        .post(format!("http://127.0.0.1:{port}/v1/messages"))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("relay answers");
    assert_eq!(answer.status().as_u16(), 200);

    // The admin endpoint runs with `run`, and only with its token.
    let admin_usage = format!("http://127.0.0.1:{admin_port}/admin/usage");
    let refused = http.get(&admin_usage).send().await.expect("admin answers");
    assert_eq!(refused.status().as_u16(), 401);
    eventually(Duration::from_secs(10), || async {
        let usage: Value = http
            .get(&admin_usage)
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (usage["keys"][0]["requests"] == 1).then_some(())
    })
    .await
    .expect("the request's usage, through the admin endpoint");
    // Usage is written at most every 5 s (select/src/source/memory.rs): counted sooner than
    // that, it cannot be in the file yet, and only the write at shutdown can put it there.
    if started.elapsed() < Duration::from_secs(4) {
        assert!(!state_file.exists(), "no state written before the shutdown");
    }

    stop.send(()).expect("run is running");
    let ended = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("run ends at shutdown")
        .expect("run does not panic");
    assert!(ended.is_ok(), "{ended:?}");
    let saved: Value =
        serde_json::from_slice(&std::fs::read(&state_file).expect("the state file was written"))
            .expect("JSON");
    assert_eq!(saved["usage"][0]["requests"], 1, "{saved}");
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", admin_port))
            .await
            .is_err(),
        "the admin endpoint closed with run"
    );
}

#[test]
fn standalone_without_a_config_exits_2_naming_the_flag() {
    let output = relay_binary(&["--standalone"])
        .output()
        .expect("relay-svc runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--standalone needs --config"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_address_in_use_is_a_runtime_failure_exit_1() {
    let upstream = FakeUpstream::start().await.expect("upstream");
    let dir = Scratch::new("run-busy").expect("scratch");
    let config = dir.path().join("relay.yaml");
    std::fs::write(
        &config,
        format!(
            "api_keys:\n  - {{key: {KEY}, group: default, user: u}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{}\", api_key: cred-a}}\n",
            upstream.base_url
        ),
    )
    .expect("config");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = taken.local_addr().expect("addr").to_string();
    let config = config.to_string_lossy().into_owned();
    let output = relay_binary(&[
        "--standalone",
        "--config",
        &config,
        "--listen",
        &address,
        "--metrics-listen",
        "127.0.0.1:0",
    ])
    .output()
    .expect("relay-svc runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {address}")),
        "{stderr}"
    );
}
