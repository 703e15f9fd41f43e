//! The in-memory account source (the relay's standalone mode) and its state file: what the
//! engine writes shows in the next snapshot, and refreshed tokens, status changes and usage
//! survive a restart; the file is written atomically, readable by its owner only, and nothing
//! prints a credential.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use poolgate_core::Clock;
use poolgate_core::account::{
    Account, AccountStatus, ApiKeyRecord, CredentialKind, OAuthState, Platform, Secret,
};
use poolgate_core::hex;
use poolgate_core::keys::KeyUpdate;
use poolgate_core::lease::Settings;
use poolgate_core::{AccountId, now_ms};
use poolgate_select::crypto::api_key_hash;
use poolgate_select::health::InProcessHealth;
use poolgate_select::metrics::Metrics;
use poolgate_select::refresh::{RefreshResult, RefreshSettings, TokenRefresher};
use poolgate_select::snapshot::{Snapshot, SnapshotCell};
use poolgate_select::source::{
    AccountSource, AdminStore, MemorySource, StateFile, StoreError, UsageInput,
};
use poolgate_testkit::fake_upstream::FakeUpstream;
use poolgate_testkit::{Scratch, eventually};

fn account(id: AccountId, tweak: impl FnOnce(&mut Account)) -> Account {
    let mut account = Account {
        serves: Vec::new(),
        id,
        name: format!("acct-{id}"),
        group: "g".into(),
        platform: Platform::Anthropic,
        base_url: "http://127.0.0.1:9".into(),
        credential_kind: CredentialKind::ApiKey,
        credential: Secret::new(format!("sk-ant-{id}-secret-credential")),
        oauth: None,
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
    };
    tweak(&mut account);
    account
}

fn subscription(id: AccountId, access: &str, refresh: &str, token_url: &str) -> Account {
    account(id, |a| {
        a.credential_kind = CredentialKind::OAuth;
        a.credential = Secret::new(access);
        a.oauth = Some(OAuthState {
            refresh_token: Secret::new(refresh),
            expires_at_ms: now_ms() + 3_600_000,
            token_url: token_url.into(),
            client_id: String::new(),
        });
    })
}

/// The config as the relay would build it from its file.
fn config(accounts: Vec<Account>) -> Snapshot {
    let mut keys = HashMap::new();
    keys.insert(
        api_key_hash("client-key-1"),
        ApiKeyRecord {
            id: 1,
            name: "k1".into(),
            prefix: "client-k".into(),
            user: "alice".into(),
            group: "g".into(),
            user_rpm_limit: 0,
            limits: Default::default(),
            active: true,
            access: Default::default(),
        },
    );
    Snapshot::new(vec!["g".into()], accounts, keys, HashMap::new())
}

fn state_in(scratch: &Scratch) -> StateFile {
    StateFile::new(scratch.path().join("state.json"))
}

