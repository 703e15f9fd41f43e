//! Each format read from its fixture (`operator/tests/fixtures/import/`, built from where each
//! format is defined).

use std::path::PathBuf;

use poolgate_core::account::{CredentialKind, Platform};

use super::formats::{Entry, parse, read_file};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/import")
        .join(name)
}

fn entries(name: &str) -> Vec<Result<Entry, (String, String)>> {
    read_file(&fixture(name))
}

fn one(name: &str) -> Entry {
    let mut all = entries(name);
    assert_eq!(all.len(), 1, "{name}");
    match all.remove(0) {
        Ok(entry) => entry,
        Err((position, why)) => panic!("{position}: {why}"),
    }
}

#[test]
fn claude_codes_credentials_give_a_refreshable_subscription_with_its_identity_and_plan() {
    let entry = one("claude-credentials.json");
    let sign_in = &entry.sign_in;
    assert_eq!(
        (sign_in.platform, sign_in.kind),
        (Platform::Anthropic, CredentialKind::OAuth)
    );
    assert_eq!(
        sign_in.access_token.expose(),
        "sk-ant-oat01-fixture-claude-code-access"
    );
    assert_eq!(
        sign_in.refresh_token.expose(),
        "sk-ant-ort01-fixture-claude-code-refresh"
    );
    assert_eq!(
        sign_in.expires_at_ms, 1_796_390_400_000,
        "expiresAt is in ms"
    );
    assert_eq!(
        sign_in.identity.upstream_id,
        "0b1c0000-0000-4000-8000-000000000001/0b1c0000-0000-4000-8000-0000000000a1"
    );
    assert_eq!(sign_in.identity.plan, "max");
    assert!(!entry.needs_profile);
    // Without the uuids the file does not say who it is: the profile is asked.
    let bare = parse(
        "bare.json",
        &serde_json::json!({"claudeAiOauth": {"accessToken": "a", "refreshToken": "r", "expiresAt": 1}}),
    );
    assert!(matches!(&bare[0], Ok(entry) if entry.needs_profile));
}

#[test]
fn codex_auth_gives_a_chatgpt_subscription_or_an_api_key() {
    let entry = one("codex-auth.json");
    let sign_in = &entry.sign_in;
    assert_eq!(sign_in.kind, CredentialKind::ChatGptOAuth);
    assert_eq!(sign_in.identity.upstream_id, "user-fixture-1/acc-fixture-1");
    assert_eq!(sign_in.identity.email, "lin@example.com");
    assert_eq!(sign_in.identity.plan, "plus");
    assert_eq!(
        sign_in.expires_at_ms, 1_796_390_400_000,
        "the access token's exp"
    );
    let key = one("codex-auth-api-key.json");
    assert_eq!(key.sign_in.kind, CredentialKind::ApiKey);
    assert!(key.sign_in.identity.upstream_id.starts_with("key:"));
    assert!(
        !key.sign_in.identity.upstream_id.contains("fixture"),
        "a fingerprint, not the key"
    );
}

#[test]
fn cli_proxy_files_are_told_apart_by_their_type() {
    let claude = one("cliproxy-claude-mo@example.com.json");
    assert_eq!(claude.sign_in.identity.email, "mo@example.com");
    assert_eq!(
        claude.sign_in.expires_at_ms,
        "2026-12-05T01:00:00Z"
            .parse::<jiff::Timestamp>()
            .expect("instant")
            .as_millisecond()
    );
    assert!(!claude.needs_profile);
    let codex = one("cliproxy-codex-noor@example.com-pro.json");
    assert_eq!(
        codex.sign_in.identity.upstream_id,
        "user-fixture-2/acc-fixture-2"
    );
    assert_eq!(codex.sign_in.identity.plan, "pro");
    let gemini = entries("cliproxy-gemini.json");
    assert!(
        matches!(&gemini[0], Err((_, why)) if why.contains("gemini")),
        "only claude and codex are pooled"
    );
}

#[test]
fn a_sub2api_export_keeps_limits_proxy_and_mapping_and_reports_what_it_cannot_pool() {
    let all = entries("sub2api-export.json");
    assert_eq!(all.len(), 4);
    let max = all[0].as_ref().expect("the oauth account");
    assert_eq!(
        max.position,
        format!("{}: accounts[0]", fixture("sub2api-export.json").display())
    );
    assert_eq!(max.sign_in.name.as_deref(), Some("max-1"));
    assert_eq!(
        max.sign_in.expires_at_ms, 1_796_390_400_000,
        "expires_at is in s"
    );
    assert_eq!(max.sign_in.settings.concurrency_limit, Some(3));
    assert_eq!(max.sign_in.settings.priority, Some(5));
    assert_eq!(
        max.sign_in.settings.proxy_url.as_deref(),
        Some("socks5://pu:pp@10.0.0.7:1080")
    );
    assert_eq!(
        max.sign_in
            .settings
            .model_mapping
            .as_ref()
            .and_then(|m| m.get("claude-latest"))
            .map(String::as_str),
        Some("claude-opus-5-5")
    );
    let setup = all[1].as_ref().expect("the setup-token account");
    assert!(
        setup.sign_in.refresh_token.is_empty(),
        "a setup token has none"
    );
    assert_eq!(
        setup.sign_in.expires_at_ms, 1_827_926_400_000,
        "a numeric string"
    );
    assert!(
        matches!(&all[2], Err((position, why)) if position.ends_with("accounts[2]") && why.contains("gemini"))
    );
    let key = all[3].as_ref().expect("the key");
    assert_eq!(key.sign_in.kind, CredentialKind::ApiKey);
    assert_eq!(
        key.sign_in.base_url.as_deref(),
        Some("https://api.openai.com")
    );
}

#[test]
fn a_relay_service_export_is_read_only_decrypted_and_unsanitized() {
    let all = entries("crs-export.json");
    assert_eq!(all.len(), 2);
    let kai = all[0].as_ref().expect("the account");
    assert_eq!(
        kai.sign_in.access_token.expose(),
        "sk-ant-oat01-fixture-crs"
    );
    assert_eq!(kai.sign_in.identity.email, "kai@example.com");
    assert_eq!(kai.sign_in.settings.priority, Some(50));
    assert_eq!(
        kai.sign_in.settings.proxy_url.as_deref(),
        Some("http://10.0.0.8:3128")
    );
    assert!(kai.needs_profile, "the export names no account uuid");
    assert!(matches!(&all[1], Err((position, _)) if position.ends_with("claudeAccounts[1]")));
    assert!(
        matches!(&entries("crs-export-sanitized.json")[0], Err((_, why)) if why.contains("sanitized"))
    );
    assert!(
        matches!(&entries("crs-export-encrypted.json")[0], Err((_, why)) if why.contains("--decrypt=true"))
    );
}

#[test]
fn a_file_that_is_no_credential_file_is_refused_without_quoting_it() {
    let scratch = std::env::temp_dir().join(format!("poolgate-import-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("dir");
    let broken = scratch.join("broken.json");
    std::fs::write(&broken, "{\"accessToken\": \"sk-ant-oat01-secret\" oops").expect("write");
    let refused = read_file(&broken);
    assert!(
        matches!(&refused[0], Err((_, why)) if why.starts_with("not JSON") && !why.contains("secret"))
    );
    let other = scratch.join("other.json");
    std::fs::write(&other, "{\"hello\": 1}").expect("write");
    assert!(matches!(&read_file(&other)[0], Err((_, why)) if why.contains("not a format")));
    let missing = read_file(&scratch.join("missing.json"));
    assert!(matches!(&missing[0], Err((_, why)) if why.contains("cannot be read")));
}
