//! The operator's `windows` verb against a running selector (distributed mode), over real
//! Postgres and Redis: what relays recorded through `RecordWindows` is what `selector-svc admin
//! windows` shows, one row per account and window, with the share used, the time to its reset
//! (`passed` once it reset) and its age; `--account` and `--group` narrow it.

use crate::support;

use clap::Parser;
use poolgate_core::windows::{Scope, WindowKind, WindowReading, WindowStatus};
use poolgate_operator::grpc::SelectorAdmin;
use poolgate_operator::{OperatorError, Verb};
use poolgate_proto::convert;
use serde_json::{Value, json};
use support::{ADMIN_TOKEN, Backends, Replica, SERVICE_TOKEN, fast_settings};

#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

fn verb(args: &[&str]) -> Verb {
    Cli::try_parse_from(std::iter::once("admin").chain(args.iter().copied()))
        .expect("a verb")
        .verb
}

const MINUTE_MS: i64 = 60_000;
const HOUR_MS: i64 = 60 * MINUTE_MS;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_windows_verb_shows_each_recorded_window_with_its_share_reset_and_age() {
    let backends = Backends::start().await;
    let a = backends.account("sub-a", "g", |_| {}).await;
    let b = backends.account("sub-b", "h", |_| {}).await;
    let _unread = backends.account("sub-c", "g", |_| {}).await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let now = poolgate_core::now_ms();
    let five_hour_reset = now + 3 * HOUR_MS + 12 * MINUTE_MS + 30_000;
    let a_readings = vec![
        // Its reset passed an hour ago: empty to selection, still shown (as `passed`).
        WindowReading {
            kind: WindowKind::SevenDayModel,
            scope: Scope::Models("opus".into()),
            utilization: None,
            reset_at_ms: now - HOUR_MS,
            length_ms: None,
            status: WindowStatus::Rejected,
            observed_at_ms: now - 2 * HOUR_MS,
        },
        WindowReading {
            kind: WindowKind::FiveHour,
            scope: Scope::Account,
            utilization: Some(0.42),
            reset_at_ms: five_hour_reset,
            length_ms: Some(5 * HOUR_MS),
            status: WindowStatus::Allowed,
            observed_at_ms: now - 5_000,
        },
    ];
    let b_readings = vec![WindowReading {
        kind: WindowKind::CodexSecondary,
        scope: Scope::Account,
        utilization: Some(0.9),
        reset_at_ms: now + 2 * 24 * HOUR_MS - 30 * MINUTE_MS,
        length_ms: None,
        status: WindowStatus::AllowedWarning,
        observed_at_ms: now,
    }];
    // As a relay sends them.
    let recorded = replica
        .client
        .clone()
        .record_windows(convert::windows_request([(a, a_readings), (b, b_readings)]))
        .await
        .expect("recorded")
        .into_inner();
    assert_eq!(recorded.accepted, 2);

    let operator = SelectorAdmin::connect(
        &format!("http://{}", replica.addr),
        ADMIN_TOKEN,
        Some(SERVICE_TOKEN),
    )
    .await
    .expect("the admin API answers");
    let json = poolgate_operator::execute(&operator, &verb(&["windows", "-o", "json"]))
        .await
        .expect("windows");
    let json: Value = serde_json::from_str(&json).expect("the JSON envelope");
    let rows = json["windows"].as_array().expect("a list of windows");
    let shown: Vec<(i64, &str, &str, &str)> = rows
        .iter()
        .map(|row| {
            (
                row["account_id"].as_i64().expect("account"),
                row["kind"].as_str().expect("kind"),
                row["scope"].as_str().expect("scope"),
                row["status"].as_str().expect("status"),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (a, "5h", "account", "allowed"),
            (a, "7d_model", "opus", "rejected"),
            (b, "codex_secondary", "account", "allowed_warning"),
        ],
        "one row per account and window, by account then kind; no row for an account never read"
    );
    let five_hour = &rows[0];
    assert_eq!(five_hour["account_name"], "sub-a");
    assert_eq!(five_hour["utilization"], json!(0.42));
    assert_eq!(five_hour["reset_at_ms"], json!(five_hour_reset));
    assert_eq!(five_hour["length_ms"], json!(5 * HOUR_MS));
    let remaining = five_hour["remaining_ms"].as_i64().expect("remaining");
    assert!(
        remaining > 0 && remaining <= five_hour_reset - now,
        "the reset is ahead: {remaining}"
    );
    assert!(five_hour["age_ms"].as_i64().is_some_and(|age| age >= 5_000));
    assert_eq!(
        (&rows[1]["utilization"], &rows[1]["remaining_ms"]),
        (&Value::Null, &json!(0)),
        "a status-only reading whose reset passed"
    );
    assert_eq!(rows[2]["utilization"], json!(0.9));

    let text = poolgate_operator::execute(&operator, &verb(&["windows"]))
        .await
        .expect("windows");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].starts_with(&format!(
            "{a}\tsub-a\t5h\tscope=account\tused=42.0%\tstatus=allowed\treset=3h12m\tobserved="
        )),
        "{text}"
    );
    assert!(
        lines[1].starts_with(&format!(
            "{a}\tsub-a\t7d_model\tscope=opus\tused=-\tstatus=rejected\treset=passed\t\
             observed=2h0m ago"
        )),
        "{text}"
    );
    assert!(
        lines[2].starts_with(&format!(
            "{b}\tsub-b\tcodex_secondary\tscope=account\tused=90.0%\tstatus=allowed_warning\t\
             reset=1d23h\t"
        )),
        "{text}"
    );

    // Narrowed to one account, or one group's accounts; an account that does not exist is not
    // found, not an empty list.
    let only_b =
        poolgate_operator::execute(&operator, &verb(&["windows", "--account", &b.to_string()]))
            .await
            .expect("windows of b");
    assert_eq!(only_b, lines[2], "only b's window");
    let group_g = poolgate_operator::execute(&operator, &verb(&["windows", "--group", "g"]))
        .await
        .expect("windows of g");
    assert_eq!(group_g, lines[..2].join("\n"), "only a's windows");
    let unknown = poolgate_operator::execute(&operator, &verb(&["windows", "--account", "999"]))
        .await
        .expect_err("no such account");
    assert!(matches!(unknown, OperatorError::NotFound(_)), "{unknown}");

    // Like every admin read, only with the admin token.
    let stranger = SelectorAdmin::connect(
        &format!("http://{}", replica.addr),
        "not-the-admin-token",
        Some(SERVICE_TOKEN),
    )
    .await
    .expect("connects");
    let refused = poolgate_operator::execute(&stranger, &verb(&["windows"]))
        .await
        .expect_err("refused");
    assert!(
        matches!(refused, OperatorError::Unauthenticated(_)),
        "{refused}"
    );
}