#[tokio::test]
async fn refreshed_tokens_survive_a_restart_and_the_file_is_the_owners_only() {
    let scratch = Scratch::new("memory-source").expect("scratch");
    let file = state_in(&scratch);
    let accounts = || {
        vec![
            subscription(
                1,
                "config-access",
                "config-refresh",
                "http://127.0.0.1:9/token",
            ),
            account(2, |_| {}),
        ]
    };
    let source =
        MemorySource::new(config(accounts()), Some(file.clone()), Clock::system()).expect("source");
    source
        .store_tokens(
            1,
            &Secret::new("fresh-access"),
            &Secret::new("fresh-refresh"),
            4_000_000_000_000,
        )
        .await
        .expect("stored");
    let live = source.load_account(1).await.expect("account");
    assert_eq!(live.credential.expose(), "fresh-access");
    drop(source);

    let restarted =
        MemorySource::new(config(accounts()), Some(file.clone()), Clock::system()).expect("source");
    let account = restarted.load_account(1).await.expect("account");
    assert_eq!(account.credential.expose(), "fresh-access");
    let oauth = account.oauth.as_ref().expect("oauth");
    assert_eq!(oauth.refresh_token.expose(), "fresh-refresh");
    assert_eq!(oauth.expires_at_ms, 4_000_000_000_000);
    assert_eq!(
        oauth.token_url, "http://127.0.0.1:9/token",
        "the rest comes from the config"
    );
    assert_eq!(
        restarted
            .load_account(2)
            .await
            .expect("account")
            .credential
            .expose(),
        "sk-ant-2-secret-credential"
    );
    let snapshot = restarted.load_snapshot().await.expect("snapshot");
    assert_eq!(
        snapshot.account(1).expect("account").credential.expose(),
        "fresh-access",
        "the snapshot serves the refreshed token"
    );
    let printed = format!("{snapshot:?} {account:?} {file:?}");
    for secret in ["fresh-access", "fresh-refresh", "sk-ant-2-secret"] {
        assert!(!printed.contains(secret), "{secret} printed: {printed}");
    }

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(file.path())
            .expect("state file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(scratch.path())
        .expect("dir")
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name != "state.json")
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[tokio::test]
async fn a_config_that_names_another_credential_wins_over_tokens_refreshed_from_the_old_one() {
    let scratch = Scratch::new("memory-source").expect("scratch");
    let file = state_in(&scratch);
    let source = MemorySource::new(
        config(vec![subscription(1, "old-login", "old-refresh", "")]),
        Some(file.clone()),
        Clock::system(),
    )
    .expect("source");
    source
        .store_tokens(1, &Secret::new("refreshed"), &Secret::new("rotated"), 1)
        .await
        .expect("stored");
    // The operator signed in again and put the new login in the config.
    let restarted = MemorySource::new(
        config(vec![subscription(1, "new-login", "new-refresh", "")]),
        Some(file),
        Clock::system(),
    )
    .expect("source");
    let account = restarted.load_account(1).await.expect("account");
    assert_eq!(account.credential.expose(), "new-login");
    assert_eq!(
        account.oauth.expect("oauth").refresh_token.expose(),
        "new-refresh"
    );
}

#[tokio::test]
async fn status_changes_survive_a_restart_and_a_restore_hands_the_account_back_to_the_config() {
    let scratch = Scratch::new("memory-source").expect("scratch");
    let file = state_in(&scratch);
    let accounts = || {
        vec![
            account(1, |_| {}),
            account(2, |_| {}),
            account(3, |a| a.status = AccountStatus::Disabled),
        ]
    };
    let source =
        MemorySource::new(config(accounts()), Some(file.clone()), Clock::system()).expect("source");
    source
        .set_status(1, AccountStatus::Retired, "quota gone: confirmed by probe")
        .await
        .expect("retired");
    source
        .set_status(2, AccountStatus::Error, "3 unauthorized outcomes")
        .await
        .expect("error");
    assert!(matches!(
        source.set_status(99, AccountStatus::Retired, "x").await,
        Err(StoreError::NotFound(_))
    ));
    let restarted =
        MemorySource::new(config(accounts()), Some(file.clone()), Clock::system()).expect("source");
    let retired = restarted.load_account(1).await.expect("account");
    assert_eq!(retired.status, AccountStatus::Retired);
    assert_eq!(retired.status_reason, "quota gone: confirmed by probe");
    assert_eq!(
        restarted.load_account(2).await.expect("account").status,
        AccountStatus::Error
    );
    assert_eq!(
        restarted.load_account(3).await.expect("account").status,
        AccountStatus::Disabled
    );
    restarted
        .set_status(1, AccountStatus::Active, "restored by operator")
        .await
        .expect("restored");
    assert_eq!(
        restarted.load_account(1).await.expect("account").status,
        AccountStatus::Active
    );
    drop(restarted);
    // The config says active again, and the config is in charge of it again.
    let again =
        MemorySource::new(config(accounts()), Some(file.clone()), Clock::system()).expect("source");
    assert_eq!(
        again.load_account(1).await.expect("account").status,
        AccountStatus::Active
    );
    assert_eq!(
        again.load_account(2).await.expect("account").status,
        AccountStatus::Error
    );
    let text = std::fs::read_to_string(file.path()).expect("state file");
    let saved: serde_json::Value = serde_json::from_str(&text).expect("json");
    let statuses = saved["statuses"].as_object().expect("statuses");
    assert_eq!(
        statuses.keys().collect::<Vec<_>>(),
        vec!["acct-2"],
        "only what differs from the config, by account name: {text}"
    );
}

#[tokio::test]
async fn entries_of_accounts_the_config_does_not_name_are_ignored_and_kept() {
    let scratch = Scratch::new("memory-source").expect("scratch");
    let file = state_in(&scratch);
    let source = MemorySource::new(
        config(vec![
            subscription(1, "a", "r", ""),
            subscription(7, "b", "s", ""),
        ]),
        Some(file.clone()),
        Clock::system(),
    )
    .expect("source");
    source
        .store_tokens(7, &Secret::new("b2"), &Secret::new("s2"), 1)
        .await
        .expect("stored");
    source
        .set_status(7, AccountStatus::Retired, "gone")
        .await
        .expect("retired");
    drop(source);
    // Account 7 left the config for now.
    let without = MemorySource::new(
        config(vec![subscription(1, "a", "r", "")]),
        Some(file.clone()),
        Clock::system(),
    )
    .expect("loads despite entries for an unknown account");
    assert!(without.load_account(7).await.is_err());
    assert_eq!(
        without
            .load_account(1)
            .await
            .expect("account")
            .credential
            .expose(),
        "a"
    );
    without
        .store_tokens(1, &Secret::new("a2"), &Secret::new("r2"), 1)
        .await
        .expect("stored");
    drop(without);
    // Back in the config: its tokens and status were kept.
    let back = MemorySource::new(
        config(vec![
            subscription(1, "a", "r", ""),
            subscription(7, "b", "s", ""),
        ]),
        Some(file),
        Clock::system(),
    )
    .expect("source");
    let seven = back.load_account(7).await.expect("account");
    assert_eq!(
        (seven.credential.expose(), seven.status),
        ("b2", AccountStatus::Retired)
    );
    assert_eq!(
        back.load_account(1)
            .await
            .expect("account")
            .credential
            .expose(),
        "a2"
    );
}

fn usage(api_key_id: Option<i64>, at_ms: i64, tokens: i64, cost_usd: f64) -> UsageInput {
    UsageInput {
        api_key_id,
        user: "alice".into(),
        account_id: Some(1),
        model: "claude-sonnet".into(),
        input_tokens: tokens,
        output_tokens: 2 * tokens,
        cost_usd,
        price_source: None,
        status: 200,
        at_ms: Some(at_ms),
        ..UsageInput::default()
    }
}

#[tokio::test]
async fn the_usage_ledger_sums_a_keys_hours_in_range_and_survives_a_restart() {
    let scratch = Scratch::new("memory-source").expect("scratch");
    let file = state_in(&scratch);
    let source = MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(file.clone()),
        Clock::system(),
    )
    .expect("source");
    let hour = 3_600_000;
    let base = 1_700_000_000_000 / hour * hour;
    let accepted = source
        .insert_usage(&[
            usage(Some(1), base + 10, 10, 0.5),
            usage(Some(1), base + 20, 20, 0.25),
            usage(Some(1), base + hour + 5, 1, 1.0),
            usage(Some(2), base + 30, 100, 9.0),
            usage(None, base + 40, 1000, 9.0),
        ])
        .await
        .expect("taken");
    assert_eq!(accepted, 5);
    let both = source
        .read_usage(1, base, base + 2 * hour)
        .await
        .expect("read");
    assert_eq!(
        (both.requests, both.input_tokens, both.output_tokens),
        (3, 31, 62)
    );
    assert!((both.cost_usd - 1.75).abs() < 1e-9, "{both:?}");
    let first = source.read_usage(1, base, base + hour).await.expect("read");
    assert_eq!(first.requests, 2, "the hour that starts in the range");
    assert_eq!(
        source
            .read_usage(1, base + hour, base)
            .await
            .expect("read")
            .requests,
        0,
        "an empty range"
    );
    assert_eq!(
        source
            .read_usage(2, base, base + hour)
            .await
            .expect("read")
            .requests,
        1
    );
    source.flush().await.expect("flushed");
    drop(source);
    let restarted = MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(file),
        Clock::system(),
    )
    .expect("source");
    let kept = restarted
        .read_usage(1, base, base + 2 * hour)
        .await
        .expect("read");
    assert_eq!(kept, both);
    // Usage now (no time given) is counted in the current hour.
    restarted
        .insert_usage(&[UsageInput {
            at_ms: None,
            ..usage(Some(1), 0, 1, 0.0)
        }])
        .await
        .expect("taken");
    let now = now_ms();
    assert_eq!(
        restarted
            .read_usage(1, now - 24 * hour, now + 1)
            .await
            .expect("read")
            .requests,
        1
    );
}

