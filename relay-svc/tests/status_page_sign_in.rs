//! The status page's "Add account" in headless Chromium (`tests/browser/add_account.py`) against
//! a standalone relay process whose page signs in at the test kit's fake authorization servers
//! (`POOLGATE_OAUTH_BASE`): a forged state is refused on the page and adds nothing; a real
//! sign-in creates the account, and its row appears without a reload. The page's writes are
//! POSTs of JSON with the session, refused cross-site (checked here without a browser too).
//!
//! Missing Chromium, chromedriver or Selenium is a failure naming what to install.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::processes::{Process, binary};
use poolgate_testkit::fake_oauth::{FakeOAuth, FakeUser};
use poolgate_testkit::fake_upstream::FakeUpstream;
use poolgate_testkit::{eventually, free_port};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const ADMIN_TOKEN: &str = "page-signin-admin-token";

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> PathBuf {
    std::env::var_os("POOLGATE_BROWSER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv/bin/python"))
}

fn prerequisites(python: &Path) {
    for (path, what) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
        assert!(
            Path::new(path).exists(),
            "the browser test needs {what} at {path}: apt-get install -y chromium chromium-driver"
        );
    }
    let selenium = Command::new(python)
        .args(["-c", "import selenium"])
        .output();
    assert!(
        selenium.is_ok_and(|output| output.status.success()),
        "the browser test needs Selenium in {}: .venv/bin/pip install selenium",
        python.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_account_on_the_status_page_signs_a_claude_account_in() {
    let python = python();
    prerequisites(&python);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = std::env::temp_dir().join(format!(
        "poolgate-page-signin-{}-{}",
        std::process::id(),
        poolgate_core::now_ms()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let upstream = FakeUpstream::start().await.expect("upstream");
    let oauth = FakeOAuth::start().await.expect("oauth");
    oauth.sign_in_as(FakeUser::new(
        "5f1c0000-0000-4000-8000-00000000bee1",
        "7a2b0000-0000-4000-8000-0000000000b1",
        "bee@example.com",
        "claude_pro",
    ));
    let config = dir.join("relay.yaml");
    std::fs::write(
        &config,
        format!(
            "api_keys:\n  - {{ key: sk-page, group: default, user: ops }}\n\
             accounts:\n  - name: claude-a\n    platform: anthropic\n    base_url: {}\n    \
             api_key: sk-upstream-a\n",
            upstream.base_url
        ),
    )
    .expect("config");
    let (port, admin_port) = (free_port().expect("port"), free_port().expect("port"));
    let _relay = Process(
        Command::new(binary("relay-svc"))
            .args(["--standalone", "--config"])
            .arg(&config)
            .arg("--state-file")
            .arg(dir.join("state.json"))
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
            .env("POOLGATE_OAUTH_BASE", oauth.base())
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("relay starts"),
    );
    eventually(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", admin_port))
            .await
            .ok()
            .map(|_| ())
    })
    .await
    .expect("the page listens");
    let page = format!("http://127.0.0.1:{admin_port}");

    // Without a browser: no session, 401; a session but a cross-site request, 403.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let start = |origin: Option<&str>, cookie: Option<&str>| {
        let mut request = http
            .post(format!("{page}/api/sign-in/start"))
            .header("content-type", "application/json")
            .body(r#"{"subscription":"claude"}"#);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        request.send()
    };
    assert_eq!(
        start(None, None).await.expect("answer").status().as_u16(),
        401
    );
    let login = http
        .post(format!("{page}/login"))
        .form(&[("token", ADMIN_TOKEN)])
        .send()
        .await
        .expect("login");
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .split(';')
        .next()
        .expect("cookie")
        .to_owned();
    let forged = start(Some("https://evil.example"), Some(&cookie))
        .await
        .expect("answer");
    assert_eq!(
        forged.status().as_u16(),
        403,
        "a cross-site request is refused"
    );
    let as_form = http
        .post(format!("{page}/api/sign-in/start"))
        .header("cookie", &cookie)
        .form(&[("subscription", "claude")])
        .send()
        .await
        .expect("answer");
    assert_eq!(as_form.status().as_u16(), 403, "a form post is refused");
    let own = start(Some(&page), Some(&cookie)).await.expect("answer");
    assert_eq!(own.status().as_u16(), 200, "the page's own request starts");

    let screenshot = workspace().join("target/status-page-add-account.png");
    let output = tokio::process::Command::new(&python)
        .arg(workspace().join("tests/browser/add_account.py"))
        .args([
            "--url",
            &page,
            "--token",
            ADMIN_TOKEN,
            "--oauth-base",
            oauth.base(),
        ])
        .args(["--name", "claude-bee", "--email", "bee@example.com"])
        .args(["--screenshot", &screenshot.to_string_lossy()])
        .kill_on_drop(true)
        .output()
        .await
        .expect("python runs");
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("CREATED"),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let exchanges = oauth.exchanges();
    assert_eq!(
        exchanges,
        vec!["authorization_code".to_owned()],
        "the forged paste was never exchanged"
    );
}
