//! The chart's Grafana dashboard and alert rules query only metrics the services export
//! (docs/METRICS.md, "Dashboard and alerts"): the distributed stack runs with every service's
//! `/metrics` on its own listener, takes a little traffic (a success, an exhausted window that
//! hard-blocks an account, a 5xx that starts a confirmation), and every metric name read from
//! `helm/poolgate/dashboards/*.json` and the `expr:` lines of the PrometheusRule template must
//! appear in some service's scrape. On the way, the hard block shows in
//! `selector_accounts{status="hard_blocked"}` and lowers `selector_group_eligible`. A
//! standalone relay, which embeds the engines, exports the status gauges and the added latency
//! too.

use crate::common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use poolgate_core::account::Price;
use poolgate_rpc::service_auth::CallerCheck;
use poolgate_runtime::redis::{RedisOptions, RedisTarget};
use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::{FakeUpstream, Scripted};
use relay_svc::proxy::RelaySettings;
use relay_svc::server::Mode;
use relay_svc::standalone::StandaloneFile;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// PromQL functions, aggregations and keywords: never metric names.
const PROMQL_WORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "rate",
    "irate",
    "increase",
    "delta",
    "idelta",
    "deriv",
    "histogram_quantile",
    "abs",
    "absent",
    "ceil",
    "floor",
    "round",
    "clamp_min",
    "clamp_max",
    "vector",
    "scalar",
    "time",
    "label_replace",
    "label_join",
    "sort",
    "sort_desc",
    "changes",
    "resets",
    "avg_over_time",
    "max_over_time",
    "min_over_time",
    "sum_over_time",
    "count_over_time",
    "last_over_time",
    "inf",
    "nan",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Removes the spans between `open` and its matching `close` (not nested across kinds).
fn strip_between(text: &str, open: char, close: char) -> String {
    let mut out = String::with_capacity(text.len());
    let mut depth = 0usize;
    for c in text.chars() {
        if c == open {
            depth += 1;
        } else if c == close && depth > 0 {
            depth -= 1;
        } else if depth == 0 {
            out.push(c);
        }
    }
    out
}

/// The metric names a PromQL expression reads: identifiers outside label matchers (`{…}`),
/// ranges (`[…]`), strings and grouping lists (`by (…)` …), that are not followed by `(` (a
/// function) and are not PromQL words.
fn promql_metrics(expr: &str) -> BTreeSet<String> {
    let mut text = expr.to_owned();
    // Strings first (a label value may hold anything), then matchers and ranges.
    let mut unquoted = String::new();
    let mut quoted = false;
    for c in text.chars() {
        if c == '"' {
            quoted = !quoted;
        } else if !quoted {
            unquoted.push(c);
        }
    }
    text = strip_between(&unquoted, '{', '}');
    text = strip_between(&text, '[', ']');
    // Grouping lists: `by (a, b)`, `on (a)`, `group_left (a)` name labels, not metrics.
    for word in [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ] {
        while let Some(at) = find_word_before_paren(&text, word) {
            let Some(close) = text[at..].find(')').map(|i| at + i) else {
                break;
            };
            text.replace_range(at..=close, " ");
        }
    }
    let chars: Vec<char> = text.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '$' || c == '.' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '_' | ':' | '$' | '.'))
            {
                i += 1;
            }
            let token: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            let is_name = token
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && !token.contains(['$', '.'])
                && next != Some(&'(')
                && !PROMQL_WORDS.contains(&token.to_ascii_lowercase().as_str());
            if is_name {
                names.insert(token);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Where `word` starts as a whole word followed (after spaces) by `(`.
fn find_word_before_paren(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = text[from..].find(word) {
        let at = from + found;
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].trim_start().chars().next();
        let bounded = before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        if bounded && after == Some('(') {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// Every query of the dashboards and the alert rules, with where it came from.
fn queries() -> Vec<(String, String)> {
    let mut found = Vec::new();
    let dashboards = repo().join("helm/poolgate/dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dashboards)
        .unwrap_or_else(|e| panic!("{}: {e}", dashboards.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no dashboard under {}",
        dashboards.display()
    );
    for file in files {
        let text = std::fs::read_to_string(&file).expect("dashboard readable");
        let dashboard: Value = serde_json::from_str(&text).expect("dashboard JSON");
        let panels = dashboard["panels"].as_array().cloned().unwrap_or_default();
        for panel in panels {
            for target in panel["targets"].as_array().cloned().unwrap_or_default() {
                if let Some(expr) = target["expr"].as_str() {
                    found.push((
                        format!("{} panel {:?}", file.display(), panel["title"]),
                        expr.to_owned(),
                    ));
                }
            }
        }
    }
    let rules = repo().join("helm/poolgate/templates/prometheusrule.yaml");
    let text = std::fs::read_to_string(&rules).expect("rules template readable");
    let mut exprs = 0;
    for line in text.lines() {
        if let Some(expr) = line.trim_start().strip_prefix("expr:") {
            // The chart's own `{{ … }}` (thresholds, windows) is not PromQL.
            let mut expr = expr.to_owned();
            while let (Some(open), Some(close)) = (expr.find("{{"), expr.find("}}")) {
                if close < open {
                    break;
                }
                expr.replace_range(open..close + 2, "1");
            }
            found.push((format!("{} rule", rules.display()), expr));
            exprs += 1;
        }
    }
    assert!(exprs >= 9, "expected the nine alert rules, read {exprs}");
    found
}

/// The metric names a `/metrics` scrape exports (its `# TYPE` lines and its samples).
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.split_whitespace().next() {
                names.insert(name.to_owned());
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            names.insert(name.to_owned());
        }
    }
    names
}

fn is_exported(name: &str, names: &BTreeSet<String>) -> bool {
    names.contains(name)
        || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| names.contains(base))
        })
}

