//! The status page in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`) driven by Selenium from Python (`tests/browser/status_page.py`) against
//! the distributed stack with the selector's page. Without a session the page is the login form
//! with no account data; after the login every account has its row; an account blocked through
//! the fake upstream (an exhausted usage window, 429 with a reset two hours ahead) shows the hard
//! block, its reason and its time left within a refresh, without a reload; the client keys view
//! lists the key. The screenshots go to `target/status-page.png` (and `-keys.png`).
//!
//! Missing Chromium, chromedriver or Selenium is a failure naming what to install, never a pass:
//! `apt-get install -y chromium chromium-driver` and `pip install selenium` into `.venv` (set
//! `POOLGATE_BROWSER_PYTHON` for another Python).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use poolgate_core::account::{AccountStatus, Price};
use poolgate_testkit::fake_upstream::{FakeUpstream, Scripted, Window, WindowBudgets};
use relay_svc::proxy::RelaySettings;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const INSTALL: &str = "install them with `apt-get install -y chromium chromium-driver` and \
     `.venv/bin/pip install selenium` (bash scripts/test.sh does both)";

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Python that has Selenium: `POOLGATE_BROWSER_PYTHON`, else the workspace's `.venv`.
fn python() -> PathBuf {
    std::env::var_os("POOLGATE_BROWSER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv/bin/python"))
}

/// Fails, naming what to install, when the browser or its driver is missing.
fn prerequisites(python: &Path) {
    for (path, what) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
        assert!(
            Path::new(path).exists(),
            "the browser test needs {what} at {path}: {INSTALL}"
        );
    }
    let selenium = std::process::Command::new(python)
        .args(["-c", "import selenium"])
        .output();
    assert!(
        selenium.is_ok_and(|output| output.status.success()),
        "the browser test needs Selenium in {}: {INSTALL}",
        python.display()
    );
}

/// An Anthropic account of group `default` with its own credential `cred-<name>`.
fn account(name: &str, base_url: &str, priority: i32) -> selector_svc::store::AccountInput {
    let mut input = common::account(name, base_url, 4, priority);
    input.credential = Some(poolgate_core::account::Secret::new(format!(
        "sk-ant-api03-{name}-0000-{priority}abc"
    )));
    input
}

