//! The standalone relay's admin endpoint over its in-process engines: the operator's key
//! disable served at once and kept across restarts, the status of the engines' leases and
//! blocks, and a key's usage in the deployment's budget calendar.

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use http::{Request, StatusCode};
use poolgate_select::crypto::api_key_hash;
use poolgate_select::engine::SelectorSettings;
use poolgate_select::source::AccountSource;
use tower::ServiceExt;

use poolgate_operator::view::KeyRow;

use crate::ports::SelectionApi;
use crate::standalone::{Standalone, StandaloneFile};

const TOKEN: &str = "operator-test-token";

/// A relay's engines over `yaml` and the state file at `state`.
fn engines(yaml: &str, state: &Path) -> Standalone {
    engines_in(yaml, state, Default::default())
}

fn engines_in(yaml: &str, state: &Path, admission: poolgate_core::lease::Settings) -> Standalone {
    let file = StandaloneFile::parse(yaml).expect("the file parses");
    crate::standalone::build(
        &file,
        Some(state),
        SelectorSettings::default(),
        admission,
        &crate::metrics::Metrics::new(),
    )
    .expect("the engines start")
}

/// One admin call: status and JSON answer.
async fn call(
    engines: &Standalone,
    method: &str,
    path: &str,
    token: &str,
) -> (StatusCode, serde_json::Value) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .expect("request");
    let response = poolgate_operator::http::router(engines.operator.clone(), TOKEN)
        .oneshot(request)
        .await
        .expect("answered");
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

fn disabled(engines: &Standalone, key: &str) -> bool {
    engines
        .source
        .snapshot()
        .api_key(&api_key_hash(key))
        .expect("the key is configured")
        .access
        .disabled
}

#[tokio::test]
async fn a_disable_through_the_admin_endpoint_is_served_at_once_and_survives_a_restart() {
    let scratch = poolgate_testkit::Scratch::new("key-disable").expect("scratch");
    let state = scratch.path().join("state.json");
    let yaml = |first: &str| {
        format!(
            "api_keys:\n{first}  - {{key: key-a, user: alice}}\n  - {{key: key-b, user: bob, disabled: true}}\n\
             accounts:\n  - {{name: a, platform: anthropic, base_url: \"http://127.0.0.1:9\", api_key: sk-x}}\n"
        )
    };
    let relay = engines(&yaml(""), &state);
    let (status, _) = call(&relay, "POST", "/admin/keys/1/disable", "wrong").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        !disabled(&relay, "key-a"),
        "nothing changes without the token"
    );
    let (status, answer) = call(&relay, "POST", "/admin/keys/1/disable", TOKEN).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["key"]["status"], "disabled");
    assert_eq!(answer["key"]["user"], "alice");
    assert!(disabled(&relay, "key-a"), "served disabled at once");
    let caller = |key: &'static str| {
        let selection: Arc<dyn SelectionApi> = relay.selection.clone();
        async move { selection.check_key(key).await.expect("answers").caller() }
    };
    assert!(
        caller("key-a").await.is_none(),
        "the engine refuses it at once"
    );
    assert!(caller("key-b").await.is_none(), "the YAML disables key-b");
    // The YAML's disable is lifted by an enable, which the file keeps too.
    let (status, answer) = call(&relay, "POST", "/admin/keys/2/enable", TOKEN).await;
    assert_eq!(
        (status, &answer["key"]["status"]),
        (StatusCode::OK, &"active".into())
    );
    assert!(caller("key-b").await.is_some(), "key-b is served again");
    let (status, _) = call(&relay, "POST", "/admin/keys/9/disable", TOKEN).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call(&relay, "POST", "/admin/keys/x/disable", TOKEN).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (_, listed) = call(&relay, "GET", "/admin/keys", TOKEN).await;
    let statuses: Vec<_> = listed["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| (k["id"].as_i64(), k["status"].as_str()))
        .collect();
    assert_eq!(
        statuses,
        [(Some(1), Some("disabled")), (Some(2), Some("active"))]
    );
    drop(relay);

    // Restarted from the same YAML: the operator's changes hold over it.
    let restarted = engines(&yaml(""), &state);
    assert!(disabled(&restarted, "key-a"), "key-a stays disabled");
    assert!(!disabled(&restarted, "key-b"), "key-b stays enabled");
    drop(restarted);
    // By the key, not its place: a new key first moves every id, and the disable follows key-a.
    let moved = engines(&yaml("  - {key: key-new}\n"), &state);
    assert!(disabled(&moved, "key-a"));
    assert!(!disabled(&moved, "key-new"));
    assert!(!disabled(&moved, "key-b"));
    // Enabled again: back to what the YAML says, and that holds after a restart too.
    let (status, _) = call(&moved, "POST", "/admin/keys/2/enable", TOKEN).await;
    assert_eq!(status, StatusCode::OK);
    drop(moved);
    let again = engines(&yaml(""), &state);
    assert!(!disabled(&again, "key-a"));
}

