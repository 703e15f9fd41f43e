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

/// The plan's first account's price for `model` (what the relay charges).
async fn planned_price(engines: &Standalone, model: &str) -> poolgate_core::price::ModelPrice {
    let selection: Arc<dyn SelectionApi> = engines.selection.clone();
    let plan = selection
        .plan(&poolgate_core::plan::PlanRequest {
            service: Default::default(),
            api_key_id: 1,
            group: "default".into(),
            platform: poolgate_core::account::Platform::Anthropic,
            model: model.into(),
            session_hash: None,
            previous_response_id: None,
            exclude: Vec::new(),
            opens_conversation: false,
        })
        .await
        .expect("a plan");
    plan.accounts.first().expect("an account").price.clone()
}

/// The standalone admin endpoint served on a free port, and the operator CLI's client of it.
async fn served(engines: &Standalone) -> poolgate_operator::http::HttpAdmin {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let router = poolgate_operator::http::router(engines.operator.clone(), TOKEN);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    poolgate_operator::http::HttpAdmin::new(&format!("http://{addr}"), TOKEN).expect("client")
}

fn verb(args: &[&str]) -> poolgate_operator::Verb {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        verb: poolgate_operator::Verb,
    }
    Cli::try_parse_from(std::iter::once("admin").chain(args.iter().copied()))
        .expect("a verb")
        .verb
}

fn set_price(model: &'static str, input: &'static str) -> Vec<&'static str> {
    vec![
        "set-price",
        model,
        "--input-usd",
        input,
        "--output-usd",
        "2",
        "--cache-write-usd",
        "0",
        "--cache-read-usd",
        "0",
    ]
}

#[tokio::test]
async fn prices_are_listed_set_and_removed_through_the_admin_endpoint_and_survive_a_restart() {
    use poolgate_core::price::PriceSource;
    let scratch = poolgate_testkit::Scratch::new("prices").expect("scratch");
    let state = scratch.path().join("state.json");
    let yaml = "api_keys:\n  - {key: key-a, user: alice}\n\
                accounts:\n  - {name: a, platform: anthropic, base_url: \"http://127.0.0.1:9\", api_key: sk-x}\n\
                prices:\n  claude-sonnet-5-5: {input: 1, output: 5}\n";
    let relay = engines(yaml, &state);
    let admin = served(&relay).await;
    let run = |args: Vec<&'static str>| {
        let admin = &admin;
        async move { poolgate_operator::execute(admin, &verb(&args)).await }
    };

    // The YAML's price over the catalogue's, and the catalogue's, each with its source.
    let listing = run(vec!["prices"]).await.expect("listed");
    let line = |model: &str| {
        listing
            .lines()
            .find(|line| line.starts_with(&format!("{model}\t")))
            .unwrap_or_else(|| panic!("{model} in {listing}"))
            .to_owned()
    };
    assert_eq!(
        line("claude-sonnet-5-5"),
        "claude-sonnet-5-5\tsource=operator\tinput=1\toutput=5\tcache_write=0\tcache_read=0\tcatalogue=2/10/2.5/0.1"
    );
    assert_eq!(
        line("gpt-6.2-sol"),
        "gpt-6.2-sol\tsource=catalogue\tinput=2\toutput=10\tcache_write=2.5\tcache_read=0.1"
    );

    // Set at run time: served at once.
    let set = run(set_price("claude-opus-6", "7")).await.expect("set");
    assert!(
        set.starts_with("claude-opus-6\tsource=operator\tinput=7\t"),
        "{set}"
    );
    let priced = planned_price(&relay, "claude-opus-6").await;
    assert_eq!(
        (priced.source, priced.price.input_per_mtok),
        (PriceSource::Operator, 7.0)
    );
    // Bad input: exit 2 naming the field, nothing changed.
    let before = run(vec!["prices"]).await.expect("listed");
    for (args, field) in [
        (set_price("claude-opus-6", "-1"), "input"),
        (set_price("claude-opus-6", "NaN"), "input"),
        (set_price("", "1"), "model"),
        (set_price("claude opus", "1"), "model"),
    ] {
        let error = run(args.clone()).await.expect_err("refused");
        assert_eq!(error.exit_code(), 2, "{args:?}: {error}");
        assert!(error.to_string().contains(field), "{args:?}: {error}");
    }
    // The endpoint refuses them itself, whoever asks.
    let (status, answer) = call(
        &relay,
        "POST",
        "/admin/prices/set?model=claude-opus-6&input=-1&output=1&cache_write=0&cache_read=0",
        TOKEN,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer.to_string().contains("input"), "{answer}");
    assert_eq!(run(vec!["prices"]).await.expect("listed"), before);
    // The YAML's price removed: the catalogue's applies again.
    let removed = run(vec!["remove-price", "claude-sonnet-5-5"])
        .await
        .expect("removed");
    assert!(
        removed.starts_with("claude-sonnet-5-5\tsource=catalogue\tinput=2\t"),
        "{removed}"
    );
    let error = run(vec!["remove-price", "claude-opus-7"])
        .await
        .expect_err("nothing to remove");
    assert!(
        matches!(error, poolgate_operator::OperatorError::NotFound(_)),
        "{error}"
    );
    drop(relay);

    // Restarted from the same YAML: the operator's set and removal hold over it.
    let restarted = engines(yaml, &state);
    let priced = planned_price(&restarted, "claude-opus-6").await;
    assert_eq!(
        (priced.source, priced.price.input_per_mtok),
        (PriceSource::Operator, 7.0)
    );
    let priced = planned_price(&restarted, "claude-sonnet-5-5").await;
    assert_eq!(
        (priced.source, priced.price.input_per_mtok),
        (PriceSource::Catalogue, 2.0)
    );
}