/// Usage the source took is taken once, even when the state file cannot be written at that
/// moment: the call answers what it took (a caller that saw an error would send the records
/// again and count them twice), and the file gets them at a later write.
#[tokio::test(start_paused = true)]
async fn usage_taken_while_the_state_file_cannot_be_written_is_not_an_error_and_counts_once() {
    let scratch = Scratch::new("usage-unwritable").expect("scratch");
    let file = StateFile::new(scratch.path().join("no-such-directory").join("state.json"));
    let source = MemorySource::new(
        two_keys(vec![account(1, |_| {})], 1, 2),
        Some(file),
        Clock::system(),
    )
    .expect("source");
    // Past the write interval: this insert writes the file, and the write fails.
    tokio::time::advance(Duration::from_secs(10)).await;
    let hour = 3_600_000;
    let base = 1_700_000_000_000 / hour * hour;
    let taken = source.insert_usage(&[usage(Some(1), base, 10, 1.0)]).await;
    assert_eq!(taken.ok(), Some(1), "taken, to be written later");
    let totals = source.read_usage(1, base, base + hour).await.expect("read");
    assert_eq!(totals.requests, 1);
    assert!(
        source.flush().await.is_err(),
        "the file is still unwritable"
    );
}

/// A config with two client keys, `client-key-a` and `client-key-b`, with the ids given.
fn two_keys(accounts: Vec<Account>, a: i64, b: i64) -> Snapshot {
    let record = |id: i64| ApiKeyRecord {
        id,
        name: format!("api_keys[{}]", id - 1),
        prefix: "client-k".into(),
        user: "alice".into(),
        group: "g".into(),
        user_rpm_limit: 0,
        limits: Default::default(),
        active: true,
        access: Default::default(),
    };
    let keys = HashMap::from([
        (api_key_hash("client-key-a"), record(a)),
        (api_key_hash("client-key-b"), record(b)),
    ]);
    Snapshot::new(vec!["g".into()], accounts, keys, HashMap::new())
}

