//! OAuth token endpoints: our defaults are the ones the pinned official CLIs refresh
//! at, an account without an endpoint of its own reads as its platform's default (so the
//! refresher never skips it), and migration 0003 moves rows off the dead Anthropic endpoint.
//!
//! The CLI checks read the CLIs installed by `scripts/clients.sh` (the versions pinned in
//! `tests/clients/package-lock.json`), found through `POOLGATE_CLIENTS_BIN` as
//! `relay-svc/tests/clis.rs` finds them. Without them the checks print a note and pass, except
//! under `CI=true`, where they fail.

use crate::support;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use poolgate_core::account::{
    CredentialKind, LEGACY_ANTHROPIC_TOKEN_URL, Platform, Secret, default_oauth_client_id,
    default_oauth_token_url,
};
use poolgate_select::crypto::Keyring;
use poolgate_testkit::PostgresServer;
use selector_svc::store::{AccountInput, MIGRATOR, PostgresSource};
use support::{api_account, oauth};

// ---- the pinned CLIs ----------------------------------------------------------------------

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// The CLIs' `node_modules/.bin`: `POOLGATE_CLIENTS_BIN`, else what `scripts/clients.sh` prints
/// (it installs once into its cache when npm and the registry are reachable). `None`, with a
/// note, when they are not there; under CI a missing install fails the test.
fn clients_bin() -> Option<PathBuf> {
    let bin = match std::env::var_os("POOLGATE_CLIENTS_BIN") {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
            match std::process::Command::new("bash")
                .arg(root.join("scripts/clients.sh"))
                .output()
            {
                Ok(output) if output.status.success() => Ok(PathBuf::from(
                    String::from_utf8_lossy(&output.stdout)
                        .lines()
                        .last()
                        .unwrap_or_default()
                        .trim(),
                )),
                Ok(output) => Err(format!(
                    "scripts/clients.sh failed: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                )),
                Err(error) => Err(format!("bash does not start: {error}")),
            }
        }
    };
    let missing = match bin {
        Ok(bin) if bin.join("claude").exists() && bin.join("codex").exists() => return Some(bin),
        Ok(bin) => format!("{} holds no claude and codex", bin.display()),
        Err(why) => why,
    };
    assert!(
        !in_ci(),
        "the pinned CLIs are not installed ({missing}); CI must run scripts/clients.sh \
         (scripts/test.sh exports POOLGATE_CLIENTS_BIN)"
    );
    eprintln!("skipped: the pinned CLIs are not installed ({missing}); run scripts/clients.sh");
    None
}

/// Files named one of `names` under `dir`, depth first, in name order.
fn files_named(dir: &Path, names: &[&str], found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files_named(&path, names, found);
        } else if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| names.contains(&n))
        {
            found.push(path);
        }
    }
}

/// Where a CLI's code is: the file its `.bin` link runs (Claude Code: the native binary, or
/// `cli.js` in JS builds; Codex: a JS launcher), then the files named `names` in the packages
/// of its npm scope (Codex's native binary is in `@openai/codex-<platform>/vendor/.../bin/`).
fn cli_files(bin: &Path, command: &str, scope: &str, names: &[&str]) -> Vec<PathBuf> {
    let mut files = vec![];
    if let Ok(target) = std::fs::canonicalize(bin.join(command)) {
        files.push(target);
    }
    let mut more = vec![];
    files_named(&bin.join("..").join(scope), names, &mut more);
    for path in more {
        let path = std::fs::canonicalize(&path).unwrap_or(path);
        if !files.contains(&path) {
            files.push(path);
        }
    }
    files
}

