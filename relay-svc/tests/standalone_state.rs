//! A standalone relay as operators run it, a process: what must survive a restart does (a
//! refreshed OAuth token: refresh tokens are single-use), and the admin verbs work against it
//! with the admin token and refuse without it (`windows` among them: what the upstream's answers
//! said about the accounts' usage windows).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::processes::{Process, binary};
use poolgate_testkit::fake_upstream::{FakeUpstream, Window, WindowBudgets};
use poolgate_testkit::{eventually, free_port};
use serde_json::{Value, json};

const KEY: &str = "sk-state-client";
const ADMIN_TOKEN: &str = "state-admin-token";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "poolgate-{name}-{}-{}",
        std::process::id(),
        poolgate_core::now_ms()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

struct Relay {
    process: Process,
    port: u16,
    admin_port: u16,
}

async fn start(config: &Path, state_file: &Path) -> Relay {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (port, admin_port) = (free_port().expect("port"), free_port().expect("port"));
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
                "--admin-listen",
                &format!("127.0.0.1:{admin_port}"),
                "--admin-token",
                ADMIN_TOKEN,
            ])
            .env_remove("RUST_LOG")
            .env_remove("RELAY_ADMIN_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("relay starts"),
    );
    for listening in [port, admin_port] {
        eventually(Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", listening))
                .await
                .ok()
                .map(|_| ())
        })
        .await
        .expect("relay listens");
    }
    Relay {
        process,
        port,
        admin_port,
    }
}