async fn listen() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    (listener, address)
}

async fn scrape(http: &reqwest::Client, address: SocketAddr) -> String {
    let response = http
        .get(format!("http://{address}/metrics"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("scrape {address}: {e}"));
    assert!(response.status().is_success(), "scrape {address}");
    response.text().await.expect("metrics text")
}

/// The value of `name{labels}` in a scrape (labels in any order).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            if metric != name {
                return None;
            }
            let mut found: Vec<(&str, &str)> = rest
                .strip_suffix('}')?
                .split(',')
                .filter(|pair| !pair.is_empty())
                .filter_map(|pair| {
                    let (key, value) = pair.split_once('=')?;
                    Some((key, value.trim_matches('"')))
                })
                .collect();
            let mut wanted = labels.to_vec();
            found.sort_unstable();
            wanted.sort_unstable();
            (found == wanted).then(|| value.parse().ok()).flatten()
        })
}

/// A relay (`mode`) through `relay_svc::run`, with `/metrics` on its own listener: its client
/// and metrics addresses.
async fn relay(mode: Mode) -> (SocketAddr, SocketAddr) {
    let (client, client_address) = listen().await;
    let (metrics, metrics_address) = listen().await;
    let config = relay_svc::run::Config {
        server: relay_svc::server::Config {
            mode,
            relay: RelaySettings {
                max_wait: Duration::from_secs(5),
                ..RelaySettings::default()
            },
            blocks: Default::default(),
            admission: Default::default(),
            shutdown_grace: Duration::from_secs(1),
        },
        admin_token: None,
    };
    let listeners = relay_svc::run::Listeners {
        client,
        metrics: Some(metrics),
        admin: None,
    };
    tokio::spawn(relay_svc::run(config, listeners, std::future::pending()));
    (client_address, metrics_address)
}