#[tokio::test]
async fn a_config_whose_entries_moved_applies_each_saved_entry_to_its_own_account_and_key() {
    let scratch = Scratch::new("memory-source").expect("scratch");
    let file = state_in(&scratch);
    let named = |id: AccountId, name: &'static str| account(id, move |a| a.name = name.into());
    let source = MemorySource::new(
        two_keys(vec![named(1, "alpha"), named(2, "beta")], 1, 2),
        Some(file.clone()),
        Clock::system(),
    )
    .expect("source");
    source
        .set_status(2, AccountStatus::Retired, "quota gone")
        .await
        .expect("retired");
    let hour = 3_600_000;
    let base = 1_700_000_000_000 / hour * hour;
    source
        .insert_usage(&[usage(Some(1), base, 10, 1.0)])
        .await
        .expect("taken");
    source.flush().await.expect("flushed");
    drop(source);
    // The operator put a new account and a new key first: every id moved by one.
    let moved = MemorySource::new(
        two_keys(
            vec![named(1, "gamma"), named(2, "alpha"), named(3, "beta")],
            2,
            3,
        ),
        Some(file.clone()),
        Clock::system(),
    )
    .expect("source");
    let moved = &moved;
    let status = |id| async move { moved.load_account(id).await.expect("account").status };
    assert_eq!(
        status(3).await,
        AccountStatus::Retired,
        "beta stays retired"
    );
    assert_eq!(
        status(2).await,
        AccountStatus::Active,
        "alpha was never retired"
    );
    assert_eq!(status(1).await, AccountStatus::Active, "the new account");
    let read = |id| async move {
        moved
            .read_usage(id, base, base + hour)
            .await
            .expect("read")
            .requests
    };
    assert_eq!(read(2).await, 1, "key a's usage follows key a");
    assert_eq!(read(1).await, 0, "nothing on the id key a had before");
}

#[tokio::test]
async fn a_state_file_of_the_first_format_is_read_by_id_and_written_back_by_name() {
    let scratch = Scratch::new("memory-source").expect("scratch");
    let file = state_in(&scratch);
    let hour = 3_600_000;
    let base = 1_700_000_000_000 / hour * hour;
    std::fs::write(
        file.path(),
        format!(
            r#"{{"statuses": {{"2": {{"status": "retired", "reason": "quota gone"}}}},
                "usage": [{{"api_key_id": 1, "hour_start_ms": {base}, "requests": 4,
                            "input_tokens": 1, "output_tokens": 2, "cost_usd": 0.5}}]}}"#
        ),
    )
    .expect("old file");
    let source = MemorySource::new(
        config(vec![account(1, |_| {}), account(2, |_| {})]),
        Some(file.clone()),
        Clock::system(),
    )
    .expect("source");
    assert_eq!(
        source.load_account(2).await.expect("account").status,
        AccountStatus::Retired
    );
    assert_eq!(
        source
            .read_usage(1, base, base + hour)
            .await
            .expect("read")
            .requests,
        4
    );
    source
        .set_status(1, AccountStatus::Error, "unauthorized")
        .await
        .expect("written");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file.path()).expect("file")).expect("json");
    assert_eq!(saved["format"], 1);
    let mut names: Vec<_> = saved["statuses"]
        .as_object()
        .expect("statuses")
        .keys()
        .cloned()
        .collect();
    names.sort();
    assert_eq!(names, ["acct-1", "acct-2"]);
    assert_eq!(
        saved["usage"][0]["key"],
        hex(&api_key_hash("client-key-1")),
        "usage names its key by hash"
    );
}

#[tokio::test]
async fn a_state_file_of_a_newer_format_stops_the_start() {
    let scratch = Scratch::new("memory-source").expect("scratch");
    let file = state_in(&scratch);
    std::fs::write(file.path(), r#"{"format": 99}"#).expect("file");
    let error = MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(file),
        Clock::system(),
    )
    .err()
    .expect("refused");
    assert!(error.to_string().contains("format 99"), "{error}");
}

#[tokio::test]
async fn an_unreadable_state_file_stops_the_start_without_printing_its_content() {
    let scratch = Scratch::new("memory-source").expect("scratch");
    let file = state_in(&scratch);
    std::fs::write(
        file.path(),
        r#"{"tokens": {"1": {"access_token": "leaked-secret-token", "refresh_token": 5}}}"#,
    )
    .expect("written");
    let error = match MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(file),
        Clock::system(),
    ) {
        Ok(_) => panic!("a damaged state file must not be skipped"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("state.json"), "{error}");
    assert!(!error.contains("leaked-secret-token"), "{error}");
    // No state file yet is a fresh start.
    let fresh = MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(StateFile::new(scratch.path().join("none-yet.json"))),
        Clock::system(),
    );
    assert!(fresh.is_ok());
}

#[tokio::test]
async fn a_state_file_that_cannot_be_written_is_an_error_but_the_change_is_served() {
    let scratch = Scratch::new("memory-source").expect("scratch");
    let file = StateFile::new(scratch.path().join("missing-dir").join("state.json"));
    let source = MemorySource::new(
        config(vec![subscription(1, "a", "r", "")]),
        Some(file),
        Clock::system(),
    )
    .expect("source");
    let stored = source
        .store_tokens(1, &Secret::new("a2"), &Secret::new("r2"), 1)
        .await;
    assert!(
        matches!(stored, Err(StoreError::StateFile(_))),
        "{stored:?}"
    );
    assert_eq!(
        source
            .load_account(1)
            .await
            .expect("account")
            .credential
            .expose(),
        "a2"
    );
}

