//! The standalone relay's state file holds OAuth tokens in clear: it is written through a fresh
//! temporary file created exclusively beside it, so a symlink planted at any path a writer could
//! be predicted to use is never followed, and the file ends up its owner's only.
#![cfg(unix)]

use std::collections::HashMap;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::PathBuf;

use poolgate_core::Clock;
use poolgate_core::account::{
    Account, AccountStatus, CredentialKind, OAuthState, Platform, Secret,
};
use poolgate_core::now_ms;
use poolgate_select::snapshot::Snapshot;
use poolgate_select::source::{AccountSource, MemorySource, StateFile};
use poolgate_testkit::Scratch;

fn subscription() -> Account {
    Account {
        serves: Vec::new(),
        id: 1,
        name: "acct-1".into(),
        group: "g".into(),
        platform: Platform::Anthropic,
        base_url: "http://127.0.0.1:9".into(),
        credential_kind: CredentialKind::OAuth,
        credential: Secret::new("config-access"),
        oauth: Some(OAuthState {
            refresh_token: Secret::new("config-refresh"),
            expires_at_ms: now_ms() + 3_600_000,
            token_url: "http://127.0.0.1:9/token".into(),
            client_id: String::new(),
        }),
        status: AccountStatus::Active,
        status_reason: String::new(),
        priority: 0,
        weight: 1,
        concurrency_limit: 5,
        rpm_limit: 0,
        session_window_limit_usd: 0.0,
        allowed_models: vec![],
        model_mapping: HashMap::new(),
        proxy_url: None,
        probe_model: None,
        stream_usage: true,
        identity: Default::default(),
    }
}

#[tokio::test]
async fn symlinks_planted_at_predictable_temporary_paths_are_not_followed() {
    let scratch = Scratch::new("state-file-links").expect("scratch");
    let elsewhere = Scratch::new("state-file-victim").expect("scratch");
    let victim = elsewhere.path().join("victim");
    std::fs::write(&victim, "untouched").expect("victim");
    let dangling = elsewhere.path().join("created-through-a-link");

    // Every name a writer could be guessed to use: this process's pid-named temporary (the
    // earlier releases' path), its neighbours, and the obvious fixed names.
    let pid = std::process::id();
    let mut planted: Vec<(PathBuf, &PathBuf)> = Vec::new();
    for name in [
        format!(".state.json.tmp-{pid}"),
        format!(".state.json.tmp-{}", pid + 1),
        ".state.json.tmp".to_owned(),
        "state.json.tmp".to_owned(),
        "state.json~".to_owned(),
    ] {
        planted.push((scratch.path().join(name), &victim));
    }
    planted.push((scratch.path().join(".state.json.new"), &dangling));
    for (link, target) in &planted {
        symlink(target, link).expect("plant");
    }

    let file = StateFile::new(scratch.path().join("state.json"));
    let source = MemorySource::new(
        Snapshot::new(
            vec!["g".into()],
            vec![subscription()],
            HashMap::new(),
            HashMap::new(),
        ),
        Some(file.clone()),
        Clock::system(),
    )
    .expect("source");
    source
        .store_tokens(
            1,
            &Secret::new("fresh-access-token"),
            &Secret::new("fresh-refresh-token"),
            4_000_000_000_000,
        )
        .await
        .expect("stored");
    drop(source);

    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "untouched",
        "a planted symlink was followed"
    );
    assert!(
        !dangling.exists(),
        "a file was created through a dangling symlink"
    );
    for (link, _) in &planted {
        let meta = std::fs::symlink_metadata(link).expect("still there");
        assert!(meta.file_type().is_symlink(), "{} replaced", link.display());
    }

    let meta = std::fs::symlink_metadata(file.path()).expect("state file");
    assert!(meta.file_type().is_file(), "a regular file");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "owner only");
    let text = std::fs::read_to_string(file.path()).expect("state file");
    assert!(
        text.contains("fresh-access-token") && text.contains("fresh-refresh-token"),
        "the state file holds the refreshed tokens: {text}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(scratch.path())
        .expect("dir")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path != file.path() && !planted.iter().any(|(link, _)| link == path))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    // A restart reads what was written.
    let restarted = MemorySource::new(
        Snapshot::new(
            vec!["g".into()],
            vec![subscription()],
            HashMap::new(),
            HashMap::new(),
        ),
        Some(file),
        Clock::system(),
    )
    .expect("restarted");
    let account = restarted.load_account(1).await.expect("account");
    assert_eq!(account.credential.expose(), "fresh-access-token");
}