/// `GET /admin/status` over the in-process engines: the lease the lease engine holds and the
/// request it admitted this minute, the block the selection engine applied with its reason
/// and time left, admission as the in-process engine it is; nothing without the token.
#[tokio::test]
async fn the_status_shows_the_in_process_engines_leases_and_blocks() {
    let scratch = poolgate_testkit::Scratch::new("admin-status").expect("scratch");
    let state = scratch.path().join("state.json");
    let relay = engines(
        "accounts:\n  - {name: a, platform: anthropic, base_url: \"http://127.0.0.1:9\", \
         api_key: sk-ant-a-0123456789wxyz, concurrency: 3, rpm: 60, session_window_usd: 5}\n  \
         - {name: b, platform: anthropic, base_url: \"http://127.0.0.1:9\", \
         api_key: sk-ant-b-0123456789vxyz}\n",
        &state,
    );
    let terms = poolgate_core::lease::LeaseTerms {
        account_id: 1,
        concurrency_limit: 3,
        rpm_limit: 60,
        user: None,
        session_hash: None,
        session_window_limit_micros: 5_000_000,
        session_bound: false,
        ignore_cooldown: false,
        key: None,
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    let held = relay
        .admission
        .acquire(&terms, std::time::Duration::from_secs(1), &cancel, |_| {})
        .await
        .expect("the engine answers");
    assert!(matches!(held, poolgate_lease::AcquireOutcome::Granted(_)));
    let exhausted = poolgate_core::classify::Classified {
        class: poolgate_core::outcome::OutcomeClass::WindowExhausted,
        reset_at_ms: Some(poolgate_core::now_ms() + 60_000),
        label: "429",
    };
    SelectionApi::report(
        &*relay.selection,
        poolgate_core::outcome::Outcome::observed(2, &exhausted, 429, "usage window used up", None),
    )
    .await
    .expect("applied");

    let (status, _) = call(&relay, "GET", "/admin/status", "wrong").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, answer) = call(&relay, "GET", "/admin/status", TOKEN).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let view = &answer["status"];
    assert_eq!(
        (&view["failure_policy"], &view["admission"]),
        (&"memory".into(), &"ok".into())
    );
    let a = &view["accounts"][0];
    assert_eq!(
        (&a["name"], &a["status"], &a["leases"], &a["rpm_used"]),
        (&"a".into(), &"active".into(), &1.into(), &1.into())
    );
    assert_eq!(a["session_spend_usd"], 0.0);
    assert_eq!(a["credential_masked"], "…wxyz");
    let b = &view["accounts"][1];
    assert_eq!(b["status"], "hard_blocked");
    assert_eq!(
        b["block_reason"],
        "hard window_exhausted 429: usage window used up"
    );
    let left = b["block_left_ms"].as_u64().expect("time left");
    assert!(left > 0 && left <= 60_000, "{left}");
    assert_eq!(
        b["rpm_used"],
        serde_json::Value::Null,
        "no RPM limit: not counted"
    );
}

/// `--budget-time-zone Asia/Tokyo`: the key's usage per period (the admin list, the
/// holder's view) is summed over Tokyo's day, the one admission counts the budget in. Tokyo's
/// day and UTC's differ by nine hours whenever this runs, so in a UTC calendar one of the
/// two records below would be counted wrong.
#[tokio::test]
async fn the_key_list_shows_each_budgets_spend_in_the_deployments_calendar() {
    let scratch = poolgate_testkit::Scratch::new("key-usage").expect("scratch");
    let state = scratch.path().join("state.json");
    let yaml = "api_keys:\n  - {key: key-a, user: alice, budget_usd: {day: 5, month: 60}}\n\
                accounts:\n  - {name: a, platform: anthropic, base_url: \"http://127.0.0.1:9\", api_key: sk-x}\n";
    let relay = engines_in(
        yaml,
        &state,
        poolgate_core::lease::Settings {
            budget_time_zone: "Asia/Tokyo".into(),
            ..Default::default()
        },
    );
    let calendar =
        poolgate_lease::calendar::Calendar::new("Asia/Tokyo", Default::default()).expect("zone");
    let now = poolgate_core::now_ms();
    let day_start = calendar.periods(now).day.ends_ms - 24 * 3_600_000;
    let record = |cost_usd: f64, at_ms: i64| poolgate_select::source::UsageInput {
        api_key_id: Some(1),
        user: "alice".into(),
        account_id: None,
        model: "claude-sonnet-4-5".into(),
        input_tokens: 10,
        output_tokens: 5,
        cache_write_tokens: 0,
        cache_read_tokens: 0,
        cost_usd,
        price_source: None,
        status: 200,
        latency_ms: 1,
        at_ms: Some(at_ms),
    };
    relay
        .source
        .insert_usage(&[
            record(1.25, day_start + 1_000),
            record(2.0, day_start - 60_000),
        ])
        .await
        .expect("recorded");

    let (status, listed) = call(&relay, "GET", "/admin/keys", TOKEN).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let day = &listed["keys"][0]["usage"][0];
    assert_eq!(day["period"], "day");
    assert_eq!(day["from_ms"], day_start, "Tokyo's midnight");
    assert_eq!(
        (&day["requests"], &day["cost_usd"], &day["remaining_usd"]),
        (&1.into(), &1.25.into(), &3.75.into())
    );
    let total = &listed["keys"][0]["usage"][3];
    assert_eq!(
        (&total["period"], &total["cost_usd"]),
        (&"total".into(), &3.25.into())
    );
    let row: KeyRow = serde_json::from_value(listed["keys"][0].clone()).expect("a row");
    assert!(
        poolgate_operator::verb::key_line(&row, now).contains("\tbudgets_usd=day:1.25/5,month:"),
        "{}",
        poolgate_operator::verb::key_line(&row, now)
    );

    // The holder's own view sums the same day.
    let described = SelectionApi::describe_key(&*relay.selection, "key-a")
        .await
        .expect("answers")
        .expect("a known key");
    assert_eq!(
        described.usage[0].1, day_start,
        "the view's day is Tokyo's too"
    );
    assert_eq!(described.usage[0].2.cost_usd, 1.25);
}
