//! Signing accounts in, end to end in both modes (issue 39): the operator CLI's `login claude`
//! (and `--setup-token`), `login chatgpt` (and `--device`) run as processes against the fake
//! authorization servers of the test kit (`poolgate_testkit::fake_oauth`, the real endpoints'
//! paths and rules), the test playing the browser; the account lands in the pool with its
//! identity, serves requests with the token the sign-in got, survives a restart, and signing the
//! same account in again updates it in place. A wrong `state` changes nothing and exits 2.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::processes::{Env, Process, binary};
use poolgate_testkit::fake_oauth::{FakeOAuth, FakeUser};
use poolgate_testkit::fake_upstream::FakeUpstream;
use poolgate_testkit::{PostgresServer, RedisServer, eventually, free_port};
use serde_json::{Value, json};

const KEY: &str = "sk-signin-client";
const ADMIN_TOKEN: &str = "signin-admin-token";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "poolgate-{name}-{}-{}",
        std::process::id(),
        poolgate_core::now_ms()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// How the test answers the CLI's prompt, playing the user in the browser.
enum Browser {
    /// Claude: open the URL, paste what the page shows (`code#state`); `tamper` pastes another
    /// state.
    Claude { tamper: bool },
    /// ChatGPT: open the URL, paste the address the browser was sent to.
    ChatGpt,
    /// ChatGPT's device flow: approve the code the CLI shows, as `user`.
    Device(FakeUser),
}

/// What a `login` run printed and how it ended.
struct Ran {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `command` (a `login`), answering its prompt as `browser` against `oauth`.
async fn login(mut command: Command, oauth: &FakeOAuth, browser: Browser) -> Ran {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the CLI starts");
    let stderr = child.stderr.take().expect("stderr");
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut shown = Vec::new();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let answer = loop {
        let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(20), lines.recv()).await
        else {
            break None;
        };
        shown.push(line.clone());
        let line = line.trim().to_owned();
        match &browser {
            Browser::Claude { .. } | Browser::ChatGpt if line.starts_with("http") => {
                let page = http.get(&line).send().await.expect("the authorize page");
                assert_eq!(
                    page.status().as_u16(),
                    302,
                    "the page signs in and redirects"
                );
                let location = page.headers()["location"]
                    .to_str()
                    .expect("ascii")
                    .to_owned();
                let url = reqwest::Url::parse(&location).expect("a URL");
                let query: std::collections::HashMap<_, _> =
                    url.query_pairs().into_owned().collect();
                break Some(match browser {
                    Browser::Claude { tamper } => format!(
                        "{}#{}",
                        query["code"],
                        if tamper {
                            "forged-state"
                        } else {
                            query["state"].as_str()
                        }
                    ),
                    _ => location,
                });
            }
            Browser::Device(user) => {
                if let Some(code) = oauth
                    .device_codes()
                    .into_iter()
                    .find(|code| line.contains(code.as_str()))
                {
                    assert!(oauth.approve(&code, user.clone()), "the code is known");
                    break None;
                }
            }
            _ => {}
        }
    };
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(answer) = answer {
        writeln!(stdin, "{answer}").expect("pasted");
    }
    drop(stdin);
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("joined")
        .expect("the CLI ends");
    while let Ok(line) = lines.try_recv() {
        shown.push(line);
    }
    Ran {
        ok: output.status.success(),
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: shown.join("\n"),
    }
}

fn claude_user() -> FakeUser {
    FakeUser::new(
        "5f1c0000-0000-4000-8000-00000000ada1",
        "7a2b0000-0000-4000-8000-0000000000a1",
        "ada@example.com",
        "claude_max",
    )
}

fn chatgpt_user() -> FakeUser {
    FakeUser::new("user-Grace01", "acc-7f3e-team", "grace@example.com", "pro")
}

// ---- standalone -------------------------------------------------------------------------------

struct Relay {
    process: Process,
    port: u16,
    admin_port: u16,
}

