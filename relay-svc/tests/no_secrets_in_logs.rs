//! Credentials never reach the logs: a relay at debug level serves successes, upstream errors
//! and refusals, and its whole output is searched for the upstream credentials and client keys.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use poolgate_testkit::fake_upstream::{FakeUpstream, Scripted};
use poolgate_testkit::{eventually, free_port};
use serde_json::json;

const UPSTREAM_SECRET: &str = "sk-ant-api03-UPSTREAM-SECRET-0001";
const OTHER_SECRET: &str = "sk-OPENAI-UPSTREAM-SECRET-0002";
const CLIENT_KEY: &str = "pgk-CLIENT-KEY-SECRET-0003";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debug_level_run_logs_no_credential() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let upstream = FakeUpstream::start().await.expect("upstream");
    upstream.script(
        UPSTREAM_SECRET,
        [Scripted::Fail {
            status: 401,
            headers: vec![],
            body: r#"{"error":"bad key"}"#.into(),
        }],
    );
    upstream.script(
        OTHER_SECRET,
        [Scripted::Fail {
            status: 500,
            headers: vec![],
            body: "boom".into(),
        }],
    );
    let dir = std::env::temp_dir().join(format!("poolgate-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("relay.yaml");
    std::fs::write(
        &config,
        format!(
            "api_keys:\n  - {{key: {CLIENT_KEY}, group: default, user: u}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{0}\", api_key: {UPSTREAM_SECRET}, concurrency: 2}}\n  - {{name: b, platform: anthropic, base_url: \"{0}\", api_key: sk-ant-second-ok, concurrency: 2}}\n  - {{name: o, platform: openai, base_url: \"{0}\", api_key: {OTHER_SECRET}, concurrency: 2}}\n",
            upstream.base_url
        ),
    )
    .expect("config");
    let port = free_port().expect("port");
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_relay-svc"));
    let child = Command::new(binary)
        .args(["--standalone", "--config"])
        .arg(&config)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics-listen",
            "127.0.0.1:0",
            "--shutdown-grace-ms",
            "1000",
        ])
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("relay starts");
    eventually(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(|_| ())
    })
    .await
    .expect("relay listens");
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    for stream in [false, true, false] {
        let _ = http
            .post(format!("{base}/v1/messages"))
            .header("x-api-key", CLIENT_KEY)
            .json(&json!({"model": "m", "max_tokens": 4, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .and_then(|r| r.error_for_status());
    }
    let _ = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await;
    let _ = http
        .post(format!("{base}/v1/messages"))
        .header("x-api-key", "pgk-wrong-key")
        .json(&json!({"model": "m"}))
        .send()
        .await;
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("output");
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        logs.contains("DEBUG") || logs.contains("debug"),
        "the run logged at debug level: {} bytes",
        logs.len()
    );
    for secret in [
        UPSTREAM_SECRET,
        OTHER_SECRET,
        CLIENT_KEY,
        "sk-ant-second-ok",
    ] {
        assert!(!logs.contains(secret), "{secret} appeared in the logs");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