impl Relay {
    async fn message(&self) -> (u16, Value) {
        let response = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/v1/messages", self.port))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .expect("relay answers");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// SIGTERM, and waits for the process to end (it writes the state file on the way out).
    fn stop(mut self) {
        self.process.terminate();
        let _ = self.process.0.wait();
    }

    /// One `relay-svc admin` verb, its answer read as the admin endpoint's JSON.
    fn admin(&self, token: &str, verb: &[&str]) -> (bool, Value, String) {
        let (ok, stdout, stderr) = self.admin_text(token, &[verb, &["--output", "json"]].concat());
        (
            ok,
            serde_json::from_str(&stdout).unwrap_or(Value::Null),
            stderr,
        )
    }

    /// One `relay-svc admin` verb as it prints by default: success, stdout, stderr.
    fn admin_text(&self, token: &str, verb: &[&str]) -> (bool, String, String) {
        let output = Command::new(binary("relay-svc"))
            .args([
                "admin",
                "--url",
                &format!("http://127.0.0.1:{}", self.admin_port),
                "--token",
                token,
            ])
            .args(verb)
            .env_remove("RELAY_ADMIN_TOKEN")
            .env_remove("RELAY_ADMIN_URL")
            .output()
            .expect("admin runs");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refreshed_token_survives_a_restart() {
    let upstream = FakeUpstream::start().await.expect("upstream");
    let dir = scratch("state");
    let config = dir.join("relay.yaml");
    std::fs::write(
        &config,
        format!(
            "api_keys:\n  - {{key: {KEY}, group: default, user: u}}\naccounts:\n  - {{name: sub, platform: anthropic, base_url: \"{base}\", oauth: {{access_token: at-old, refresh_token: rt-1, token_url: \"{base}/oauth/token\"}}}}\n",
            base = upstream.base_url
        ),
    )
    .expect("config");
    let state_file = dir.join("state.json");
    // The config's token no longer works: the first request refreshes it (and uses up rt-1).
    upstream.revoke("at-old");
    let relay = start(&config, &state_file).await;
    let (status, body) = relay.message().await;
    assert_eq!(status, 200, "served after the refresh: {body}");
    assert_eq!(upstream.token_requests().len(), 1, "refreshed once");
    relay.stop();
    let saved = std::fs::read_to_string(&state_file).expect("the state file was written");
    assert!(
        saved.contains("rt-1-next"),
        "the rotated refresh token is kept"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&state_file)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o077,
            0,
            "the state file is the owner's only: {mode:o}"
        );
    }

    // Restarted from the same config (which still names the revoked token and the used-up
    // refresh token): the saved token serves, nothing is refreshed again.
    upstream.reset_stats();
    let relay = start(&config, &state_file).await;
    for _ in 0..3 {
        let (status, body) = relay.message().await;
        assert_eq!(status, 200, "the account survived the restart: {body}");
    }
    assert_eq!(
        upstream.stats("rt-1-access").total,
        3,
        "the refreshed token"
    );
    assert_eq!(
        upstream.stats("at-old").total,
        0,
        "never the config's old token"
    );
    assert_eq!(upstream.token_requests().len(), 1, "no second refresh");
    relay.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_verbs_work_against_a_running_relay_and_refuse_without_the_token() {
    let upstream = FakeUpstream::start().await.expect("upstream");
    let dir = scratch("admin");
    let config = dir.join("relay.yaml");
    std::fs::write(
        &config,
        format!(
            "api_keys:\n  - {{key: {KEY}, group: default, user: u}}\naccounts:\n  - {{id: 1, name: a, platform: anthropic, base_url: \"{base}\", api_key: cred-a, priority: 0}}\n  - {{id: 2, name: b, platform: anthropic, base_url: \"{base}\", api_key: cred-b, priority: 1}}\nprices:\n  claude-x: {{input: 3, output: 15}}\n",
            base = upstream.base_url
        ),
    )
    .expect("config");
    let relay = start(&config, &dir.join("state.json")).await;

    // Without the token, or with a wrong one: refused, nothing shown.
    let (ok, _, stderr) = relay.admin("wrong-token", &["accounts"]);
    assert!(!ok, "a wrong token is refused");
    assert!(stderr.contains("401"), "{stderr}");
    let bare = reqwest::get(format!(
        "http://127.0.0.1:{}/admin/accounts",
        relay.admin_port
    ))
    .await
    .expect("admin answers");
    assert_eq!(bare.status().as_u16(), 401);
    let refusal: Value = bare.json().await.expect("a JSON error");
    assert_eq!(refusal["error"]["type"], "authentication_error");

    // `a` refuses its key: it is hard-blocked, and the operator sees and clears the block.
    upstream.revoke("cred-a");
    let (status, _) = relay.message().await;
    assert_eq!(status, 200, "failed over to b");
    let (ok, blocks, stderr) = relay.admin(ADMIN_TOKEN, &["blocks"]);
    assert!(ok, "{stderr}");
    let listed = blocks["blocks"].as_array().cloned().unwrap_or_default();
    assert!(
        listed
            .iter()
            .any(|b| b["account_id"] == 1 && b["kind"] == "hard" && b["class"] == "unauthorized"),
        "{blocks}"
    );
    let (ok, _, stderr) = relay.admin(ADMIN_TOKEN, &["clear-block", "1"]);
    assert!(ok, "{stderr}");
    let (_, blocks, _) = relay.admin(ADMIN_TOKEN, &["blocks"]);
    assert!(
        blocks["blocks"]
            .as_array()
            .is_some_and(|b| b.iter().all(|b| b["account_id"] != 1)),
        "cleared: {blocks}"
    );

    // `b` really out of credit: retired once the probe confirms it; restore brings it back.
    upstream.set_out_of_credit("cred-b", true);
    let (status, _) = relay.message().await;
    assert_ne!(status, 200, "a is revoked and b is out of credit");
    eventually(Duration::from_secs(10), || async {
        let (_, accounts, _) = relay.admin(ADMIN_TOKEN, &["accounts"]);
        accounts["accounts"]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["id"] == 2).cloned())
            .filter(|b| b["status"] == "retired")
            .map(|_| ())
    })
    .await
    .expect("b retired");
    let (_, accounts, _) = relay.admin(ADMIN_TOKEN, &["accounts"]);
    assert!(
        !accounts.to_string().contains("cred-b"),
        "credentials are masked: {accounts}"
    );
    upstream.set_out_of_credit("cred-b", false);
    let (ok, restored, stderr) = relay.admin(ADMIN_TOKEN, &["restore", "2"]);
    assert!(ok, "{stderr}");
    assert_eq!(restored["account"]["status"], "active", "{restored}");
    let (status, body) = relay.message().await;
    assert_eq!(status, 200, "served by the restored account: {body}");

    let (ok, _, stderr) = relay.admin(ADMIN_TOKEN, &["restore", "99"]);
    assert!(!ok && stderr.contains("404"), "{stderr}");