fn write_config(dir: &Path, upstream: &FakeUpstream) -> PathBuf {
    let config = dir.join("relay.yaml");
    std::fs::write(
        &config,
        format!(
            "groups:\n  default: {{}}\napi_keys:\n  - {{ key: {KEY}, group: default, user: ops }}\n\
             accounts:\n  - name: claude-a\n    group: spare\n    platform: anthropic\n    \
             base_url: {}\n    api_key: sk-upstream-spare\n",
            upstream.base_url
        ),
    )
    .expect("config written");
    config
}

async fn start_relay(config: &Path, state_file: &Path) -> Relay {
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
    fn admin(&self) -> Command {
        let mut command = Command::new(binary("relay-svc"));
        command
            .args([
                "admin",
                "--url",
                &format!("http://127.0.0.1:{}", self.admin_port),
            ])
            .env("RELAY_ADMIN_TOKEN", ADMIN_TOKEN)
            .env_remove("RUST_LOG")
            .env_remove("POOLGATE_OAUTH_BASE");
        command
    }

    fn login(&self, oauth: &FakeOAuth, upstream: &FakeUpstream, args: &[&str]) -> Command {
        let mut command = self.admin();
        command.arg("login").args(args).args([
            "--oauth-base",
            oauth.base(),
            "--base-url",
            &upstream.base_url,
        ]);
        command
    }

    fn accounts(&self) -> Vec<Value> {
        let output = self
            .admin()
            .args(["accounts", "--output", "json"])
            .output()
            .expect("runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let answer: Value = serde_json::from_slice(&output.stdout).expect("json");
        answer["accounts"].as_array().cloned().unwrap_or_default()
    }

    async fn message(&self) -> u16 {
        reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/v1/messages", self.port))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    }

    fn stop(mut self) {
        self.process.terminate();
        let _ = self.process.0.wait();
    }
}

/// The access token the fake issued to `email` last (by the order of its counter).
fn issued_to(oauth: &FakeOAuth, email: &str) -> Vec<String> {
    let mut tokens: Vec<String> = oauth
        .issued()
        .into_iter()
        .filter(|(_, issued)| issued.user.email == email)
        .map(|(token, _)| token)
        .collect();
    tokens.sort();
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_signs_claude_and_chatgpt_accounts_in_keeps_them_and_signs_them_in_again() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = scratch("signin-standalone");
    let upstream = FakeUpstream::start().await.expect("upstream");
    let oauth = FakeOAuth::start().await.expect("oauth");
    let config = write_config(&dir, &upstream);
    let state_file = dir.join("state.json");
    let relay = start_relay(&config, &state_file).await;

    // Before any sign-in, the key's group has no account: nothing serves it.
    assert_ne!(relay.message().await, 200);

    // A forged state: refused naming the step, exit 2, nothing changed.
    oauth.sign_in_as(claude_user());
    let forged = login(
        relay.login(&oauth, &upstream, &["claude"]),
        &oauth,
        Browser::Claude { tamper: true },
    )
    .await;
    assert_eq!(forged.code, Some(2), "{}", forged.stderr);
    assert!(forged.stderr.contains("state"), "{}", forged.stderr);
    assert_eq!(relay.accounts().len(), 1, "nothing was added");
    assert_eq!(
        oauth.exchanges(),
        Vec::<String>::new(),
        "no code was exchanged"
    );

    // Claude: created with its identity; it serves with the token the sign-in got.
    let ran = login(
        relay.login(&oauth, &upstream, &["claude"]),
        &oauth,
        Browser::Claude { tamper: false },
    )
    .await;
    assert!(ran.ok, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.starts_with("created\t"), "{}", ran.stdout);
    assert!(
        ran.stdout.contains("claude-ada@example.com"),
        "{}",
        ran.stdout
    );
    let issued = issued_to(&oauth, "ada@example.com");
    assert_eq!(issued.len(), 1);
    for secret in issued
        .iter()
        .map(String::as_str)
        .chain(["code-", "sk-ant-ort01"])
    {
        assert!(
            !ran.stdout.contains(secret) && !ran.stderr.contains(secret),
            "nothing secret is printed ({secret})"
        );
    }
    let accounts = relay.accounts();
    let ada = accounts
        .iter()
        .find(|a| a["email"] == "ada@example.com")
        .expect("the account is listed")
        .clone();
    assert_eq!(ada["plan"], "max");
    assert_eq!(ada["credential_kind"], "oauth");
    assert_eq!(ada["group"], "default");
    assert_eq!(ada["refreshable"], true);
    assert_eq!(
        ada["upstream_id"],
        format!(
            "{}/{}",
            claude_user().user_id,
            claude_user().organisation_id
        )
    );
    assert_eq!(
        relay.message().await,
        200,
        "the signed-in account serves the key's group"
    );
    assert_eq!(
        upstream.stats(&issued[0]).total,
        1,
        "with the token of the sign-in"
    );

    // The same user again: updated in place, same id, no second account.
    let again = login(
        relay.login(&oauth, &upstream, &["claude"]),
        &oauth,
        Browser::Claude { tamper: false },
    )
    .await;
    assert!(again.ok, "{}", again.stderr);
    assert!(
        again.stdout.starts_with("signed in again\t"),
        "{}",
        again.stdout
    );
    let accounts = relay.accounts();
    assert_eq!(accounts.len(), 2, "one account per identity");
    let ada_again = accounts
        .iter()
        .find(|a| a["email"] == "ada@example.com")
        .expect("listed");
    assert_eq!(ada_again["id"], ada["id"]);

    // A new account's name the config has is refused naming both, exit 2.
    oauth.sign_in_as(chatgpt_user());
    let clash = login(
        relay.login(&oauth, &upstream, &["chatgpt", "--name", "claude-a"]),
        &oauth,
        Browser::ChatGpt,
    )
    .await;
    assert_eq!(clash.code, Some(2), "{}", clash.stderr);
    assert!(
        clash.stderr.contains("claude-a") && clash.stderr.contains("config"),
        "{}",
        clash.stderr
    );

    // ChatGPT through the browser flow, then the same account through the device flow.
    let chatgpt = login(
        relay.login(&oauth, &upstream, &["chatgpt"]),
        &oauth,
        Browser::ChatGpt,
    )
    .await;
    assert!(chatgpt.ok, "{}", chatgpt.stderr);
    assert!(
        chatgpt.stdout.starts_with("created\t"),
        "{}",
        chatgpt.stdout
    );
    let device = login(
        relay.login(&oauth, &upstream, &["chatgpt", "--device"]),
        &oauth,
        Browser::Device(chatgpt_user()),
    )
    .await;
    assert!(device.ok, "{}", device.stderr);
    assert!(
        device.stdout.starts_with("signed in again\t"),
        "{}",
        device.stdout
    );
    let accounts = relay.accounts();
    let grace = accounts
        .iter()
        .find(|a| a["email"] == "grace@example.com")
        .expect("listed");
    assert_eq!(
        (
            grace["credential_kind"].as_str(),
            grace["plan"].as_str(),
            grace["upstream_id"].as_str()
        ),
        (
            Some("chatgpt_oauth"),
            Some("pro"),
            Some("user-Grace01/acc-7f3e-team")
        )
    );
    assert_eq!(accounts.len(), 3);

    // A restart keeps them: the state file holds them, readable by this user only.
    relay.stop();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&state_file)
            .expect("state file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let relay = start_relay(&config, &state_file).await;
    let after = relay.accounts();
    assert_eq!(after.len(), 3, "{after:?}");
    assert_eq!(
        after
            .iter()
            .find(|a| a["email"] == "ada@example.com")
            .map(|a| a["id"].clone()),
        Some(ada["id"].clone())
    );
    assert_eq!(relay.message().await, 200);
    relay.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setup_token_has_no_refresh_token_and_shows_when_it_must_be_replaced() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = scratch("signin-setup-token");
    let upstream = FakeUpstream::start().await.expect("upstream");
    let oauth = FakeOAuth::start().await.expect("oauth");
    let config = write_config(&dir, &upstream);
    let relay = start_relay(&config, &dir.join("state.json")).await;
    oauth.sign_in_as(claude_user());
    let ran = login(
        relay.login(&oauth, &upstream, &["claude", "--setup-token"]),
        &oauth,
        Browser::Claude { tamper: false },
    )
    .await;
    assert!(ran.ok, "{}", ran.stderr);
    let issued = oauth.issued();
    let (_, token) = issued.iter().next().expect("one token");
    assert_eq!(
        token.scope, "user:inference",
        "setup-token asks for inference only"
    );
    assert!(!token.refreshable);
    let accounts = relay.accounts();
    let ada = accounts
        .iter()
        .find(|a| a["email"] == "ada@example.com")
        .expect("listed");
    assert_eq!(ada["refreshable"], false);
    let expires = ada["token_expires_at_ms"].as_u64().expect("an expiry");
    let year_ms = 365 * 24 * 3600 * 1000;
    let now = poolgate_core::now_ms() as u64;
    assert!(
        expires > now + year_ms - 3_600_000 && expires <= now + year_ms + 60_000,
        "{expires}"
    );
    let text = relay.admin().arg("accounts").output().expect("runs");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("no refresh token: sign in again before"),
        "{text}"
    );
    relay.stop();
}

// ---- distributed ------------------------------------------------------------------------------

/// A selector process over a private Postgres (migrated) and Redis, listening, with the
/// environment its admin CLI runs in.
struct Selector {
    env: Env,
    _process: Process,
    _postgres: PostgresServer,
    _redis: RedisServer,
}

impl Selector {
    async fn start() -> Self {
        let (postgres, redis) = tokio::join!(PostgresServer::start(), RedisServer::start());
        let (postgres, redis) = (postgres.expect("postgres"), redis.expect("redis"));
        let port = free_port().expect("port");
        let keys = format!("k1:{}", poolgate_select::crypto::Keyring::generate_key());
        let env = Env {
            vars: vec![
                ("POOLGATE_DATABASE_URL".into(), postgres.url()),
                ("POOLGATE_REDIS_URL".into(), redis.url()),
                ("POOLGATE_CREDENTIAL_KEYS".into(), keys),
                ("SELECTOR_ADMIN_TOKEN".into(), "admin-token".into()),
                ("SELECTOR_LISTEN".into(), format!("127.0.0.1:{port}")),
                (
                    "SELECTOR_METRICS_LISTEN".into(),
                    format!("127.0.0.1:{}", free_port().expect("port")),
                ),
                (
                    "SELECTOR_ENDPOINT".into(),
                    format!("http://127.0.0.1:{port}"),
                ),
            ],
        };
        let migrated = env.run("selector-svc", &["migrate"], &[]);
        assert!(migrated.contains("migrations applied"), "{migrated}");
        let process = env.spawn("selector-svc", "selector", &[]);
        eventually(Duration::from_secs(20), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        })
        .await
        .expect("selector listens");
        Selector {
            env,
            _process: process,
            _postgres: postgres,
            _redis: redis,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_signs_accounts_in_by_identity_and_brings_an_errored_one_back() {
    let selector = Selector::start().await;
    let env = &selector.env;
    let upstream = FakeUpstream::start().await.expect("upstream");
    let oauth = FakeOAuth::start().await.expect("oauth");
    let login_command = |args: &[&str]| {
        let mut command = env.command("selector-svc");
        command.args(["admin", "login"]).args(args).args([
            "--oauth-base",
            oauth.base(),
            "--base-url",
            &upstream.base_url,
        ]);
        command
    };
    let accounts = || -> Vec<Value> {
        let listed = env.run(
            "selector-svc",
            &["admin", "accounts", "--output", "json"],
            &[],
        );
        serde_json::from_str::<Value>(&listed).expect("json")["accounts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };

    oauth.sign_in_as(claude_user());
    let forged = login(
        login_command(&["claude"]),
        &oauth,
        Browser::Claude { tamper: true },
    )
    .await;
    assert_eq!(forged.code, Some(2), "{}", forged.stderr);
    assert!(accounts().is_empty(), "a refused sign-in changes nothing");

    let ran = login(
        login_command(&["claude", "--group", "team"]),
        &oauth,
        Browser::Claude { tamper: false },
    )
    .await;
    assert!(ran.ok, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.starts_with("created\t"), "{}", ran.stdout);
    let listed = accounts();
    assert_eq!(listed.len(), 1);
    let id = listed[0]["id"].as_i64().expect("id");
    assert_eq!(listed[0]["email"], "ada@example.com");
    assert_eq!(listed[0]["plan"], "max");
    assert_eq!(listed[0]["group"], "team");

    // Its refresh was refused: an operator (or the selector) put it in `error`. Signing the
    // same user in again brings it back, in place.
    env.run(
        "selector-svc",
        &[
            "admin",
            "set-status",
            &id.to_string(),
            "error",
            "--reason",
            "refresh refused",
        ],
        &[],
    );
    let again = login(
        login_command(&["claude"]),
        &oauth,
        Browser::Claude { tamper: false },
    )
    .await;
    assert!(again.ok, "{}", again.stderr);
    assert!(
        again.stdout.starts_with("signed in again (active again)\t"),
        "{}",
        again.stdout
    );
    let listed = accounts();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"].as_i64(), Some(id));
    assert_eq!(listed[0]["status"], "active");
    assert_eq!(listed[0]["group"], "team", "its group is kept");

    // ChatGPT by device code; --account of the Claude account refuses another identity.
    oauth.sign_in_as(chatgpt_user());
    let device = login(
        login_command(&["chatgpt", "--device"]),
        &oauth,
        Browser::Device(chatgpt_user()),
    )
    .await;
    assert!(device.ok, "{}", device.stderr);
    let listed = accounts();
    assert_eq!(listed.len(), 2);
    let wrong = login(
        login_command(&["chatgpt", "--account", &id.to_string()]),
        &oauth,
        Browser::ChatGpt,
    )
    .await;
    assert_eq!(wrong.code, Some(2), "{}", wrong.stderr);
    assert!(wrong.stderr.contains("account"), "{}", wrong.stderr);
    assert_eq!(accounts(), listed, "nothing changed");
}

// ---- imports ----------------------------------------------------------------------------------

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../operator/tests/fixtures/import")
        .join(name)
        .display()
        .to_string()
}

/// Runs `command` to its end: exit code, stdout, stderr.
fn finish(command: &mut Command) -> (Option<i32>, String, String) {
    let output = command.stdin(Stdio::null()).output().expect("runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_imports_each_format_once_by_identity_and_reports_what_it_cannot() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = scratch("signin-import");
    let upstream = FakeUpstream::start().await.expect("upstream");
    let oauth = FakeOAuth::start().await.expect("oauth");
    let config = write_config(&dir, &upstream);
    let relay = start_relay(&config, &dir.join("state.json")).await;
    let files = [
        fixture("claude-credentials.json"),
        fixture("codex-auth.json"),
        fixture("cliproxy-codex-noor@example.com-pro.json"),
        fixture("sub2api-export.json"),
        fixture("crs-export-encrypted.json"),
    ];
    let import = |dry_run: bool| {
        let mut command = relay.admin();
        command.arg("import").args(&files).args([
            "--base-url",
            &upstream.base_url,
            "--oauth-base",
            oauth.base(),
        ]);
        if dry_run {
            command.arg("--dry-run");
        }
        command
    };
    // A dry run says what would change, tokens masked, and changes nothing.
    let (code, stdout, stderr) = finish(&mut import(true));
    assert_eq!(
        code,
        Some(2),
        "entries it cannot import: exit 2\n{stdout}\n{stderr}"
    );
    assert_eq!(stdout.matches("would create\t").count(), 6, "{stdout}");
    assert!(
        !stdout.contains("fixture-claude-code-access"),
        "masked: {stdout}"
    );
    assert!(
        stdout.contains("accounts[2]\t") && stdout.contains("gemini"),
        "{stdout}"
    );
    assert!(stdout.contains("--decrypt=true"), "{stdout}");
    assert_eq!(relay.accounts().len(), 1, "a dry run changes nothing");

    // The import: the rest go in, with what the sources say of them.
    let (code, stdout, stderr) = finish(&mut import(false));
    assert_eq!(code, Some(2), "{stdout}\n{stderr}");
    assert!(stderr.contains("2 of 8 entries not imported"), "{stderr}");
    assert_eq!(stdout.matches("created\t").count(), 6, "{stdout}");
    let accounts = relay.accounts();
    assert_eq!(accounts.len(), 7, "{accounts:?}");
    let max = accounts
        .iter()
        .find(|a| a["name"] == "max-1")
        .expect("sub2api's account");
    assert_eq!(
        (max["concurrency_limit"].as_i64(), max["priority"].as_i64()),
        (Some(3), Some(5))
    );
    let setup = accounts
        .iter()
        .find(|a| a["name"] == "st-1")
        .expect("the setup token");
    assert_eq!(setup["refreshable"], false);

    // Again: every account updated in place, none duplicated.
    let (_, stdout, _) = finish(&mut import(false));
    assert_eq!(stdout.matches("updated\t").count(), 6, "{stdout}");
    assert_eq!(relay.accounts().len(), 7);

    // A Claude Code file that names no account: the profile says who it is, and it is the
    // account signed in through `login` (updated, not a second one).
    oauth.sign_in_as(claude_user());
    let ran = login(
        relay.login(&oauth, &upstream, &["claude"]),
        &oauth,
        Browser::Claude { tamper: false },
    )
    .await;
    assert!(ran.ok, "{}", ran.stderr);
    let token = issued_to(&oauth, "ada@example.com").pop().expect("a token");
    let bare = dir.join(".credentials.json");
    std::fs::write(
        &bare,
        json!({"claudeAiOauth": {"accessToken": token, "refreshToken": "rt-from-file", "expiresAt": 1_896_390_400_000_i64, "subscriptionType": "max"}}).to_string(),
    )
    .expect("written");
    let (code, stdout, stderr) = finish(
        relay
            .admin()
            .arg("import")
            .arg(&bare)
            .args(["--oauth-base", oauth.base()]),
    );
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("updated\t"), "{stdout}");
    assert_eq!(relay.accounts().len(), 8);
    relay.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_imports_by_identity_and_a_second_run_updates() {
    let selector = Selector::start().await;
    let env = &selector.env;
    let files = [
        fixture("claude-credentials.json"),
        fixture("codex-auth-api-key.json"),
        fixture("cliproxy-claude-mo@example.com.json"),
        fixture("crs-export.json"),
    ];
    let run = || {
        let mut command = env.command("selector-svc");
        command
            .args(["admin", "import", "--group", "imported"])
            .args(&files);
        finish(&mut command)
    };
    // crs-export.json's first account names no uuid and there is no profile endpoint to ask
    // here (the default is the real one, unreachable): refused by position; the dead one too.
    let (code, stdout, stderr) = run();
    assert_eq!(code, Some(2), "{stdout}\n{stderr}");
    assert_eq!(stdout.matches("created\t").count(), 3, "{stdout}");
    assert!(stdout.contains("claudeAccounts[1]"), "{stdout}");
    let listed = env.run(
        "selector-svc",
        &["admin", "accounts", "--output", "json"],
        &[],
    );
    let listed: Value = serde_json::from_str(&listed).expect("json");
    let accounts = listed["accounts"].as_array().cloned().unwrap_or_default();
    assert_eq!(accounts.len(), 3);
    assert!(accounts.iter().all(|a| a["group"] == "imported"));
    let (_, stdout, _) = run();
    assert_eq!(stdout.matches("updated\t").count(), 3, "{stdout}");
    let again = env.run(
        "selector-svc",
        &["admin", "accounts", "--output", "json"],
        &[],
    );
    let again: Value = serde_json::from_str(&again).expect("json");
    assert_eq!(again["accounts"].as_array().map(Vec::len), Some(3));
}