/// Every occurrence of `needle` in the file, with up to `BEFORE` bytes before it and `AFTER`
/// after it, read in chunks (the native binaries are hundreds of MB).
fn occurrences(path: &Path, needle: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    const BEFORE: usize = 256;
    const AFTER: usize = 256;
    let mut file = std::fs::File::open(path)
        .unwrap_or_else(|e| panic!("{} does not open: {e}", path.display()));
    let tail = needle.len() + AFTER;
    let mut buf: Vec<u8> = Vec::with_capacity(16 << 20);
    let mut chunk = vec![0u8; 16 << 20];
    let mut from = 0;
    let mut found = vec![];
    loop {
        let read = file
            .read(&mut chunk)
            .unwrap_or_else(|e| panic!("{} does not read: {e}", path.display()));
        buf.extend_from_slice(&chunk[..read]);
        // Matches starting before `cut` have their context in `buf`; later ones are looked for
        // again with the next chunk.
        let cut = if read == 0 {
            buf.len()
        } else {
            buf.len().saturating_sub(tail)
        };
        let mut at = from;
        while let Some(start) = find(&buf, needle, at).filter(|start| *start < cut) {
            let end = start + needle.len();
            found.push((
                buf[start.saturating_sub(BEFORE)..start].to_vec(),
                buf[end..(end + AFTER).min(buf.len())].to_vec(),
            ));
            at = start + 1;
        }
        if read == 0 {
            return found;
        }
        let keep = cut.saturating_sub(BEFORE);
        from = cut - keep;
        buf.drain(..keep);
    }
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while at + needle.len() <= haystack.len() {
        at += haystack[at..].iter().position(|b| *b == needle[0])?;
        if haystack[at..].starts_with(needle) {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// The URL characters a host and path of a token endpoint use.
fn url_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'/' | b'_' | b':')
}

/// The values of `TOKEN_URL:"..."` (Claude Code's OAuth config) in the first file that has any.
fn claude_code_token_urls(files: &[PathBuf]) -> (Option<&PathBuf>, BTreeSet<String>) {
    for file in files {
        let urls: BTreeSet<String> = occurrences(file, b"TOKEN_URL:\"")
            .into_iter()
            .filter_map(|(_, after)| {
                let end = after.iter().position(|b| *b == b'"')?;
                let url = std::str::from_utf8(&after[..end]).ok()?;
                url.starts_with("https://").then(|| url.to_owned())
            })
            .collect();
        if !urls.is_empty() {
            return (Some(file), urls);
        }
    }
    (None, BTreeSet::new())
}

/// The `https://.../oauth/token` literals in the first file that has any (the Codex binary's
/// string literals sit back to back, so each is taken from its `https://` to `/oauth/token`).
fn codex_token_urls(files: &[PathBuf]) -> (Option<&PathBuf>, BTreeSet<String>) {
    let path = b"/oauth/token";
    for file in files {
        let urls: BTreeSet<String> = occurrences(file, path)
            .into_iter()
            .filter_map(|(before, _)| {
                let scheme = before.windows(8).rposition(|w| w == b"https://")?;
                let host = &before[scheme + 8..];
                (!host.is_empty() && host.iter().all(|b| url_byte(*b)))
                    .then(|| format!("https://{}/oauth/token", String::from_utf8_lossy(host)))
            })
            .collect();
        if !urls.is_empty() {
            return (Some(file), urls);
        }
    }
    (None, BTreeSet::new())
}

#[test]
fn our_anthropic_default_is_claude_codes_token_url() {
    let Some(bin) = clients_bin() else { return };
    let files = cli_files(
        &bin,
        "claude",
        "@anthropic-ai",
        &["claude", "claude.exe", "cli.js"],
    );
    let (file, urls) = claude_code_token_urls(&files);
    let file = file.unwrap_or_else(|| {
        panic!("no TOKEN_URL:\"...\" in Claude Code's files {files:?}: its layout changed")
    });
    eprintln!("Claude Code's TOKEN_URL in {}: {urls:?}", file.display());
    let ours = default_oauth_token_url(Platform::Anthropic);
    assert!(
        urls.contains(ours),
        "default_oauth_token_url(Anthropic) is {ours}, the pinned Claude Code ({}) refreshes at {urls:?}",
        file.display()
    );
    assert!(!urls.contains(LEGACY_ANTHROPIC_TOKEN_URL));
}

#[test]
fn our_openai_default_is_codexs_token_url() {
    let Some(bin) = clients_bin() else { return };
    let files = cli_files(&bin, "codex", "@openai", &["codex", "codex.exe"]);
    let (file, urls) = codex_token_urls(&files);
    let file = file.unwrap_or_else(|| {
        panic!("no https://.../oauth/token in Codex's files {files:?}: its layout changed")
    });
    eprintln!("Codex's oauth/token URLs in {}: {urls:?}", file.display());
    let ours = default_oauth_token_url(Platform::OpenAi);
    assert!(
        urls.contains(ours),
        "default_oauth_token_url(OpenAi) is {ours}, the pinned Codex ({}) names {urls:?}",
        file.display()
    );
}

/// Whether any of `files` holds `needle`.
fn holds(files: &[PathBuf], needle: &str) -> bool {
    files
        .iter()
        .any(|file| !occurrences(file, needle.as_bytes()).is_empty())
}

#[test]
fn our_client_ids_and_usage_endpoints_are_the_pinned_clis_own() {
    let Some(bin) = clients_bin() else { return };
    let claude = cli_files(
        &bin,
        "claude",
        "@anthropic-ai",
        &["claude", "claude.exe", "cli.js"],
    );
    let ours = default_oauth_client_id(Platform::Anthropic);
    assert!(
        holds(&claude, &format!("CLIENT_ID:\"{ours}\"")),
        "Claude Code's CLIENT_ID is not {ours} ({claude:?})"
    );
    // What it reads its usage view from, with the OAuth beta (docs/SUBSCRIPTIONS.md).
    for needle in ["\"/api/oauth/usage\"", "\"oauth-2025-04-20\""] {
        assert!(
            holds(&claude, needle),
            "{needle} not in Claude Code ({claude:?})"
        );
    }
    let codex = cli_files(&bin, "codex", "@openai", &["codex", "codex.exe"]);
    let ours = default_oauth_client_id(Platform::OpenAi);
    assert!(holds(&codex, ours), "{ours} not in Codex ({codex:?})");
    for needle in ["/wham/usage", "chatgpt-account-id"] {
        assert!(holds(&codex, needle), "{needle} not in Codex ({codex:?})");
    }
}

#[test]
fn the_scan_finds_a_needle_across_chunk_boundaries() {
    let scratch = poolgate_testkit::Scratch::new("token-scan").expect("scratch");
    let path = scratch.path().join("blob");
    // One needle straddles the 16 MiB chunk boundary (its URL's start in the first chunk), the
    // other ends the file.
    let mut blob = vec![0u8; (16 << 20) - 4 - "xhttps://a.example".len()];
    blob.extend_from_slice(b"xhttps://a.example/oauth/token\0");
    blob.extend_from_slice(b"TOKEN_URL:\"https://b.example/v1/oauth/token\"");
    std::fs::write(&path, &blob).expect("write");
    let files = vec![path];
    assert_eq!(
        codex_token_urls(&files).1,
        BTreeSet::from([
            "https://a.example/oauth/token".to_owned(),
            "https://b.example/v1/oauth/token".to_owned()
        ])
    );
    assert_eq!(
        claude_code_token_urls(&files).1,
        BTreeSet::from(["https://b.example/v1/oauth/token".to_owned()])
    );
}

// ---- stored accounts ----------------------------------------------------------------------

async fn store_on(postgres: &PostgresServer) -> PostgresSource {
    let keyring = Arc::new(
        Keyring::parse(&format!("k1:{}", Keyring::generate_key()), None).expect("keyring"),
    );
    PostgresSource::connect(&postgres.url(), keyring)
        .await
        .expect("connect")
}

fn subscription(name: &str, platform: Platform, token_url: &str) -> AccountInput {
    let mut input = api_account(name, "g");
    input.platform = platform;
    input.credential_kind = match platform {
        Platform::Anthropic => CredentialKind::OAuth,
        Platform::OpenAi => CredentialKind::ChatGptOAuth,
        Platform::Rerank => unreachable!("rerank accounts are API keys"),
    };
    input.credential = Some(Secret::new(format!("access-{name}")));
    input.oauth = Some(oauth(&format!("refresh-{name}"), 1_000, token_url));
    input
}

async fn stored_token_url(store: &PostgresSource, id: i64) -> Option<String> {
    sqlx::query_scalar("SELECT token_url FROM accounts WHERE id = $1")
        .bind(id)
        .fetch_one(store.pool())
        .await
        .expect("row")
}

async fn read_token_url(store: &PostgresSource, id: i64) -> String {
    let account = store.load_account(id).await.expect("loads");
    let from_snapshot = store.load_snapshot().await.expect("snapshot");
    let in_snapshot = from_snapshot.account(id).expect("in the snapshot");
    assert_eq!(account.oauth, in_snapshot.oauth);
    account.oauth.expect("oauth").token_url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_without_a_token_url_reads_as_its_platforms_default() {
    let postgres = PostgresServer::start().await.expect("postgres");
    let store = store_on(&postgres).await;
    store.migrate().await.expect("migrate");
    let claude = store
        .upsert_account(&subscription("claude", Platform::Anthropic, ""))
        .await
        .expect("stored");
    let chatgpt = store
        .upsert_account(&subscription("chatgpt", Platform::OpenAi, ""))
        .await
        .expect("stored");
    let own = store
        .upsert_account(&subscription(
            "own",
            Platform::Anthropic,
            "https://idp.example/token",
        ))
        .await
        .expect("stored");
    let empty = store
        .upsert_account(&subscription("empty", Platform::OpenAi, ""))
        .await
        .expect("stored");
    sqlx::query("UPDATE accounts SET token_url = '' WHERE id = $1")
        .bind(empty)
        .execute(store.pool())
        .await
        .expect("an empty token_url, as an older writer may have stored");

    // An empty URL in an upsert is stored as NULL, and NULL (or '') reads as the default.
    assert_eq!(stored_token_url(&store, claude).await, None);
    assert_eq!(stored_token_url(&store, chatgpt).await, None);
    assert_eq!(
        read_token_url(&store, claude).await,
        default_oauth_token_url(Platform::Anthropic)
    );
    assert_eq!(
        read_token_url(&store, chatgpt).await,
        default_oauth_token_url(Platform::OpenAi)
    );
    assert_eq!(
        read_token_url(&store, empty).await,
        default_oauth_token_url(Platform::OpenAi)
    );
    assert_eq!(
        read_token_url(&store, own).await,
        "https://idp.example/token"
    );

    // An update that names no URL keeps the account's own.
    store
        .upsert_account(&subscription("own", Platform::Anthropic, ""))
        .await
        .expect("updated");
    assert_eq!(
        read_token_url(&store, own).await,
        "https://idp.example/token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_0003_moves_rows_off_the_old_anthropic_endpoint() {
    let postgres = PostgresServer::start().await.expect("postgres");
    let store = store_on(&postgres).await;
    MIGRATOR
        .run_to(2, store.pool())
        .await
        .expect("schema version 2");
    // This build's store writes a column a later migration adds (`serves`, 0012): the old schema
    // gets it for these writes and loses it again before the migrations run on.
    let later_column = |statement: &'static str| {
        let pool = store.pool().clone();
        async move {
            sqlx::query(statement)
                .execute(&pool)
                .await
                .expect(statement)
        }
    };
    later_column("ALTER TABLE accounts ADD COLUMN serves TEXT[]").await;
    let old = store
        .upsert_account(&subscription(
            "old",
            Platform::Anthropic,
            LEGACY_ANTHROPIC_TOKEN_URL,
        ))
        .await
        .expect("stored");
    let unset = store
        .upsert_account(&subscription("unset", Platform::Anthropic, ""))
        .await
        .expect("stored");
    let own = store
        .upsert_account(&subscription(
            "own",
            Platform::Anthropic,
            "https://idp.example/token",
        ))
        .await
        .expect("stored");
    let chatgpt = store
        .upsert_account(&subscription(
            "chatgpt",
            Platform::OpenAi,
            default_oauth_token_url(Platform::OpenAi),
        ))
        .await
        .expect("stored");
    assert_eq!(
        stored_token_url(&store, old).await.as_deref(),
        Some(LEGACY_ANTHROPIC_TOKEN_URL)
    );

    later_column("ALTER TABLE accounts DROP COLUMN serves").await;
    store.migrate().await.expect("migrate to the latest");
    store.check_schema().await.expect("the latest schema");
    assert_eq!(
        stored_token_url(&store, old).await.as_deref(),
        Some(default_oauth_token_url(Platform::Anthropic))
    );
    assert_eq!(
        stored_token_url(&store, unset).await,
        None,
        "NULL stays NULL"
    );
    assert_eq!(
        stored_token_url(&store, own).await.as_deref(),
        Some("https://idp.example/token")
    );
    assert_eq!(
        stored_token_url(&store, chatgpt).await.as_deref(),
        Some(default_oauth_token_url(Platform::OpenAi))
    );
    for id in [old, unset] {
        assert_eq!(
            read_token_url(&store, id).await,
            default_oauth_token_url(Platform::Anthropic)
        );
    }
}

/// The sign-in flows (`poolgate_operator::signin`): Claude Code's authorize URL, paste-the-code
/// redirect, scopes (the list it joins, each one), `setup-token`'s one scope and year, the
/// profile it reads; the Codex CLI's scopes, local redirect, PKCE parameters and device-code
/// endpoints. A new pinned CLI that changes any of them fails here.
#[test]
fn our_sign_in_flows_use_the_pinned_clis_endpoints_redirects_and_scopes() {
    use poolgate_operator::signin::{chatgpt, claude};
    let Some(bin) = clients_bin() else { return };
    let claude_files = cli_files(
        &bin,
        "claude",
        "@anthropic-ai",
        &["claude", "claude.exe", "cli.js"],
    );
    let mut needles = vec![
        format!("CLAUDE_AI_AUTHORIZE_URL:\"{}\"", claude::AUTHORIZE_URL),
        format!("MANUAL_REDIRECT_URL:\"{}\"", claude::REDIRECT_URI),
        format!("\"{}\"", claude::SETUP_TOKEN_SCOPES),
        format!("={}", claude::SETUP_TOKEN_SECONDS),
        "/api/oauth/profile".to_owned(),
    ];
    needles.extend(
        claude::SCOPES
            .split(' ')
            .map(|scope| format!("\"{scope}\"")),
    );
    for needle in &needles {
        assert!(
            holds(&claude_files, needle),
            "{needle} not in Claude Code ({claude_files:?})"
        );
    }
    assert!(
        claude::PROFILE_URL.starts_with("https://api.anthropic.com/"),
        "{}",
        claude::PROFILE_URL
    );
    let codex = cli_files(&bin, "codex", "@openai", &["codex", "codex.exe"]);
    let path = |url: &str| {
        url.strip_prefix(chatgpt::ISSUER)
            .unwrap_or_else(|| panic!("{url} is not under {}", chatgpt::ISSUER))
            .to_owned()
    };
    // The device flow's endpoints are `<issuer>/api/accounts` (one literal) and their paths.
    let accounts_api = format!("{}/api/accounts", chatgpt::ISSUER);
    let device = |url: &str| {
        url.strip_prefix(&accounts_api)
            .unwrap_or_else(|| panic!("{url} is not under {accounts_api}"))
            .to_owned()
    };
    let needles = [
        chatgpt::ISSUER.to_owned(),
        chatgpt::SCOPES.to_owned(),
        path(chatgpt::AUTHORIZE_URL),
        accounts_api.clone(),
        device(chatgpt::DEVICE_CODE_URL),
        device(chatgpt::DEVICE_TOKEN_URL),
        path(chatgpt::DEVICE_VERIFY_URL),
        path(chatgpt::DEVICE_REDIRECT_URI),
        "/auth/callback".to_owned(),
        "id_token_add_organizations".to_owned(),
        "codex_cli_simplified_flow".to_owned(),
    ];
    for needle in &needles {
        assert!(holds(&codex, needle), "{needle} not in Codex ({codex:?})");
    }
    assert_eq!(
        chatgpt::REDIRECT_URI,
        "http://localhost:1455/auth/callback",
        "Codex's registered default port"
    );
}