#[tokio::test]
async fn the_snapshot_cell_follows_the_sources_changes() {
    let source = Arc::new(
        MemorySource::new(config(vec![account(1, |_| {})]), None, Clock::system()).expect("source"),
    );
    let cell = Arc::new(SnapshotCell::new(source.snapshot()));
    let follow = tokio::spawn(source.clone().reload_on_change(cell.clone()));
    source
        .set_status(1, AccountStatus::Retired, "gone")
        .await
        .expect("retired");
    eventually(Duration::from_secs(3), || async {
        (cell.get().account(1)?.status == AccountStatus::Retired).then_some(())
    })
    .await
    .expect("the cell shows the retirement");
    assert!(
        cell.get().api_key(&api_key_hash("client-key-1")).is_some(),
        "the config's keys stay"
    );
    follow.abort();
}

fn refresher(source: Arc<MemorySource>) -> TokenRefresher {
    let admission = poolgate_lease::in_memory(
        Settings::default(),
        poolgate_lease::metrics::Metrics::new(),
        Clock::system(),
    );
    TokenRefresher::new(
        source,
        Arc::new(InProcessHealth::new(admission, Clock::system())),
        RefreshSettings::default(),
        Metrics::new(),
        Clock::system(),
    )
    .expect("refresher")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_refreshed_and_restarted_refreshes_again_with_the_rotated_token() {
    let scratch = Scratch::new("memory-source").expect("scratch");
    let file = state_in(&scratch);
    // The fake upstream's token endpoint: a refresh token works once; `refresh-1` becomes
    // `refresh-1-access`, rotated to `refresh-1-next`.
    let upstream = FakeUpstream::start().await.expect("fake upstream starts");
    let url = format!("{}/oauth/token", upstream.base_url);
    let accounts = || vec![subscription(1, "config-access", "refresh-1", &url)];
    let source = Arc::new(
        MemorySource::new(config(accounts()), Some(file.clone()), Clock::system()).expect("source"),
    );
    let refused = Secret::new("config-access");
    assert_eq!(
        refresher(source.clone())
            .refresh_refused(1, &refused)
            .await
            .expect("refreshed"),
        RefreshResult::Refreshed
    );
    drop(source);
    // Restarted with the config's token, whose refresh token the endpoint already took.
    let source = Arc::new(
        MemorySource::new(config(accounts()), Some(file), Clock::system()).expect("source"),
    );
    let account = source.load_account(1).await.expect("account");
    assert_eq!(account.credential.expose(), "refresh-1-access");
    assert_eq!(
        refresher(source.clone())
            .refresh(1, true)
            .await
            .expect("the rotated refresh token works"),
        RefreshResult::Refreshed
    );
    assert_eq!(
        source
            .load_account(1)
            .await
            .expect("account")
            .credential
            .expose(),
        "refresh-1-next-access"
    );
    let used: Vec<_> = upstream
        .token_requests()
        .iter()
        .map(|request| request["refresh_token"].clone())
        .collect();
    assert_eq!(
        used,
        ["refresh-1", "refresh-1-next"],
        "each refresh token once"
    );
}

#[tokio::test]
async fn a_key_disable_survives_a_restart_by_the_keys_hash_and_an_enable_hands_back_to_the_config()
{
    let scratch = Scratch::new("memory-source").expect("scratch");
    let file = state_in(&scratch);
    let disabled = |source: &MemorySource, key: &str| {
        source
            .snapshot()
            .api_key(&api_key_hash(key))
            .expect("configured")
            .access
            .disabled
    };
    // Key b is disabled in the config itself.
    let with_b_disabled = |a: i64, b: i64| {
        let snapshot = two_keys(vec![account(1, |_| {})], a, b);
        let mut keys = HashMap::new();
        for (hash, record) in snapshot.api_key_hashes() {
            let mut record = record.clone();
            record.access.disabled = hash == api_key_hash("client-key-b").as_slice();
            keys.insert(hash.to_vec(), record);
        }
        Snapshot::new(
            vec!["g".into()],
            vec![account(1, |_| {})],
            keys,
            HashMap::new(),
        )
    };
    let source = MemorySource::new(with_b_disabled(1, 2), Some(file.clone()), Clock::system())
        .expect("source");
    let changes = source.changes();
    let record = source.set_key_disabled(1, true).await.expect("disabled");
    assert!(record.access.disabled && record.id == 1);
    assert!(disabled(&source, "client-key-a"), "served at once");
    assert!(
        changes.has_changed().expect("open"),
        "the engine reloads on it"
    );
    source.set_key_disabled(2, false).await.expect("enabled");
    assert!(!disabled(&source, "client-key-b"));
    assert!(matches!(
        source.set_key_disabled(9, true).await,
        Err(StoreError::NotFound(_))
    ));
    // Written at once (no flush): a crash right after keeps it.
    let saved = std::fs::read_to_string(file.path()).expect("written");
    let saved: serde_json::Value = serde_json::from_str(&saved).expect("json");
    assert_eq!(
        saved["keys"][hex(&api_key_hash("client-key-a"))]["disabled"],
        true
    );
    drop(source);

    // Restarted with every key moved by one: each change follows its key.
    let moved = MemorySource::new(with_b_disabled(2, 3), Some(file.clone()), Clock::system())
        .expect("source");
    assert!(disabled(&moved, "client-key-a"), "a stays disabled");
    assert!(
        !disabled(&moved, "client-key-b"),
        "b stays enabled over the config"
    );
    // Back to what the config says: the file keeps nothing for them any more.
    moved.set_key_disabled(2, false).await.expect("enabled");
    moved.set_key_disabled(3, true).await.expect("disabled");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file.path()).expect("written"))
            .expect("json");
    assert!(saved.get("keys").is_none(), "{saved}");
    drop(moved);
    let again =
        MemorySource::new(with_b_disabled(1, 2), Some(file), Clock::system()).expect("source");
    assert!(!disabled(&again, "client-key-a"));
    assert!(
        disabled(&again, "client-key-b"),
        "the config's disable again"
    );
}

