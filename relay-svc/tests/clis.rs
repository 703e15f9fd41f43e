//! The official CLIs through the relay: Claude Code (`claude -p`) and Codex (`codex exec`, a
//! `model_providers` entry with `wire_api = "responses"`), at the versions pinned in
//! `tests/clients/package-lock.json`, in standalone and in distributed mode, against the
//! project's fake upstream. Each must exit 0 with the upstream's text, and what it sends must
//! reach the upstream: Claude Code's query string and headers, Codex's session headers and body
//! fields.
//!
//! The CLIs come from `scripts/clients.sh` (an `npm ci` into a cache outside the clone, keyed by
//! the lockfile), or from `POOLGATE_CLIENTS_BIN`.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use poolgate_core::account::Platform;
use poolgate_testkit::Scratch;
use poolgate_testkit::fake_upstream::{FakeUpstream, SeenRequest};
use relay_svc::proxy::RelaySettings;

const KEY: &str = "pgk-cli-test-key-0001";

fn clients_bin() -> PathBuf {
    if let Some(dir) = std::env::var_os("POOLGATE_CLIENTS_BIN") {
        return PathBuf::from(dir);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = std::process::Command::new("bash")
        .arg(root.join("scripts/clients.sh"))
        .output()
        .expect("bash runs");
    assert!(
        output.status.success(),
        "scripts/clients.sh failed (npm and the registry are needed once): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
}

/// Runs a CLI with a clean environment (PATH for node, a scratch HOME, the given variables).
async fn run(program: &Path, args: &[&str], home: &Path, env: &[(&str, String)]) -> (bool, String) {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("TERM", "dumb")
        .current_dir(home)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .unwrap_or_else(|_| panic!("{} did not finish in 180 s", program.display()))
        .unwrap_or_else(|e| panic!("{} does not start: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        eprintln!(
            "{} failed: {}\nstdout: {stdout}\nstderr: {}",
            program.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    (output.status.success(), stdout)
}

async fn claude_code(bin: &Path, relay: &str, key: &str) -> (bool, String) {
    let home = Scratch::new("claude-home").expect("scratch");
    run(
        &bin.join("claude"),
        &["-p", "Say hello."],
        home.path(),
        &[
            ("ANTHROPIC_BASE_URL", relay.to_owned()),
            ("ANTHROPIC_API_KEY", key.to_owned()),
            ("DISABLE_TELEMETRY", "1".to_owned()),
            ("DISABLE_AUTOUPDATER", "1".to_owned()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_owned()),
        ],
    )
    .await
}

async fn codex(bin: &Path, relay: &str, key: &str) -> (bool, String) {
    codex_with(bin, relay, key, "").await
}

/// Codex with `extra` lines in its provider's table (`supports_websockets = true`).
async fn codex_with(bin: &Path, relay: &str, key: &str, extra: &str) -> (bool, String) {
    let home = Scratch::new("codex-home").expect("scratch");
    let codex_home = home.path().join(".codex");
    std::fs::create_dir_all(&codex_home).expect("mkdir");
    std::fs::write(
        codex_home.join("config.toml"),
        format!(
            "model = \"gpt-5-codex\"\nmodel_provider = \"poolgate\"\n\n[model_providers.poolgate]\nname = \"poolgate\"\nbase_url = \"{relay}/v1\"\nenv_key = \"POOLGATE_API_KEY\"\nwire_api = \"responses\"\n{extra}"
        ),
    )
    .expect("config.toml");
    run(
        &bin.join("codex"),
        &["exec", "--skip-git-repo-check", "Say hello."],
        home.path(),
        &[
            ("CODEX_HOME", codex_home.display().to_string()),
            ("POOLGATE_API_KEY", key.to_owned()),
        ],
    )
    .await
}

/// A selector, an admission replica and a relay over `backends` (the distributed mode), served
/// on free ports; keep the `Distributed` for as long as they should run.
struct Distributed {
    relay: String,
    _selector: selector_svc::server::Built,
    _admission: std::sync::Arc<poolgate_lease::LeaseEngine>,
}

async fn distributed(backends: &common::Backends) -> Distributed {
    let (selector, selector_addr) = common::selector(backends).await.expect("selector starts");
    let (admission, admission_addr) = common::admission(&backends.redis.url(), Default::default())
        .await
        .expect("admission starts");
    let addr = common::relay(
        vec![format!("http://{selector_addr}")],
        vec![format!("http://{admission_addr}")],
        RelaySettings::default(),
    )
    .await
    .expect("relay starts");
    Distributed {
        relay: format!("http://{addr}"),
        _selector: selector,
        _admission: admission,
    }
}

/// A `chatgpt_oauth` account on `upstream`'s ChatGPT backend with `token` (refreshable, far from
/// expiry), for the distributed mode's store.
fn chatgpt_account(upstream: &FakeUpstream, token: &str) -> selector_svc::store::AccountInput {
    let mut account = common::account(
        "chatgpt",
        &format!("{}/backend-api", upstream.base_url),
        4,
        0,
    );
    account.platform = Platform::OpenAi;
    account.credential_kind = poolgate_core::account::CredentialKind::ChatGptOAuth;
    account.credential = Some(poolgate_core::account::Secret::new(token));
    account.oauth = Some(poolgate_core::account::OAuthState {
        refresh_token: poolgate_core::account::Secret::new("rt-cli"),
        expires_at_ms: 4_102_444_800_000,
        token_url: format!("{}/oauth/token", upstream.base_url),
        client_id: String::new(),
    });
    account
}

fn header<'a>(request: &'a SeenRequest, name: &str) -> Option<&'a str> {
    request.headers.get(name).and_then(|v| v.to_str().ok())
}

/// Checks what Claude Code's main request looked like when it reached the upstream.
fn check_claude_code(seen: &[SeenRequest]) {
    let request = seen
        .iter()
        .find(|r| r.path == "/v1/messages" && r.body.get("stream").is_some())
        .unwrap_or_else(|| panic!("no /v1/messages reached the upstream: {seen:?}"));
    assert_eq!(
        request.query.as_deref(),
        Some("beta=true"),
        "the query string goes upstream"
    );
    assert_eq!(
        request.headers.get_all("anthropic-beta").iter().count(),
        1,
        "anthropic-beta goes upstream exactly once"
    );
    assert!(header(request, "anthropic-beta").is_some_and(|b| b.contains("claude-code-")));
    assert_eq!(header(request, "anthropic-version"), Some("2023-06-01"));
    assert!(
        request
            .headers
            .keys()
            .any(|name| name.as_str().starts_with("x-stainless-")),
        "x-stainless-* headers go upstream"
    );
    assert!(
        header(request, "x-api-key").is_some_and(|k| k.starts_with("cred-")),
        "the account's credential, never the client's key"
    );
}

/// Checks what Codex's request looked like when it reached the upstream.
fn check_codex(seen: &[SeenRequest]) {
    let request = seen
        .iter()
        .find(|r| r.path == "/v1/responses")
        .unwrap_or_else(|| panic!("no /v1/responses reached the upstream: {seen:?}"));
    for name in [
        "session-id",
        "thread-id",
        "originator",
        "x-client-request-id",
    ] {
        assert!(header(request, name).is_some(), "{name} goes upstream");
    }
    assert!(
        request
            .headers
            .keys()
            .any(|name| name.as_str().starts_with("x-codex-")),
        "x-codex-* headers go upstream"
    );
    assert!(request.body.get("prompt_cache_key").is_some());
    assert!(
        request
            .body
            .pointer("/client_metadata/session_id")
            .is_some()
    );
    assert!(
        header(request, "authorization").is_some_and(|a| a.starts_with("Bearer cred-")),
        "the account's credential"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_and_codex_work_through_the_standalone_relay() {
    let bin = clients_bin();
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: cli, group: default}}\naccounts:\n  - {{name: claude-a, platform: anthropic, base_url: \"{base}\", credential: cred-claude-a, concurrency: 4}}\n  - {{name: claude-b, platform: anthropic, base_url: \"{base}\", credential: cred-claude-b, concurrency: 4}}\n  - {{name: codex-a, platform: openai, base_url: \"{base}\", credential: cred-codex-a, concurrency: 4}}\n",
        base = upstream.base_url
    );
    let (_relay, addr) = common::standalone(&yaml, RelaySettings::default(), Default::default())
        .await
        .expect("standalone relay starts");
    let relay = format!("http://{addr}");
    let (ok, stdout) = claude_code(&bin, &relay, KEY).await;
    assert!(ok, "claude -p exits 0");
    assert!(stdout.contains("Hello there."), "{stdout}");
    check_claude_code(&upstream.seen_requests());
    let (ok, stdout) = codex(&bin, &relay, KEY).await;
    assert!(ok, "codex exec exits 0");
    assert!(stdout.contains("Hello there."), "{stdout}");
    check_codex(&upstream.seen_requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_and_codex_work_through_the_distributed_relay() {
    let bin = clients_bin();
    let backends = common::backends().await.expect("backends start");
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    for (name, platform) in [
        ("claude-a", Platform::Anthropic),
        ("claude-b", Platform::Anthropic),
        ("codex-a", Platform::OpenAi),
    ] {
        let mut account = common::account(name, &upstream.base_url, 4, 0);
        account.platform = platform;
        backends
            .store
            .upsert_account(&account)
            .await
            .expect("account");
    }
    let (_, key) = backends
        .store
        .create_api_key("cli", "cli", "default", 0)
        .await
        .expect("key");
    let stack = distributed(&backends).await;
    let relay = stack.relay.clone();
    let key = key.expose().to_owned();
    let (ok, stdout) = claude_code(&bin, &relay, &key).await;
    assert!(ok, "claude -p exits 0");
    assert!(stdout.contains("Hello there."), "{stdout}");
    check_claude_code(&upstream.seen_requests());
    let (ok, stdout) = codex(&bin, &relay, &key).await;
    assert!(ok, "codex exec exits 0");
    assert!(stdout.contains("Hello there."), "{stdout}");
    check_codex(&upstream.seen_requests());
}

/// Codex's request as the ChatGPT backend received it through a `chatgpt_oauth` account.
fn check_codex_on_chatgpt(seen: &[SeenRequest]) {
    let request = seen
        .iter()
        .find(|r| r.path == "/backend-api/codex/responses")
        .unwrap_or_else(|| panic!("no request reached the ChatGPT backend: {seen:?}"));
    assert_eq!(header(request, "chatgpt-account-id"), Some("acct-cli"));
    assert_eq!(header(request, "originator"), Some("codex_exec"));
    assert!(header(request, "session-id").is_some());
    assert_eq!(request.body["store"], false);
    assert_eq!(request.body["stream"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_works_through_a_chatgpt_subscription_account_in_both_modes() {
    let bin = clients_bin();
    let token = poolgate_testkit::fake_upstream::fake_chatgpt_token("acct-cli");
    // Standalone.
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: cli, group: default}}\naccounts:\n  - {{name: chatgpt, platform: openai, base_url: \"{}/backend-api\", chatgpt_oauth: {{access_token: \"{token}\"}}, concurrency: 4}}\n",
        upstream.base_url
    );
    let (_relay, addr) = common::standalone(&yaml, RelaySettings::default(), Default::default())
        .await
        .expect("standalone relay starts");
    let (ok, stdout) = codex(&bin, &format!("http://{addr}"), KEY).await;
    assert!(ok, "codex exec exits 0 (standalone)");
    assert!(stdout.contains("Hello there."), "{stdout}");
    check_codex_on_chatgpt(&upstream.seen_requests());
    // Distributed.
    let backends = common::backends().await.expect("backends start");
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let account = chatgpt_account(&upstream, &token);
    backends
        .store
        .upsert_account(&account)
        .await
        .expect("account");
    let (_, key) = backends
        .store
        .create_api_key("cli", "cli", "default", 0)
        .await
        .expect("key");
    let stack = distributed(&backends).await;
    let (ok, stdout) = codex(&bin, &stack.relay, key.expose()).await;
    assert!(ok, "codex exec exits 0 (distributed)");
    assert!(stdout.contains("Hello there."), "{stdout}");
    check_codex_on_chatgpt(&upstream.seen_requests());
}

/// Codex over the Responses WebSocket (`supports_websockets = true` in its provider) through the
/// relay, in both modes, on an API-key and a ChatGPT account: it exits 0 with the upstream's
/// text, and its turns ran on the socket (`relay_socket_turns_total`), not over HTTP after a
/// fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_over_the_websocket_works_in_both_modes_on_api_key_and_chatgpt_accounts() {
    const SOCKETS: &str = "supports_websockets = true\n";
    let bin = clients_bin();
    let token = poolgate_testkit::fake_upstream::fake_chatgpt_token("acct-cli");
    // Codex exited 0 with the upstream's text, its turn ran on the relay's socket and reached
    // the upstream over the upstream's own socket, with what a ChatGPT account needs.
    let check_socket_run = |relay: &relay_svc::proxy::Relay,
                            upstream: &FakeUpstream,
                            chatgpt: bool,
                            ok: bool,
                            stdout: &str,
                            mode: &str| {
        assert!(ok, "codex exec exits 0 ({mode}, chatgpt {chatgpt})");
        assert!(stdout.contains("Hello there."), "{stdout}");
        let turns = relay
            .metrics
            .socket_turns
            .with_label_values(&["turn"])
            .get();
        assert!(
            turns >= 1,
            "the turn ran on the socket ({mode}, chatgpt {chatgpt})"
        );
        let seen = upstream.seen_requests();
        assert!(
            seen.iter().any(|r| !r.probe && r.socket.is_some()),
            "the turn reached the upstream over its own socket ({mode}, chatgpt {chatgpt})"
        );
        if chatgpt {
            check_codex_on_chatgpt(&seen);
        }
    };
    for chatgpt in [false, true] {
        // Standalone.
        let upstream = FakeUpstream::start().await.expect("fake upstream");
        let account = if chatgpt {
            format!(
                "{{name: chatgpt, platform: openai, base_url: \"{}/backend-api\", chatgpt_oauth: {{access_token: \"{token}\"}}, concurrency: 4}}",
                upstream.base_url
            )
        } else {
            format!(
                "{{name: api, platform: openai, base_url: \"{}\", credential: sk-ws, concurrency: 4}}",
                upstream.base_url
            )
        };
        let yaml = format!(
            "api_keys:\n  - {{key: {KEY}, user: cli, group: default}}\naccounts:\n  - {account}\n"
        );
        let (relay, addr) = common::standalone(&yaml, RelaySettings::default(), Default::default())
            .await
            .expect("standalone relay starts");
        let (ok, stdout) = codex_with(&bin, &format!("http://{addr}"), KEY, SOCKETS).await;
        check_socket_run(&relay, &upstream, chatgpt, ok, &stdout, "standalone");
        // Distributed.
        let backends = common::backends().await.expect("backends start");
        let upstream = FakeUpstream::start().await.expect("fake upstream");
        let input = if chatgpt {
            chatgpt_account(&upstream, &token)
        } else {
            let mut api = common::account("api", &upstream.base_url, 4, 0);
            api.platform = Platform::OpenAi;
            api
        };
        backends
            .store
            .upsert_account(&input)
            .await
            .expect("account");
        let (_, key) = backends
            .store
            .create_api_key("cli", "cli", "default", 0)
            .await
            .expect("key");
        let (selector, selector_addr) = common::selector(&backends).await.expect("selector");
        let (admission, admission_addr) =
            common::admission(&backends.redis.url(), Default::default())
                .await
                .expect("admission");
        let (relay, addr) = common::relay_with_handle(
            vec![format!("http://{selector_addr}")],
            vec![format!("http://{admission_addr}")],
            RelaySettings::default(),
        )
        .await
        .expect("relay starts");
        let (ok, stdout) = codex_with(&bin, &format!("http://{addr}"), key.expose(), SOCKETS).await;
        check_socket_run(&relay, &upstream, chatgpt, ok, &stdout, "distributed");
        drop((selector, admission));
    }
}

/// The pinned CLIs through both modes against an API-key and a subscription account of each
/// platform, with a recording hop between the CLI and the relay (`common::recording_hop`): the
/// upstream gets the CLI's body byte for byte and every header the CLI sent (but the credential,
/// the hop-by-hop ones and `accept-encoding`) with its value, and nothing the relay adds beyond
/// what docs/DESIGN.md §6 lists.
mod transparency {
    use super::*;
    use common::recording_hop::{HOP_BY_HOP, HopRequest, RecordingHop};
    use poolgate_core::account::{CredentialKind, OAuthState, Secret};
    use poolgate_testkit::fake_upstream::fake_chatgpt_token;

    const API_KEY_CLIENT: &str = "pgk-cli-api-accounts-0001";
    const SUBSCRIPTION_CLIENT: &str = "pgk-cli-subscriptions-0001";
    const CLAUDE_TOKEN: &str = "sk-ant-oat01-cli-subscription";

    /// What the relay sets on its own, per upstream, besides the credential: the only headers
    /// the upstream may see that the client did not send.
    fn relay_sets(upstream_path: &str) -> &'static [&'static str] {
        if upstream_path.starts_with("/backend-api/") {
            &[
                "authorization",
                "chatgpt-account-id",
                "accept-encoding",
                "session-id",
            ]
        } else if upstream_path.starts_with("/v1/messages") {
            &[
                "x-api-key",
                "authorization",
                "anthropic-beta",
                "accept-encoding",
            ]
        } else {
            &["authorization", "accept-encoding"]
        }
    }

    /// The relay changed nothing of `sent` on its way to `got`, but what DESIGN §6 allows.
    fn assert_untouched(cli: &str, sent: &HopRequest, got: &SeenRequest, oauth_beta: bool) {
        assert_eq!(
            got.raw, sent.body,
            "{cli}: the body reaches the upstream byte for byte"
        );
        let query = sent.target.split_once('?').map(|(_, q)| q.to_owned());
        assert_eq!(got.query, query, "{cli}: the query string");
        for name in sent.headers.keys() {
            let name = name.as_str();
            if HOP_BY_HOP.contains(&name)
                || ["authorization", "x-api-key", "accept-encoding"].contains(&name)
            {
                continue;
            }
            let values = |headers: &http::HeaderMap| -> Vec<String> {
                headers
                    .get_all(name)
                    .iter()
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .collect()
            };
            let mut expected = values(&sent.headers);
            if name == "anthropic-beta" && oauth_beta {
                let joined = expected.join(",");
                if !joined.split(',').any(|b| b.trim() == "oauth-2025-04-20") {
                    expected = vec![format!("{joined},oauth-2025-04-20")];
                }
            }
            assert_eq!(
                values(&got.headers),
                expected,
                "{cli}: header {name} reaches the upstream as sent"
            );
        }
        for name in got.headers.keys() {
            let name = name.as_str();
            assert!(
                sent.headers.contains_key(name)
                    || HOP_BY_HOP.contains(&name)
                    || relay_sets(&got.path).contains(&name),
                "{cli}: the relay added {name}, which DESIGN §6 does not list"
            );
        }
        assert_eq!(
            header(got, "accept-encoding"),
            Some("identity"),
            "{cli}: the relay reads the answer"
        );
    }

    /// The CLI's request the hop kept, and the one the upstream got with `credential`.
    fn pair(
        hop: &RecordingHop,
        upstream: &FakeUpstream,
        hop_path: &str,
        credential: &str,
    ) -> (HopRequest, SeenRequest) {
        let sent = hop
            .requests()
            .into_iter()
            .rev()
            .find(|r| r.method == http::Method::POST && r.target.starts_with(hop_path))
            .unwrap_or_else(|| panic!("the CLI sent no {hop_path}"));
        let got = upstream
            .seen_requests()
            .into_iter()
            .rev()
            .find(|r| !r.probe && r.credential() == credential)
            .unwrap_or_else(|| panic!("nothing reached the upstream with {credential}"));
        (sent, got)
    }

    /// Runs both CLIs through `relay` with each client key and compares.
    async fn check_all(bin: &Path, relay: &str, upstream: &FakeUpstream, keys: [&str; 2]) {
        let hop = RecordingHop::start(relay).await.expect("hop starts");
        let chatgpt = fake_chatgpt_token("acct-cli");
        let [api_key_client, subscription_client] = keys;
        for (client, claude_credential, codex_credential, subscription) in [
            (api_key_client, "cred-claude-key", "cred-codex-key", false),
            (subscription_client, CLAUDE_TOKEN, chatgpt.as_str(), true),
        ] {
            let (ok, stdout) = claude_code(bin, &hop.base_url, client).await;
            assert!(ok, "claude -p exits 0 (subscription: {subscription})");
            assert!(stdout.contains("Hello there."), "{stdout}");
            let (sent, got) = pair(&hop, upstream, "/v1/messages", claude_credential);
            assert_eq!(got.path, "/v1/messages");
            assert_untouched("claude", &sent, &got, subscription);
            let (ok, stdout) = codex(bin, &hop.base_url, client).await;
            assert!(ok, "codex exec exits 0 (subscription: {subscription})");
            assert!(stdout.contains("Hello there."), "{stdout}");
            let (sent, got) = pair(&hop, upstream, "/v1/responses", codex_credential);
            let expected_path = if subscription {
                "/backend-api/codex/responses"
            } else {
                "/v1/responses"
            };
            assert_eq!(got.path, expected_path);
            assert_untouched("codex", &sent, &got, false);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_pinned_clis_reach_every_kind_of_account_untouched_standalone() {
        let bin = clients_bin();
        let upstream = FakeUpstream::start().await.expect("fake upstream");
        upstream.set_claude_code_only(CLAUDE_TOKEN);
        let chatgpt = fake_chatgpt_token("acct-cli");
        let base = &upstream.base_url;
        let yaml = format!(
            "api_keys:\n  - {{key: {API_KEY_CLIENT}, user: cli, group: api}}\n  - {{key: {SUBSCRIPTION_CLIENT}, user: cli, group: sub}}\naccounts:\n  - {{name: claude-key, group: api, platform: anthropic, base_url: \"{base}\", credential: cred-claude-key, concurrency: 4}}\n  - {{name: codex-key, group: api, platform: openai, base_url: \"{base}\", credential: cred-codex-key, concurrency: 4}}\n  - {{name: claude-sub, group: sub, platform: anthropic, base_url: \"{base}\", oauth: {{access_token: {CLAUDE_TOKEN}}}, concurrency: 4}}\n  - {{name: chatgpt-sub, group: sub, platform: openai, base_url: \"{base}/backend-api\", chatgpt_oauth: {{access_token: \"{chatgpt}\"}}, concurrency: 4}}\n"
        );
        let (_relay, addr) =
            common::standalone(&yaml, RelaySettings::default(), Default::default())
                .await
                .expect("standalone relay starts");
        check_all(
            &bin,
            &format!("http://{addr}"),
            &upstream,
            [API_KEY_CLIENT, SUBSCRIPTION_CLIENT],
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_pinned_clis_reach_every_kind_of_account_untouched_distributed() {
        let bin = clients_bin();
        let backends = common::backends().await.expect("backends start");
        let upstream = FakeUpstream::start().await.expect("fake upstream");
        upstream.set_claude_code_only(CLAUDE_TOKEN);
        let oauth = |refresh: &str| OAuthState {
            refresh_token: Secret::new(refresh),
            expires_at_ms: 4_102_444_800_000,
            token_url: format!("{}/oauth/token", upstream.base_url),
            client_id: String::new(),
        };
        let mut accounts = Vec::new();
        for (name, platform) in [
            ("claude-key", Platform::Anthropic),
            ("codex-key", Platform::OpenAi),
        ] {
            let mut account = common::account(name, &upstream.base_url, 4, 0);
            account.platform = platform;
            account.group = "api".into();
            accounts.push(account);
        }
        let mut claude = common::account("claude-sub", &upstream.base_url, 4, 0);
        claude.group = "sub".into();
        claude.credential_kind = CredentialKind::OAuth;
        claude.credential = Some(Secret::new(CLAUDE_TOKEN));
        claude.oauth = Some(oauth("rt-claude"));
        accounts.push(claude);
        let mut chatgpt = common::account(
            "chatgpt-sub",
            &format!("{}/backend-api", upstream.base_url),
            4,
            0,
        );
        chatgpt.group = "sub".into();
        chatgpt.platform = Platform::OpenAi;
        chatgpt.credential_kind = CredentialKind::ChatGptOAuth;
        chatgpt.credential = Some(Secret::new(fake_chatgpt_token("acct-cli")));
        chatgpt.oauth = Some(oauth("rt-chatgpt"));
        accounts.push(chatgpt);
        for account in &accounts {
            backends
                .store
                .upsert_account(account)
                .await
                .expect("account");
        }
        let (_, api_key_client) = backends
            .store
            .create_api_key("cli-api", "cli", "api", 0)
            .await
            .expect("key");
        let (_, subscription_client) = backends
            .store
            .create_api_key("cli-sub", "cli", "sub", 0)
            .await
            .expect("key");
        let stack = distributed(&backends).await;
        check_all(
            &bin,
            &stack.relay,
            &upstream,
            [api_key_client.expose(), subscription_client.expose()],
        )
        .await;
    }
}
