//! The admin CLI's parsing: what each verb's flags give, and what is refused.
use clap::Parser;

use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    verb: ConfigVerb,
}

fn parse(args: &[&str]) -> Result<ConfigVerb, clap::Error> {
    Cli::try_parse_from(std::iter::once("admin").chain(args.iter().copied())).map(|c| c.verb)
}

fn update(args: &[&str]) -> KeyUpdate {
    match parse(&[&["update-key", "3"], args].concat()) {
        Ok(ConfigVerb::UpdateKey(update)) => update.update(),
        other => panic!("{args:?}: {other:?}"),
    }
}

#[test]
fn a_negative_number_is_a_range_error_naming_its_flag() {
    let key = ["create-key", "--user", "u", "--group", "g"];
    for (args, flag) in [
        (
            vec!["update-key", "3", "--concurrency", "-1"],
            "--concurrency",
        ),
        (vec!["update-key", "3", "--tpm", "-5"], "--tpm"),
        (
            vec!["update-key", "3", "--budget-day", "-1.5"],
            "--budget-day",
        ),
        (
            [&key[..], &["--concurrency", "-1"]].concat(),
            "--concurrency",
        ),
        ([&key[..], &["--user-rpm", "-3"]].concat(), "--user-rpm"),
        (
            [&key[..], &["--budget-month", "-2"]].concat(),
            "--budget-month",
        ),
    ] {
        let error = parse(&args).expect_err("refused");
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::ValueValidation,
            "{args:?}: {error}"
        );
        let message = error.to_string();
        assert!(message.contains(flag), "{args:?}: {message}");
        assert!(
            !message.contains("-- -1"),
            "no tip that does not work: {message}"
        );
    }
    let account = [
        "upsert-account",
        "--name",
        "a",
        "--group",
        "g",
        "--platform",
        "anthropic",
        "--base-url",
        "http://x",
    ];
    for (flag, value) in [
        ("--concurrency", "-1"),
        ("--rpm", "-1"),
        ("--weight", "-1"),
        ("--session-window-usd", "-1"),
    ] {
        let error = parse(&[&account[..], &[flag, value]].concat()).expect_err("refused");
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::ValueValidation,
            "{flag}: {error}"
        );
        assert!(error.to_string().contains(flag), "{error}");
    }
    // A negative priority is a priority (lower first).
    assert!(parse(&[&account[..], &["--priority", "-1"]].concat()).is_ok());
}

#[test]
fn update_key_changes_only_what_its_flags_name() {
    assert_eq!(
        update(&["--disable"]),
        KeyUpdate {
            disabled: Some(true),
            ..Default::default()
        }
    );
    assert_eq!(
        update(&[
            "--enable",
            "--no-expiry",
            "--models",
            "claude-*,gpt-4o",
            "--any-endpoint"
        ]),
        KeyUpdate {
            disabled: Some(false),
            expires_at_ms: Some(None),
            allowed_models: Some(vec!["claude-*".into(), "gpt-4o".into()]),
            allowed_endpoints: Some(vec![]),
            ..Default::default()
        }
    );
    assert_eq!(
        update(&[
            "--expires-at",
            "2026-12-02T16:09:05Z",
            "--endpoints",
            "messages,models"
        ]),
        KeyUpdate {
            expires_at_ms: Some(Some(1_796_227_745_000)),
            allowed_endpoints: Some(vec![Endpoint::Messages, Endpoint::Models]),
            ..Default::default()
        }
    );
    assert_eq!(update(&["--any-model"]).allowed_models, Some(vec![]));
    for refused in [
        &["update-key", "3"][..],
        &["update-key", "0", "--disable"],
        &["update-key", "3", "--disable", "--enable"],
        &["update-key", "3", "--expires-at", "1", "--no-expiry"],
        &["update-key", "3", "--models", "a", "--any-model"],
        &["update-key", "3", "--endpoints", "images"],
        &["update-key", "3", "--expires-at", "2026-02-30"],
        &[
            "create-key",
            "--user",
            "u",
            "--group",
            "g",
            "--endpoints",
            "images",
        ],
        &[
            "create-key",
            "--user",
            "u",
            "--group",
            "g",
            "--expires-at",
            "soon",
        ],
    ] {
        assert!(parse(refused).is_err(), "{refused:?} is refused");
    }
    match parse(&[
        "create-key",
        "--user",
        "u",
        "--group",
        "g",
        "--expires-at",
        "1796227745",
        "--models",
        "claude-*",
        "--endpoints",
        "responses",
    ]) {
        Ok(ConfigVerb::CreateKey {
            expires_at,
            models,
            endpoints,
            ..
        }) => assert_eq!(
            (expires_at, models, endpoints),
            (
                Some(1_796_227_745_000),
                vec!["claude-*".to_owned()],
                vec![Endpoint::Responses]
            )
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn key_limit_flags_set_limits_zero_clears_and_bad_amounts_are_refused() {
    assert_eq!(
        update(&[
            "--concurrency",
            "0",
            "--tpm",
            "50000",
            "--budget-day",
            "2.5"
        ]),
        KeyUpdate {
            concurrency_limit: Some(0),
            tpm_limit: Some(50_000),
            budget_day_micros: Some(2_500_000),
            ..Default::default()
        }
    );
    assert_eq!(
        update(&[
            "--budget-total",
            "100",
            "--budget-week",
            "0",
            "--budget-month",
            "20.25"
        ]),
        KeyUpdate {
            budget_total_micros: Some(100_000_000),
            budget_week_micros: Some(0),
            budget_month_micros: Some(20_250_000),
            ..Default::default()
        }
    );
    match parse(&[
        "create-key",
        "--user",
        "u",
        "--group",
        "g",
        "--concurrency",
        "2",
        "--budget-month",
        "50",
    ]) {
        Ok(ConfigVerb::CreateKey { limits, .. }) => assert_eq!(
            limits.limits(),
            KeyLimits {
                concurrency_limit: 2,
                budget_month_micros: 50_000_000,
                ..KeyLimits::default()
            }
        ),
        other => panic!("{other:?}"),
    }
    for refused in [
        &["update-key", "3", "--concurrency", "-1"][..],
        &["update-key", "3", "--tpm", "-5"],
        &["update-key", "3", "--budget-day", "-1"],
        &["update-key", "3", "--budget-day", "NaN"],
        &["update-key", "3", "--budget-total", "ten"],
        &["update-key", "3", "--budget-month", "1e12"],
        &[
            "create-key",
            "--user",
            "u",
            "--group",
            "g",
            "--budget-week",
            "inf",
        ],
    ] {
        assert!(parse(refused).is_err(), "{refused:?}");
    }
}