#[tokio::test]
async fn a_key_disable_of_a_key_the_config_no_longer_lists_is_kept_for_when_it_returns() {
    let scratch = Scratch::new("memory-source").expect("scratch");
    let file = state_in(&scratch);
    let source = MemorySource::new(
        two_keys(vec![account(1, |_| {})], 1, 2),
        Some(file.clone()),
        Clock::system(),
    )
    .expect("source");
    source.set_key_disabled(2, true).await.expect("disabled");
    drop(source);
    // Key b left the config for a while; a status write rewrites the file meanwhile.
    let without_b = MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(file.clone()),
        Clock::system(),
    )
    .expect("source");
    without_b
        .set_status(1, AccountStatus::Disabled, "x")
        .await
        .expect("status");
    drop(without_b);
    let back = MemorySource::new(
        two_keys(vec![account(1, |_| {})], 1, 2),
        Some(file),
        Clock::system(),
    )
    .expect("source");
    let record = back
        .snapshot()
        .api_key(&api_key_hash("client-key-b"))
        .cloned()
        .expect("configured");
    assert!(record.access.disabled, "b is disabled again");
}

/// The operator's key write (`AdminStore::update_api_key`, what the engine's admin API calls)
/// changes a standalone key's disable and refuses, naming the field and changing nothing, what
/// only the config file sets; the list is by id.
#[tokio::test]
async fn a_standalone_key_update_changes_its_disable_and_refuses_the_rest() {
    let source = MemorySource::new(
        two_keys(vec![account(1, |_| {})], 2, 1),
        None,
        Clock::system(),
    )
    .expect("source");
    let listed: Vec<i64> = AdminStore::list_api_keys(&source)
        .await
        .expect("listed")
        .iter()
        .map(|key| key.id)
        .collect();
    assert_eq!(listed, [1, 2]);
    let disable = KeyUpdate {
        disabled: Some(true),
        ..KeyUpdate::default()
    };
    let record = AdminStore::update_api_key(&source, 1, &disable)
        .await
        .expect("disabled");
    assert!(record.access.disabled);
    let models = KeyUpdate {
        disabled: Some(false),
        allowed_models: Some(vec!["claude-*".into()]),
        ..KeyUpdate::default()
    };
    match AdminStore::update_api_key(&source, 1, &models).await {
        Err(StoreError::Invalid { field, .. }) => assert_eq!(field, "update"),
        other => panic!("refused, not {other:?}"),
    }
    let after = source
        .snapshot()
        .api_key(&api_key_hash("client-key-b"))
        .expect("configured")
        .clone();
    assert!(
        after.access.disabled && after.access.allowed_models.is_empty(),
        "the refused update changed nothing"
    );
    assert!(matches!(
        AdminStore::update_api_key(&source, 9, &disable).await,
        Err(StoreError::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_without_a_refresh_token_is_never_sent_to_the_token_endpoint() {
    // Claude Code's `setup-token`: a year-long token and no refresh token. Due, forced or
    // refused, there is nothing to refresh with: no call that could only fail.
    let upstream = FakeUpstream::start().await.expect("fake upstream starts");
    let url = format!("{}/oauth/token", upstream.base_url);
    let source = Arc::new(
        MemorySource::new(
            config(vec![subscription(1, "setup-token-access", "", &url)]),
            None,
            Clock::system(),
        )
        .expect("source"),
    );
    let refresher = refresher(source.clone());
    assert_eq!(
        refresher.refresh(1, true).await.expect("answered"),
        RefreshResult::NotNeeded
    );
    assert_eq!(
        refresher
            .refresh_refused(1, &Secret::new("setup-token-access"))
            .await
            .expect("answered"),
        RefreshResult::NotNeeded
    );
    assert!(
        upstream.token_requests().is_empty(),
        "{:?}",
        upstream.token_requests()
    );
}

fn signed_in(upstream_id: &str, name: Option<&str>) -> poolgate_core::account::SignIn {
    poolgate_core::account::SignIn {
        platform: Platform::Anthropic,
        kind: CredentialKind::OAuth,
        access_token: Secret::new(format!("access-{upstream_id}")),
        refresh_token: Secret::new(format!("refresh-{upstream_id}")),
        expires_at_ms: now_ms() + 3_600_000,
        token_url: String::new(),
        client_id: String::new(),
        identity: poolgate_core::account::AccountIdentity {
            upstream_id: upstream_id.into(),
            email: "ada@example.com".into(),
            plan: "max".into(),
        },
        account_id: None,
        name: name.map(str::to_owned),
        group: Some("g".into()),
        base_url: None,
        settings: Default::default(),
    }
}

#[tokio::test]
async fn a_run_time_account_is_kept_and_the_config_wins_a_later_clash_without_losing_it() {
    let scratch = Scratch::new("memory-runtime").expect("scratch");
    let file = state_in(&scratch);
    let source = MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(file.clone()),
        Clock::system(),
    )
    .expect("source");
    let created = source
        .sign_in(&signed_in("u1/o1", Some("signed")))
        .await
        .expect("created");
    assert!(created.created);
    let id = created.account.id;
    assert_ne!(id, 1, "an id of its own");
    // The same identity again: in place, no second account.
    let again = source
        .sign_in(&signed_in("u1/o1", None))
        .await
        .expect("again");
    assert!(!again.created);
    assert_eq!(again.account.id, id);
    assert_eq!(source.snapshot().accounts().count(), 2);
    // A name the config has is refused naming it, and changes nothing.
    let clash = source.sign_in(&signed_in("u2/o2", Some("acct-1"))).await;
    assert!(
        matches!(&clash, Err(StoreError::Conflict(why)) if why.contains("acct-1") && why.contains("config")),
        "{clash:?}"
    );
    assert_eq!(source.snapshot().accounts().count(), 2);
    drop(source);

    // Restarted: the run-time account is back, with its tokens.
    let source = MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(file.clone()),
        Clock::system(),
    )
    .expect("source");
    let back = source.load_account(id).await.expect("kept");
    assert_eq!(back.credential.expose(), "access-u1/o1");
    assert_eq!(back.identity.upstream_id, "u1/o1");
    drop(source);

    // The config now names an account `signed`: the config's is served, the file's is not, and
    // the file keeps it for when the clash is gone.
    let clashing = account(1, |a| a.name = "signed".into());
    let source = MemorySource::new(config(vec![clashing]), Some(file.clone()), Clock::system())
        .expect("source");
    assert_eq!(source.snapshot().accounts().count(), 1);
    source.flush().await.expect("flush");
    drop(source);
    let source = MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(file),
        Clock::system(),
    )
    .expect("source");
    assert_eq!(
        source.snapshot().accounts().count(),
        2,
        "served again once the clash is gone"
    );
}

#[tokio::test]
async fn a_setup_token_does_not_silently_replace_a_refresh_token() {
    let scratch = Scratch::new("memory-setup-over").expect("scratch");
    let source = MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(state_in(&scratch)),
        Clock::system(),
    )
    .expect("source");
    let full = source
        .sign_in(&signed_in("u1/o1", None))
        .await
        .expect("created");
    let mut setup = signed_in("u1/o1", None);
    setup.refresh_token = Secret::default();
    let refused = source.sign_in(&setup).await;
    assert!(
        matches!(&refused, Err(StoreError::Invalid { field, message }) if field == "account" && message.contains("--account")),
        "{refused:?}"
    );
    let kept = source.load_account(full.account.id).await.expect("account");
    assert_eq!(
        kept.oauth
            .as_ref()
            .map(|o| o.refresh_token.expose().to_owned()),
        Some("refresh-u1/o1".to_owned()),
        "unchanged"
    );
    setup.account_id = Some(full.account.id);
    let named = source
        .sign_in(&setup)
        .await
        .expect("asked for by --account");
    assert!(!named.created);
}

