//! The standalone file's parsing and checks.

use super::*;

fn file(accounts: &str) -> Result<Snapshot, String> {
    StandaloneFile::parse(&format!(
        "api_keys:\n  - {{key: k1}}\naccounts:\n{accounts}"
    ))?
    .snapshot()
}

/// A Claude OAuth account may probe only on a Haiku model; the file naming
/// another fails at start, naming the account and `probe_model`.
#[test]
fn a_non_haiku_probe_model_on_a_claude_oauth_account_is_a_start_up_error() {
    let oauth = |model: &str| {
        format!(
            "  - {{name: sub, platform: anthropic, base_url: \"https://api.anthropic.com\", \
             oauth: {{access_token: a, refresh_token: r}}, probe_model: {model}}}\n"
        )
    };
    let error = file(&oauth("claude-sonnet-4-6")).expect_err("refused");
    assert!(
        error.contains("sub") && error.contains("probe_model"),
        "{error}"
    );
    file(&oauth("claude-haiku-4-5")).expect("Haiku is taken");
    file("  - {name: key, platform: anthropic, base_url: \"https://api.anthropic.com\", api_key: k, probe_model: claude-sonnet-4-6}\n")
        .expect("an API key may probe on any model");
}

#[test]
fn account_names_are_required_to_be_unique_and_non_empty() {
    let account = |name: &str| {
        format!(
            "  - {{name: \"{name}\", platform: anthropic, base_url: \"http://127.0.0.1:9\", api_key: sk-x}}\n"
        )
    };
    assert!(file(&(account("a") + &account("b"))).is_ok());
    let twice = file(&(account("a") + &account("a"))).expect_err("a name given twice");
    assert!(
        twice.contains("accounts[1] (a): name must be non-empty and unique"),
        "{twice}"
    );
    let blank = file(&account(" ")).expect_err("a blank name");
    assert!(blank.contains("name must be non-empty"), "{blank}");
}

fn keys(entries: &str) -> Result<Snapshot, String> {
    StandaloneFile::parse(&format!(
        "api_keys:\n{entries}accounts:\n  - {{name: a, platform: anthropic, base_url: \"http://127.0.0.1:9\", api_key: sk-x}}\n"
    ))?
    .snapshot()
}

fn access_of(snapshot: &Snapshot, key: &str) -> KeyAccess {
    snapshot
        .api_key(&api_key_hash(key))
        .expect("the key is listed")
        .access
        .clone()
}

#[test]
fn a_keys_expiry_disable_and_lists_are_read_from_the_yaml() {
    use poolgate_core::keys::Endpoint;
    let snapshot = keys(
        "  - key: k1\n    expires_at: 2026-12-02T16:09:05Z\n    disabled: true\n    \
         models: [\"claude-*\", gpt-4o]\n    endpoints: [messages, models]\n\
         \x20 - {key: k2, expires_at: 2026-12-02}\n\
         \x20 - {key: k3, expires_at: 1796227745, allowed_models: [\"*-mini\"]}\n\
         \x20 - {key: k4}\n",
    )
    .expect("valid keys");
    assert_eq!(
        access_of(&snapshot, "k1"),
        KeyAccess {
            expires_at_ms: Some(1_796_227_745_000),
            disabled: true,
            allowed_models: vec!["claude-*".into(), "gpt-4o".into()],
            allowed_endpoints: vec![Endpoint::Messages, Endpoint::Models],
        }
    );
    assert_eq!(
        access_of(&snapshot, "k2").expires_at_ms,
        Some(1_796_169_600_000)
    );
    let k3 = access_of(&snapshot, "k3");
    assert_eq!(k3.expires_at_ms, Some(1_796_227_745_000));
    assert_eq!(k3.allowed_models, vec!["*-mini".to_owned()]);
    assert_eq!(access_of(&snapshot, "k4"), KeyAccess::default());
}

#[test]
fn a_keys_limits_are_read_from_the_yaml_and_a_key_without_them_has_none() {
    let snapshot = keys(
        "  - key: k1\n    concurrency: 2\n    tpm: 50000\n    \
         budget_usd: {total: 100, day: 1.5, week: 5, month: 20.25}\n\
         \x20 - {key: k2, budget_usd: {month: 50}}\n\
         \x20 - {key: k3}\n",
    )
    .expect("valid limits");
    let limits_of = |key: &str| {
        snapshot
            .api_key(&api_key_hash(key))
            .expect("listed")
            .limits
            .clone()
    };
    assert_eq!(
        limits_of("k1"),
        KeyLimits {
            api_key_id: 1,
            concurrency_limit: 2,
            tpm_limit: 50_000,
            budget_total_micros: 100_000_000,
            budget_day_micros: 1_500_000,
            budget_week_micros: 5_000_000,
            budget_month_micros: 20_250_000,
        }
    );
    assert_eq!(
        limits_of("k2"),
        KeyLimits {
            api_key_id: 2,
            budget_month_micros: 50_000_000,
            ..KeyLimits::default()
        }
    );
    let none = limits_of("k3");
    assert_eq!(none.api_key_id, 3);
    assert!(!none.any(), "no limit given: none");
}