fn credential(name: &str, priority: i32) -> String {
    format!("sk-ant-api03-{name}-0000-{priority}abc")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_account_shows_its_block_and_time_left_in_the_browser_within_a_refresh() {
    let python = python();
    prerequisites(&python);

    let backends = common::backends().await.expect("backends start");
    let upstream = FakeUpstream::start().await.expect("upstream");
    let names = [
        "claude-main",
        "claude-spare",
        "claude-team",
        "claude-legacy",
    ];
    let mut ids = Vec::new();
    for (priority, name) in names.iter().enumerate() {
        let mut input = account(name, &upstream.base_url, priority as i32);
        if *name == "claude-team" {
            input.rpm_limit = 60;
            input.session_window_limit_usd = 5.0;
        }
        ids.push(
            backends
                .store
                .upsert_account(&input)
                .await
                .expect("account"),
        );
    }
    backends
        .store
        .set_status(ids[3], AccountStatus::Disabled, "replaced by claude-team")
        .await
        .expect("disable legacy");
    backends
        .store
        .set_price(
            "claude-x",
            Price {
                input_per_mtok: 3.0,
                output_per_mtok: 15.0,
                ..Price::default()
            },
        )
        .await
        .expect("price");
    let (_, key) = backends
        .store
        .create_api_key_with_limits(
            "ci",
            "alice",
            "default",
            0,
            &Default::default(),
            &poolgate_core::lease::KeyLimits {
                concurrency_limit: 4,
                budget_day_micros: 5_000_000,
                budget_month_micros: 50_000_000,
                ..Default::default()
            },
        )
        .await
        .expect("key");
    // `claude-main` reports usage windows on its answers.
    upstream.set_windows(
        &credential("claude-main", 0),
        WindowBudgets {
            five_hour: Some(Window::new(Duration::from_secs(5 * 3600), 10)),
            weekly: Some(Window::new(Duration::from_secs(7 * 86_400), 40)),
            ..WindowBudgets::default()
        },
    );
    let (_selector, selector_addr, page) =
        common::selector_with_page(&backends, Default::default())
            .await
            .expect("selector starts");
    let (_admission, admission_addr) = common::admission(&backends.redis.url(), Default::default())
        .await
        .expect("admission starts");
    let relay = common::relay(
        vec![format!("http://{selector_addr}")],
        vec![format!("http://{admission_addr}")],
        RelaySettings {
            max_wait: Duration::from_secs(10),
            ..RelaySettings::default()
        },
    )
    .await
    .expect("relay starts");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let message = {
        let (http, key) = (http.clone(), key.expose().to_owned());
        move || {
            let (http, key) = (http.clone(), key.clone());
            async move {
                http.post(format!("http://{relay}/v1/messages"))
                    .header("x-api-key", key)
                    .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
                    .send()
                    .await
                    .map(|response| response.status().as_u16())
            }
        }
    };
    for _ in 0..3 {
        assert_eq!(message().await.ok(), Some(200), "claude-main serves");
    }

    let screenshot = workspace().join("target/status-page.png");
    let _ = std::fs::create_dir_all(workspace().join("target"));
    let mut browser = tokio::process::Command::new(&python)
        .arg(workspace().join("tests/browser/status_page.py"))
        .args(["--url", &format!("http://{page}")])
        .args(["--token", common::ADMIN_TOKEN])
        .args(["--screenshot", &screenshot.to_string_lossy()])
        .arg("--names")
        .args(names)
        .args(["--keys", "ci"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let mut stdin = browser.stdin.take().expect("stdin");
    let mut lines = BufReader::new(browser.stdout.take().expect("stdout")).lines();
    let mut said = Vec::new();
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            said.push(line.clone());
            if line == "READY" {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    if !ready {
        let output = browser.wait_with_output().await.expect("python ends");
        panic!(
            "the browser never logged in: {said:?}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    // One request: `claude-main`'s window is exhausted until two hours from now (a hard block),
    // `claude-spare` is overloaded (a 529: a soft block), and `claude-team` takes it, slowly
    // (a lease in flight while the page is looked at).
    let reset = (poolgate_core::now_ms() / 1000 + 7200).to_string();
    upstream.script(
        &credential("claude-main", 0),
        [Scripted::Fail {
            status: 429,
            headers: vec![
                (
                    "anthropic-ratelimit-unified-status".into(),
                    "rejected".into(),
                ),
                ("anthropic-ratelimit-unified-reset".into(), reset),
            ],
            body: r#"{"type":"error","error":{"type":"rate_limit_error","message":"window"}}"#
                .into(),
        }],
    );
    upstream.script(
        &credential("claude-spare", 1),
        [Scripted::Fail {
            status: 529,
            headers: vec![],
            body: r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#.into(),
        }],
    );
    upstream.script(
        &credential("claude-team", 2),
        [Scripted::Delay(Duration::from_secs(20))],
    );
    let in_flight = tokio::spawn(message());
    stdin
        .write_all(format!("BLOCKED {}\n", ids[0]).as_bytes())
        .await
        .expect("tell the browser");
    stdin.flush().await.expect("flush");

    let output = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            said.push(line);
        }
        browser.wait_with_output().await
    })
    .await
    .expect("the browser check ends within a minute")
    .expect("python ends");
    in_flight.abort();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said:?}\n{stderr}");
    let shot = said
        .iter()
        .find_map(|line| line.strip_prefix("SCREENSHOT "))
        .expect("the screenshot's path");
    let size = std::fs::metadata(shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 10_000, "a real screenshot at {shot}: {size} bytes");
    println!("{}", said.join("\n"));
    println!("status page screenshot: {shot}");
}