#[tokio::test]
async fn a_sign_in_whose_write_fails_is_undone_and_nothing_else_is() {
    let scratch = Scratch::new("memory-signin-unwritable").expect("scratch");
    let directory = scratch.path().join("state");
    std::fs::create_dir_all(&directory).expect("dir");
    let file = StateFile::new(directory.join("state.json"));
    let source = MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(file),
        Clock::system(),
    )
    .expect("source");
    let first = source
        .sign_in(&signed_in("u1/o1", Some("first")))
        .await
        .expect("created");
    // The directory goes away: the next write fails.
    std::fs::remove_dir_all(&directory).expect("removed");
    let failed = source.sign_in(&signed_in("u2/o2", Some("second"))).await;
    assert!(
        matches!(failed, Err(StoreError::StateFile(_))),
        "{failed:?}"
    );
    assert_eq!(
        source.snapshot().accounts().count(),
        2,
        "the failed sign-in's account is gone"
    );
    assert!(source.snapshot().accounts().all(|a| a.name != "second"));
    // Signing the first in again fails too, and puts its old tokens back.
    let mut again = signed_in("u1/o1", None);
    again.access_token = Secret::new("newer-access");
    assert!(source.sign_in(&again).await.is_err());
    let kept = source
        .load_account(first.account.id)
        .await
        .expect("account");
    assert_eq!(kept.credential.expose(), "access-u1/o1");
}