#[test]
fn a_bad_key_field_is_refused_at_start_naming_the_entry_and_the_field() {
    for (entry, field) in [
        (
            "  - {key: k0}\n  - {key: k1, expires_at: \"next week\"}\n",
            "api_keys[1].expires_at",
        ),
        (
            "  - {key: k1, expires_at: \"2026-02-30\"}\n",
            "api_keys[0].expires_at",
        ),
        ("  - {key: k1, expires_at: -5}\n", "api_keys[0].expires_at"),
        ("  - {key: k1, expires_at: [1]}\n", "api_keys[0].expires_at"),
        ("  - {key: k1, models: [\"\"]}\n", "api_keys[0].models"),
        (
            "  - {key: k1, models: [\"has space\"]}\n",
            "api_keys[0].models",
        ),
        (
            "  - {key: k1, endpoints: [images]}\n",
            "api_keys[0].endpoints",
        ),
        // Only the documented pattern syntax, and a group that exists (issue 39).
        (
            "  - {key: k1, models: [\"claude-?\"]}\n",
            "api_keys[0].models",
        ),
        ("  - {key: k1, group: defualt}\n", "api_keys[0].group"),
        (
            "  - {key: k0}\n  - {key: k1, concurrency: -1}\n",
            "api_keys[1].concurrency",
        ),
        (
            "  - {key: k1, concurrency: 3000000000}\n",
            "api_keys[0].concurrency",
        ),
        ("  - {key: k1, tpm: -5}\n", "api_keys[0].tpm"),
        (
            "  - {key: k1, budget_usd: {total: -1}}\n",
            "api_keys[0].budget_usd.total",
        ),
        (
            "  - {key: k1, budget_usd: {day: .nan}}\n",
            "api_keys[0].budget_usd.day",
        ),
        (
            "  - {key: k1, budget_usd: {week: .inf}}\n",
            "api_keys[0].budget_usd.week",
        ),
        (
            "  - {key: k1, budget_usd: {month: 2000000}}\n",
            "api_keys[0].budget_usd.month",
        ),
    ] {
        let error = keys(entry).expect_err(entry);
        assert!(
            error.starts_with(&format!("config: {field}: ")),
            "{entry}: {error}"
        );
    }
    let unknown = keys("  - {key: k1, endpoints: [messages, images]}\n").expect_err("unknown");
    assert!(unknown.contains("\"images\""), "names the entry: {unknown}");
}

#[test]
fn a_key_may_name_a_declared_group_and_an_expired_key_in_the_file_still_loads() {
    let declared = StandaloneFile::parse(
        "api_keys:\n  - {key: k1, group: later}\naccounts:\n  - {name: a, platform: anthropic, base_url: \"http://127.0.0.1:9\", api_key: sk-x}\ngroups:\n  later: {}\n",
    )
    .and_then(|file| file.snapshot());
    assert!(declared.is_ok(), "{:?}", declared.err());
    let expired = keys("  - {key: k1, expires_at: 1000}\n").expect("an expired key loads");
    assert_eq!(access_of(&expired, "k1").expires_at_ms, Some(1_000_000));
}

#[test]
fn a_groups_window_thresholds_are_read_and_checked() {
    let with_groups = |groups: &str| {
        StandaloneFile::parse(&format!(
            "api_keys:\n  - {{key: k1}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"http://127.0.0.1:9\", api_key: sk-x}}\ngroups:\n{groups}"
        ))?
        .snapshot()
    };
    let snapshot = with_groups("  team: {window_shed_at: 0.8, window_move_at: 0.95}\n")
        .expect("valid thresholds");
    let team = snapshot.group_settings("team");
    assert_eq!(
        (team.window_shed_at, team.window_move_at),
        (Some(0.8), Some(0.95))
    );
    assert_eq!(snapshot.group_settings("other").window_shed_at, None);
    for (groups, problem) in [
        ("  team: {window_shed_at: 1.5}\n", "shed threshold"),
        ("  team: {window_move_at: 0}\n", "move threshold"),
        ("  team: {window_shed_at: 0.99}\n", "must not exceed"),
    ] {
        let error = with_groups(groups).expect_err(groups);
        assert!(
            error.contains("groups.team: window_shed_at / window_move_at")
                && error.contains(problem),
            "{error}"
        );
    }
}

#[test]
fn a_price_that_is_not_one_and_an_unknown_unpriced_policy_are_refused_at_start_naming_them() {
    let with = |extra: &str| {
        StandaloneFile::parse(&format!(
            "accounts:\n  - {{name: a, platform: anthropic, base_url: \"http://127.0.0.1:9\", api_key: k}}\n{extra}"
        ))
        .and_then(|file| file.snapshot())
    };
    for (extra, named) in [
        ("prices:\n  - {model: m, input: -1}\n", "prices[0].input"),
        (
            "prices:\n  m: {input: 1, output: .nan}\n",
            "prices.m.output",
        ),
        (
            "prices:\n  \"bad model\": {input: 1}\n",
            "prices.bad model.model",
        ),
        ("unpriced: free\n", "unpriced"),
    ] {
        let error = with(extra).expect_err("refused");
        assert!(error.contains(named), "{extra}: {error}");
    }
    assert!(with("unpriced: refuse\nprices:\n  m: {input: 0}\n").is_ok());
}
