//! The standalone state file keeps the in-process health store's usage-window readings
//! (docs/DESIGN.md §5): by account name, only readings whose reset is ahead, written only when
//! there is something new, and read back into a new store at start. A state file written before
//! it kept readings still loads, and a reading this build cannot read is skipped, not fatal.

use std::collections::HashMap;
use std::sync::Arc;

use poolgate_core::Clock;
use poolgate_core::account::{Account, AccountStatus, CredentialKind, Platform, Secret};
use poolgate_core::lease::Settings;
use poolgate_core::windows::{Scope, WindowKind, WindowReading, WindowStatus};
use poolgate_core::{AccountId, now_ms};
use poolgate_select::health::{InProcessHealth, Windows};
use poolgate_select::snapshot::Snapshot;
use poolgate_select::source::{AccountSource, MemorySource, StateFile};
use poolgate_testkit::Scratch;
use serde_json::{Value, json};

const HOUR_MS: i64 = 3_600_000;

fn account(id: AccountId, name: &str) -> Account {
    Account {
        serves: Vec::new(),
        id,
        name: name.into(),
        group: "g".into(),
        platform: Platform::Anthropic,
        base_url: "http://127.0.0.1:9".into(),
        credential_kind: CredentialKind::ApiKey,
        credential: Secret::new(format!("sk-{name}")),
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
    }
}

/// The config with `names` in this order (ids are places, as in the standalone file).
fn config(names: &[&str]) -> Snapshot {
    let accounts = names
        .iter()
        .enumerate()
        .map(|(n, name)| account(n as AccountId + 1, name))
        .collect();
    Snapshot::new(vec!["g".into()], accounts, HashMap::new(), HashMap::new())
}

fn reading(kind: WindowKind, used: f64, reset_in_ms: i64) -> WindowReading {
    let now = now_ms();
    WindowReading {
        kind,
        scope: Scope::Account,
        utilization: Some(used),
        reset_at_ms: now + reset_in_ms,
        length_ms: None,
        status: WindowStatus::Allowed,
        observed_at_ms: now - 1_000,
    }
}

/// A relay's start: the source over `names` and the file, and a health store it keeps.
fn start(names: &[&str], file: &StateFile) -> (MemorySource, Arc<InProcessHealth>) {
    let source = MemorySource::new(config(names), Some(file.clone()), Clock::system())
        .expect("the source loads");
    let admission = poolgate_lease::in_memory(
        Settings::default(),
        poolgate_lease::metrics::Metrics::new(),
        Clock::system(),
    );
    let health = Arc::new(InProcessHealth::new(admission, Clock::system()));
    source.keep_windows(health.clone());
    (source, health)
}

async fn read(health: &InProcessHealth, id: AccountId) -> Vec<WindowReading> {
    health
        .read_windows(&[id])
        .await
        .expect("read")
        .pop()
        .unwrap_or_default()
}

#[tokio::test]
async fn window_readings_survive_a_restart_by_account_name_and_a_passed_reset_is_not_kept() {
    let scratch = Scratch::new("windows-state").expect("scratch");
    let file = StateFile::new(scratch.path().join("state.json"));
    let week = reading(WindowKind::SevenDay, 0.85, 3 * 24 * HOUR_MS);
    let ended = reading(WindowKind::FiveHour, 0.9, -HOUR_MS);
    let other = reading(WindowKind::SevenDay, 0.1, 5 * 24 * HOUR_MS);

    let (source, health) = start(&["a", "b"], &file);
    health
        .store_windows(1, &[week.clone(), ended])
        .await
        .expect("stored");
    health
        .store_windows(2, std::slice::from_ref(&other))
        .await
        .expect("stored");
    source.flush().await.expect("written");
    let saved: Value =
        serde_json::from_slice(&std::fs::read(file.path()).expect("written")).expect("JSON");
    assert_eq!(
        saved["windows"]["a"].as_array().map(Vec::len),
        Some(1),
        "a's week is kept, its ended 5-hour window is not: {saved}"
    );
    drop((source, health));

    // Restarted with the accounts in the other order: each finds its own readings.
    let (source, health) = start(&["b", "a"], &file);
    assert_eq!(read(&health, 2).await, vec![week]);
    assert_eq!(read(&health, 1).await, vec![other]);

    // Nothing new since the start: nothing to write.
    std::fs::remove_file(file.path()).expect("removed");
    source.flush().await.expect("flushed");
    assert!(!file.path().exists(), "a flush with nothing new writes");
    let newer = reading(WindowKind::SevenDay, 0.95, 3 * 24 * HOUR_MS);
    health
        .store_windows(2, std::slice::from_ref(&newer))
        .await
        .expect("stored");
    source.flush().await.expect("written");
    let saved: Value =
        serde_json::from_slice(&std::fs::read(file.path()).expect("a new reading is written"))
            .expect("JSON");
    assert_eq!(saved["windows"]["a"][0]["utilization"], json!(0.95));
}

#[tokio::test]
async fn a_state_file_from_before_window_readings_loads_and_an_unreadable_reading_is_skipped() {
    let scratch = Scratch::new("windows-state").expect("scratch");
    let file = StateFile::new(scratch.path().join("state.json"));
    let before = json!({
        "format": 1,
        "statuses": {"b": {"status": "retired", "reason": "gone"}},
        "usage": [],
    });
    std::fs::write(file.path(), before.to_string()).expect("written");
    let (source, health) = start(&["a", "b"], &file);
    assert_eq!(
        source.load_account(2).await.expect("b").status,
        AccountStatus::Retired,
        "the rest of the file applies"
    );
    assert!(read(&health, 1).await.is_empty());
    drop((source, health));

    let week = reading(WindowKind::SevenDay, 0.5, 3 * 24 * HOUR_MS);
    let mut unknown = serde_json::to_value(&week).expect("JSON");
    unknown["kind"] = json!("TenDay");
    let with_readings = json!({
        "format": 1,
        "windows": {"a": [unknown, serde_json::to_value(&week).expect("JSON")], "b": "what"},
    });
    std::fs::write(file.path(), with_readings.to_string()).expect("written");
    let (_source, health) = start(&["a", "b"], &file);
    assert_eq!(read(&health, 1).await, vec![week], "the readable one");
    assert!(read(&health, 2).await.is_empty());
}