#[tokio::test]
async fn a_run_time_accounts_refreshed_tokens_and_status_stay_its_own_through_a_name_clash() {
    let scratch = Scratch::new("memory-runtime-refresh").expect("scratch");
    let file = state_in(&scratch);
    let source = MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(file.clone()),
        Clock::system(),
    )
    .expect("source");
    let created = source
        .sign_in(&signed_in("u1/o1", Some("signed")))
        .await
        .expect("created");
    let id = created.account.id;
    source
        .store_tokens(
            id,
            &Secret::new("refreshed-access"),
            &Secret::new("refreshed-refresh"),
            now_ms() + 60_000,
        )
        .await
        .expect("refreshed");
    source
        .set_status(id, AccountStatus::Error, "refresh refused")
        .await
        .expect("status");
    drop(source);
    // The config takes the name for a while: its account gets none of the run-time one's.
    let clashing = account(1, |a| a.name = "signed".into());
    let source = MemorySource::new(config(vec![clashing]), Some(file.clone()), Clock::system())
        .expect("source");
    let configured = source.load_account(1).await.expect("account");
    assert_eq!(
        configured.status,
        AccountStatus::Active,
        "not the run-time account's status"
    );
    assert_ne!(configured.credential.expose(), "refreshed-access");
    // Any write while the clash lasts rewrites the file: what it keeps must survive that.
    source.set_key_disabled(1, true).await.expect("a write");
    drop(source);
    let source = MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(file),
        Clock::system(),
    )
    .expect("source");
    let back = source.load_account(id).await.expect("back");
    assert_eq!(back.credential.expose(), "refreshed-access");
    assert_eq!(
        back.oauth
            .as_ref()
            .map(|o| o.refresh_token.expose().to_owned()),
        Some("refreshed-refresh".to_owned())
    );
    assert_eq!(back.status, AccountStatus::Error);
}

/// Standalone usage is kept by the hour for the retention (90 days), then in each key's
/// all-time totals: four months of traffic every hour, through a state file and a restart,
/// leave at most the retention's hours of buckets, and every key's total — what its `total`
/// budget is rebuilt from — and its last month read what was recorded.
#[tokio::test]
async fn four_months_of_hourly_usage_stay_within_the_retentions_buckets_and_keep_every_total() {
    use poolgate_core::clock::ManualClock;
    use poolgate_select::source::USAGE_RETENTION_MS;

    let scratch = Scratch::new("memory-retention").expect("scratch");
    let file = state_in(&scratch);
    let hour = 3_600_000;
    let start = 1_700_000_000_000 / hour * hour;
    let clock = ManualClock::starting_at(start);
    let source = MemorySource::new(
        config(vec![account(1, |_| {})]),
        Some(file.clone()),
        clock.clock(),
    )
    .expect("source");
    let hours = 120 * 24;
    let (mut total, mut last_month) = (0.0, 0.0);
    let month_from = start + (hours - 30 * 24) * hour;
    for n in 0..hours {
        let at = start + n * hour;
        clock.set_wall_ms(at + 1);
        source
            .insert_usage(&[
                usage(Some(1), at + 1, 1, 0.5),
                usage(Some(2), at + 2, 1, 0.25),
            ])
            .await
            .expect("taken");
        total += 0.5;
        if at >= month_from {
            last_month += 0.5;
        }
    }
    let (per_key, per_model) = source.usage_buckets();
    let kept_hours = (USAGE_RETENTION_MS / hour) as usize + 2;
    assert!(
        per_key <= 2 * kept_hours && per_model <= 2 * kept_hours,
        "bounded by the retention: {per_key} key buckets, {per_model} model buckets for {hours} hours"
    );
    let now = start + hours * hour;
    let all = source.read_usage(1, 0, now).await.expect("read");
    assert_eq!(all.requests, hours);
    assert!(
        (all.cost_usd - total).abs() < 1e-6,
        "{all:?} against {total}"
    );
    let month = source.read_usage(1, month_from, now).await.expect("read");
    assert!((month.cost_usd - last_month).abs() < 1e-6, "{month:?}");
    let models = source.read_model_usage(1, 0, now).await.expect("models");
    assert_eq!(models.len(), 1, "{models:?}");
    assert_eq!(models[0].usage.requests, hours);

    // Through the state file: the same totals after a restart.
    source.flush().await.expect("flushed");
    drop(source);
    let restarted = MemorySource::new(config(vec![account(1, |_| {})]), Some(file), clock.clock())
        .expect("source");
    assert_eq!(restarted.read_usage(1, 0, now).await.expect("read"), all);
    assert_eq!(
        restarted
            .read_usage(2, 0, now)
            .await
            .expect("read")
            .requests,
        hours
    );
}