    // Usage: the served requests, per client key (written in batches: give it a moment).
    eventually(Duration::from_secs(10), || async {
        let (_, usage, _) = relay.admin(ADMIN_TOKEN, &["usage"]);
        usage["keys"]
            .as_array()
            .and_then(|keys| keys.first().cloned())
            .filter(|key| key["requests"].as_u64().is_some_and(|n| n >= 2))
            .map(|_| ())
    })
    .await
    .expect("usage counted");
    relay.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_windows_verb_shows_the_usage_windows_the_upstreams_answers_reported() {
    const HOUR: Duration = Duration::from_secs(3_600);
    let upstream = FakeUpstream::start().await.expect("upstream");
    let dir = scratch("windows");
    let config = dir.join("relay.yaml");
    std::fs::write(
        &config,
        format!(
            "api_keys:\n  - {{key: {KEY}, group: default, user: u}}\naccounts:\n  - {{id: 1, name: a, platform: anthropic, base_url: \"{base}\", api_key: cred-a, priority: 0}}\n  - {{id: 2, name: b, platform: anthropic, base_url: \"{base}\", api_key: cred-b, priority: 1}}\n",
            base = upstream.base_url
        ),
    )
    .expect("config");
    // `a` answers with a 5-hour window of 4 requests and a weekly one of 10: one request uses a
    // quarter of the first and a tenth of the second.
    upstream.set_windows(
        "cred-a",
        WindowBudgets {
            five_hour: Some(Window::new(5 * HOUR, 4)),
            weekly: Some(Window::new(7 * 24 * HOUR, 10)),
            ..WindowBudgets::default()
        },
    );
    let relay = start(&config, &dir.join("state.json")).await;
    let (ok, nothing, stderr) = relay.admin(ADMIN_TOKEN, &["windows"]);
    assert!(ok, "{stderr}");
    assert_eq!(nothing, json!({"windows": []}), "nothing reported yet");

    let (status, body) = relay.message().await;
    assert_eq!(status, 200, "served by a: {body}");
    // The relay hands the readings over off the request's path: give it a moment.
    let windows = eventually(Duration::from_secs(10), || async {
        let (_, windows, _) = relay.admin(ADMIN_TOKEN, &["windows"]);
        windows["windows"]
            .as_array()
            .filter(|rows| rows.len() == 2)
            .cloned()
    })
    .await
    .expect("both windows of a listed");
    let now = poolgate_core::now_ms();
    for (row, kind, utilization, length) in [
        (&windows[0], "5h", 0.25, 5 * HOUR),
        (&windows[1], "7d", 0.1, 7 * 24 * HOUR),
    ] {
        assert_eq!(
            (
                &row["account_id"],
                &row["account_name"],
                &row["kind"],
                &row["scope"],
                &row["status"],
                &row["utilization"],
            ),
            (
                &json!(1),
                &json!("a"),
                &json!(kind),
                &json!("account"),
                &json!("allowed"),
                &json!(utilization),
            ),
            "{row}"
        );
        let remaining = row["remaining_ms"].as_i64().expect("remaining");
        let length = length.as_millis() as i64;
        assert!(
            remaining > length - 60_000 && remaining <= length + 1_000,
            "the reset is a window ahead: {row}"
        );
        let reset = row["reset_at_ms"].as_i64().expect("reset");
        assert!(reset > now, "{row}");
    }
    // The same as the operator reads it, narrowed to `a`; `b` has none, an unknown account is
    // not found.
    let (ok, text, stderr) = relay.admin_text(ADMIN_TOKEN, &["windows", "--account", "1"]);
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("1\ta\t5h\tscope=account\tused=25.0%\tstatus=allowed\treset=4h59m\t")
            || lines[0]
                .starts_with("1\ta\t5h\tscope=account\tused=25.0%\tstatus=allowed\treset=5h0m\t"),
        "{text}"
    );
    assert!(
        lines[0].ends_with(" ago") && lines[1].contains("\t7d\t"),
        "{text}"
    );
    let (ok, text, stderr) = relay.admin_text(ADMIN_TOKEN, &["windows", "--account", "2"]);
    assert!(
        ok && text.trim().is_empty(),
        "b reported nothing: {text} {stderr}"
    );
    let (ok, _, stderr) = relay.admin_text(ADMIN_TOKEN, &["windows", "--account", "99"]);
    assert!(!ok && stderr.contains("404"), "{stderr}");
    relay.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