#[tokio::test]
async fn usage_shows_each_models_usage_with_the_price_it_was_charged_at() {
    use poolgate_core::price::PriceSource;
    let scratch = poolgate_testkit::Scratch::new("model-usage").expect("scratch");
    let state = scratch.path().join("state.json");
    let yaml = "api_keys:\n  - {key: key-a, user: alice}\n\
                accounts:\n  - {name: a, platform: anthropic, base_url: \"http://127.0.0.1:9\", api_key: sk-x}\n";
    let relay = engines(yaml, &state);
    let record = |model: &str, source: Option<PriceSource>, cost_usd: f64| {
        poolgate_select::source::UsageInput {
            api_key_id: Some(1),
            user: "alice".into(),
            model: model.into(),
            input_tokens: 10,
            output_tokens: 7,
            cost_usd,
            price_source: source,
            status: 200,
            ..Default::default()
        }
    };
    relay
        .source
        .insert_usage(&[
            record("claude-opus-6", Some(PriceSource::Fallback), 0.5),
            record("claude-opus-6", Some(PriceSource::Fallback), 0.25),
            record("claude-haiku-5-5", Some(PriceSource::Catalogue), 0.01),
            record("claude-x", None, 0.0),
        ])
        .await
        .expect("taken");
    relay.source.flush().await.expect("written");
    drop(relay);
    // Kept across a restart, per model and price.
    let restarted = engines(yaml, &state);
    let admin = served(&restarted).await;
    let text = poolgate_operator::execute(&admin, &verb(&["usage", "1"]))
        .await
        .expect("usage");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("1\talice\trequests=4\t"), "{text}");
    assert_eq!(
        lines[1..],
        [
            "1\talice\tmodel=claude-haiku-5-5\tprice=catalogue\trequests=1\tinput_tokens=10\toutput_tokens=7\tcost_usd=0.010000",
            "1\talice\tmodel=claude-opus-6\tprice=fallback\trequests=2\tinput_tokens=20\toutput_tokens=14\tcost_usd=0.750000",
            "1\talice\tmodel=claude-x\tprice=unknown\trequests=1\tinput_tokens=10\toutput_tokens=7\tcost_usd=0.000000",
        ]
    );
}