/// A request with its own conversation (no sticky session keeps it on one account).
async fn message(http: &reqwest::Client, base: SocketAddr, key: &str) -> (u16, String) {
    let text = format!("hi {}", fastrand::u64(..));
    let response = http
        .post(format!("http://{base}/v1/messages"))
        .header("x-api-key", key)
        .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": text}]}))
        .send()
        .await
        .expect("relay answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// An answer whose 5-hour window is used up for two hours: the account is hard-blocked.
fn exhausted() -> Scripted {
    let reset = (poolgate_core::now_ms() / 1000 + 7200).to_string();
    Scripted::Fail {
        status: 429,
        headers: vec![
            (
                "anthropic-ratelimit-unified-status".into(),
                "rejected".into(),
            ),
            ("anthropic-ratelimit-unified-reset".into(), reset),
        ],
        body: r#"{"type":"error","error":{"type":"rate_limit_error","message":"window"}}"#.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_alerts_query_is_exported() {
    let backends = common::backends().await.expect("backends start");
    let upstream = FakeUpstream::start().await.expect("upstream");
    for name in ["a", "b", "c"] {
        backends
            .store
            .upsert_account(&common::account(name, &upstream.base_url, 2, 0))
            .await
            .expect("account");
    }
    backends
        .store
        .set_price(
            "claude-x",
            Price {
                input_per_mtok: 3.0,
                output_per_mtok: 15.0,
                ..Price::default()
            },
        )
        .await
        .expect("price");
    let (_, key) = backends
        .store
        .create_api_key("test", "alice", "default", 0)
        .await
        .expect("key");

    // The selector, with its /metrics.
    let config = selector_svc::server::Config {
        usage_retention: None,
        database_url: backends.postgres.url(),
        redis_target: RedisTarget::Single(backends.redis.url()),
        redis_options: RedisOptions::default(),
        keyring: backends.keyring.clone(),
        admin_token: Some("admin".into()),
        admin_http_listen: None,
        settings: Default::default(),
        lease_settings: Default::default(),
        refresh: Default::default(),
        reload_interval: Duration::from_secs(3600),
        refresh_interval: Duration::from_secs(3600),
        max_concurrent_streams: 1000,
        tls: None,
        callers: CallerCheck::Token(common::SERVICE_TOKEN.into()),
    };
    let built = selector_svc::server::build(&config, poolgate_select::metrics::Metrics::new())
        .await
        .expect("selector builds");
    let (selector_listener, selector_address) = listen().await;
    let (selector_metrics, selector_metrics_address) = listen().await;
    let serving = built.serving();
    tokio::spawn(async move {
        let _ = selector_svc::server::serve_selector(
            serving,
            &config,
            selector_listener,
            Some(selector_metrics),
            std::future::pending(),
        )
        .await;
    });

    // Admission, with its /metrics.
    let admission_config = admission_svc::Config {
        backend: poolgate_lease::LeaseStore::Redis {
            target: RedisTarget::Single(backends.redis.url()),
            options: RedisOptions::default(),
            policy: Default::default(),
        },
        callers: CallerCheck::Token(common::SERVICE_TOKEN.into()),
        ..admission_svc::Config::default()
    };
    let engine = admission_svc::server::build_engine(
        &admission_config,
        poolgate_lease::metrics::Metrics::new(),
    )
    .await
    .expect("admission builds");
    let (admission_listener, admission_address) = listen().await;
    let (admission_metrics, admission_metrics_address) = listen().await;
    tokio::spawn(async move {
        let _ = admission_svc::server::serve(
            engine,
            &admission_config,
            admission_listener,
            Some(admission_metrics),
            std::future::pending(),
        )
        .await;
    });

    let (relay_address, relay_metrics_address) = relay(Mode::Remote {
        selector: vec![format!("http://{selector_address}")],
        admission: vec![format!("http://{admission_address}")],
        client: relay_svc::remote::GrpcClient {
            service_token: Some(common::SERVICE_TOKEN.into()),
            ..Default::default()
        },
        edge: Some(Default::default()),
    })
    .await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let key = key.expose().to_owned();

    // Before any traffic: three accounts, all eligible.
    let eligible = |want: f64| {
        let http = http.clone();
        async move {
            let text = scrape(&http, selector_metrics_address).await;
            (sample(&text, "selector_group_eligible", &[("group", "default")]) == Some(want))
                .then_some(text)
        }
    };
    eventually(Duration::from_secs(20), || eligible(3.0))
        .await
        .expect("three eligible accounts before any traffic");

    // A success, then an exhausted window on `a` (hard-blocked; the request fails over), then a
    // 5xx on `b` (a confirmation starts), until each has happened.
    let (status, body) = message(&http, relay_address, &key).await;
    assert_eq!(status, 200, "{body}");
    let before = |credential: &str| upstream.stats(credential).total;
    let (a_before, b_before) = (before("cred-a"), before("cred-b"));
    upstream.script_clients("cred-a", [exhausted()]);
    upstream.script_clients(
        "cred-b",
        [Scripted::Fail {
            status: 500,
            headers: Vec::new(),
            body: r#"{"type":"error","error":{"type":"api_error","message":"boom"}}"#.into(),
        }],
    );
    // Until both scripted answers went out (the plan order is weighted at random).
    for _ in 0..50 {
        if before("cred-a") > a_before && before("cred-b") > b_before {
            break;
        }
        let (status, body) = message(&http, relay_address, &key).await;
        assert_eq!(status, 200, "a sibling serves: {body}");
    }
    assert!(
        before("cred-a") > a_before && before("cred-b") > b_before,
        "the scripted failures were never asked"
    );
    // The hard block shows as `hard_blocked` and lowers the eligible count (the gauges are
    // recomputed every few seconds).
    let text = eventually(Duration::from_secs(20), || {
        let http = http.clone();
        async move {
            let text = scrape(&http, selector_metrics_address).await;
            let hard = sample(
                &text,
                "selector_accounts",
                &[("group", "default"), ("status", "hard_blocked")],
            );
            let eligible = sample(&text, "selector_group_eligible", &[("group", "default")]);
            (hard == Some(1.0) && eligible.is_some_and(|e| e < 3.0)).then_some(text)
        }
    })
    .await
    .unwrap_or_else(|error| {
        panic!("the exhausted window never showed as a hard block in selector_accounts: {error}")
    });
    // Every status is exported for the group, 0 included.
    for status in poolgate_core::health::LiveStatus::ALL {
        assert!(
            sample(
                &text,
                "selector_accounts",
                &[("group", "default"), ("status", status.label())]
            )
            .is_some(),
            "selector_accounts{{status={:?}}} missing:\n{text}",
            status.label()
        );
    }

    // Every metric queried is exported by some service.
    let mut names = BTreeSet::new();
    for address in [
        selector_metrics_address,
        admission_metrics_address,
        relay_metrics_address,
    ] {
        names.extend(exported(&scrape(&http, address).await));
    }
    let mut missing = Vec::new();
    let mut queried = BTreeSet::new();
    for (source, expr) in queries() {
        for name in promql_metrics(&expr) {
            if !is_exported(&name, &names) {
                missing.push(format!("{name} ({source}: {expr})"));
            }
            queried.insert(name);
        }
    }
    assert!(
        queried.len() >= 15,
        "the queries name too few metrics ({queried:?}): the extraction is broken"
    );
    assert!(
        missing.is_empty(),
        "queried but exported by no service:\n{}",
        missing.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_relay_exports_the_status_gauges_and_the_added_latency() {
    let upstream = FakeUpstream::start().await.expect("upstream");
    let yaml = format!(
        "api_keys:\n  - {{key: k1}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{}\", api_key: cred-a}}\n  - {{name: b, platform: anthropic, base_url: \"{}\", api_key: cred-b}}\n",
        upstream.base_url, upstream.base_url
    );
    let file = StandaloneFile::parse(&yaml).expect("standalone file");
    let (address, metrics_address) = relay(Mode::Standalone {
        file: Arc::new(file),
        state_file: None,
    })
    .await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let (status, body) = message(&http, address, "k1").await;
    assert_eq!(status, 200, "{body}");
    let text = eventually(Duration::from_secs(20), || {
        let http = http.clone();
        async move {
            let text = scrape(&http, metrics_address).await;
            (sample(&text, "selector_group_eligible", &[("group", "default")]) == Some(2.0))
                .then_some(text)
        }
    })
    .await
    .expect("the standalone relay exports selector_group_eligible");
    assert_eq!(
        sample(
            &text,
            "selector_accounts",
            &[("group", "default"), ("status", "active")]
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "relay_added_seconds_count",
            &[("platform", "anthropic")]
        ),
        Some(1.0),
        "one request reached an upstream: {text}"
    );
}

#[test]
fn promql_names_are_read_without_functions_labels_or_ranges() {
    let names = promql_metrics(
        r#"histogram_quantile(0.99, sum by (le) (rate(relay_added_seconds_bucket{platform="x"}[5m]))) > 1 and on (group) max by (group, status) (selector_accounts{status=~"a|b"}) offset 5m"#,
    );
    let want: BTreeSet<String> = ["relay_added_seconds_bucket", "selector_accounts"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(names, want);
    let exported_names: BTreeSet<String> = ["relay_added_seconds".to_string()].into();
    assert!(is_exported("relay_added_seconds_bucket", &exported_names));
    assert!(!is_exported("selector_accounts", &exported_names));
}
