//! `window-stack`: usage windows on the real stack (docs/BENCHMARKS.md "Usage
//! windows"), the simulation's scenario scaled down to two minutes. The fake upstream gives 4
//! credentials short windows (a "5-hour" window of 25 requests per 20 s, a "week" of 40 requests
//! per 120 s whose resets are staggered at 1/7, 3/7, 5/7 and 7/7 of a week from the start and
//! whose starting utilization is 60, 30, 10 and 0 %), reports them on every answer in
//! Anthropic's `anthropic-ratelimit-unified-*` headers and refuses with its 429 once one is used
//! up. A relay (standalone, or with `--distributed` over a selector and admission on private
//! Postgres and Redis) serves sessions of Anthropic Messages requests (`metadata.user_id` per
//! session) through it. A transparent tap between relay and upstream records every upstream
//! answer: which credential served which request, its status, and the window headers, i.e. the
//! upstream's own account of each credential's budget as of the request it answers. "Room"
//! below is what those headers said (a window past its announced reset counts as empty).
//!
//! Anthropic's headers do not state a window's length, so the relay takes the real ones (5 hours,
//! 7 days): at this scale every week with something left counts as expiring, ranked by share
//! left over time to reset (the same order as with the real length), and weeks shed nothing
//! until used up; the 5-hour window sheds as usual (the fake says `allowed_warning` from 80 %).
//!
//! ```text
//! cargo run --release -p poolgate-bench --bin window-stack -- [--quick] [--distributed] [--seed N] [--rate R]
//! ```

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use clap::Parser;
use poolgate_core::now_ms;
use poolgate_stack as stack;
use poolgate_testkit::fake_upstream::{FakeUpstream, Window, WindowBudgets, WindowUnit, is_probe};
use relay_svc::proxy::{Relay, RelaySettings};
use serde_json::{Value, json};

#[path = "window_stack/report.rs"]
mod report;

use report::report;

#[derive(Debug, Parser)]
struct Args {
    /// Everything four times faster (windows, gaps, latency): ~40 s instead of ~2.5 min.
    #[arg(long)]
    quick: bool,
    /// The relay in distributed mode (selector and admission over gRPC, private Postgres and
    /// Redis): the readings travel in `RecordWindows` calls.
    #[arg(long)]
    distributed: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Requests offered per second at full scale (sessions arrive at rate / 4).
    #[arg(long, default_value_t = 1.5)]
    rate: f64,
}

const NAMES: [&str; 4] = ["a", "b", "c", "d"];
const FIVE_HOUR_CAPACITY: u64 = 25;
const WEEK_CAPACITY: u64 = 40;
const FIVE_HOUR_S: f64 = 20.0;
const WEEK_S: f64 = 120.0;
/// Each account's first weekly reset after the start, in weeks (the scenario's days 1, 3, 5, 7).
const FIRST_RESET: [f64; 4] = [1.0 / 7.0, 3.0 / 7.0, 5.0 / 7.0, 1.0];
/// Each account's weekly utilization at the start.
const START_USED: [f64; 4] = [0.6, 0.3, 0.1, 0.0];
/// Load is offered for this long, in weeks (so that the last account's reset falls inside).
const RUN_WEEKS: f64 = 1.05;
/// Requests per session (uniform, inclusive) and the pause between two of them, in seconds.
const SESSION_REQUESTS: (u32, u32) = (2, 6);
const GAP_S: (f64, f64) = (1.5, 4.5);
/// The fake upstream's answer latency.
const LATENCY_MS: f64 = 300.0;
/// At full scale, the timeline's step.
const STEP_S: f64 = 10.0;
const MODEL: &str = "claude-sonnet-4-5";
const CLIENT_KEY: &str = "window-stack-key";

fn credential(index: usize) -> String {
    format!("cred-{}", NAMES[index])
}

/// One window as an answer reported it.
#[derive(Debug, Clone, Copy)]
struct Reading {
    used: f64,
    reset_ms: i64,
}

/// One upstream answer, as the tap saw it.
#[derive(Debug, Clone)]
struct Attempt {
    /// When the relay's request reached the tap, and when the answer came back.
    sent_ms: i64,
    at_ms: i64,
    account: Option<usize>,
    status: u16,
    /// The client request it served (the bench's sequence number; the prefill's are 0).
    seq: Option<u64>,
    probe: bool,
    five: Option<Reading>,
    week: Option<Reading>,
}

impl Attempt {
    fn has_reading(&self) -> bool {
        self.five.is_some() || self.week.is_some()
    }
}

/// Sits between the relay and the fake upstream, passes everything through, and logs answers.
struct Tap {
    upstream: String,
    http: reqwest::Client,
    log: Mutex<Vec<Attempt>>,
}

fn reading(headers: &reqwest::header::HeaderMap, tag: &str) -> Option<Reading> {
    let get = |field: &str| {
        headers
            .get(format!("anthropic-ratelimit-unified-{tag}-{field}"))
            .and_then(|v| v.to_str().ok())
    };
    Some(Reading {
        used: get("utilization")?.parse().ok()?,
        reset_ms: get("reset")?.parse::<i64>().ok()?.saturating_mul(1000),
    })
}

fn account_of(headers: &HeaderMap) -> Option<usize> {
    let key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        })?;
    (0..NAMES.len()).find(|&i| credential(i) == key)
}

/// The bench's sequence number, from the first user turn (`req <seq>`).
fn seq_of(request: &Value) -> Option<u64> {
    request
        .pointer("/messages/0/content")
        .and_then(Value::as_str)?
        .strip_prefix("req ")?
        .parse()
        .ok()
}

const HOP: [&str; 4] = ["host", "content-length", "connection", "transfer-encoding"];

async fn pass(
    State(tap): State<Arc<Tap>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut forward = HeaderMap::new();
    for (name, value) in &headers {
        if !HOP.contains(&name.as_str()) {
            forward.append(name.clone(), value.clone());
        }
    }
    let sent_ms = now_ms();
    let answer = match tap
        .http
        .request(method, format!("{}{path}", tap.upstream))
        .headers(forward)
        .body(body)
        .send()
        .await
    {
        Ok(answer) => answer,
        Err(error) => return (StatusCode::BAD_GATEWAY, error.to_string()).into_response(),
    };
    let status = answer.status();
    let mut back = HeaderMap::new();
    for (name, value) in answer.headers() {
        if !HOP.contains(&name.as_str()) {
            back.append(name.clone(), value.clone());
        }
    }
    let attempt = Attempt {
        sent_ms,
        at_ms: 0,
        account: account_of(&headers),
        status: status.as_u16(),
        seq: seq_of(&request),
        probe: is_probe(uri.path(), &request),
        five: reading(answer.headers(), "5h"),
        week: reading(answer.headers(), "7d"),
    };
    let bytes = answer.bytes().await.unwrap_or_default();
    {
        // Stamped under the lock: the log is in time order.
        let mut log = tap.log.lock().unwrap_or_else(|p| p.into_inner());
        log.push(Attempt {
            at_ms: now_ms(),
            ..attempt
        });
    }
    (status, back, bytes).into_response()
}

/// The scenario at one time scale: every duration is multiplied by `scale`, and so the rates
/// divided by it.
#[derive(Debug, Clone, Copy)]
struct Setup {
    scale: f64,
    /// Requests offered per second at full scale.
    rate: f64,
}

impl Setup {
    fn ms(&self, seconds: f64) -> i64 {
        (seconds * self.scale * 1000.0).round() as i64
    }

    fn duration(&self, seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds * self.scale)
    }

    /// Account `index`'s weekly schedule: periods start at `anchor + k·week`.
    fn anchor_ms(&self, start_ms: i64, index: usize) -> i64 {
        start_ms + self.ms(FIRST_RESET[index] * WEEK_S) - self.ms(WEEK_S)
    }
}

/// The upstream's word on account `index` as it stood at `at_ms`: the answer to the request it
/// admitted last by then (an answer's headers say where the account stood when the fake
/// admitted the request, which answers arriving out of order do not tell).
fn state_at(log: &[Attempt], index: usize, at_ms: i64) -> Option<&Attempt> {
    log.iter()
        .filter(|a| a.account == Some(index) && a.has_reading() && a.sent_ms <= at_ms)
        .max_by_key(|a| a.sent_ms)
}

/// What the upstream's last word says is left of account `index` at `at_ms`, in requests:
/// a window past its reset is empty; an account never answered has its starting budget.
fn left(log: &[Attempt], index: usize, at_ms: i64) -> u64 {
    let last = state_at(log, index, at_ms);
    let Some(last) = last else {
        return FIVE_HOUR_CAPACITY.min(WEEK_CAPACITY);
    };
    let of = |reading: Option<Reading>, capacity: u64| match reading {
        Some(r) if r.reset_ms > at_ms => ((1.0 - r.used) * capacity as f64).round().max(0.0) as u64,
        _ => capacity,
    };
    of(last.five, FIVE_HOUR_CAPACITY).min(of(last.week, WEEK_CAPACITY))
}

/// How long after `at_ms` some account has room again by the upstream's last word: 0 when one
/// has room at `at_ms`, else the earliest moment an account's used-up windows have all reset.
fn room_again_in(log: &[Attempt], at_ms: i64) -> i64 {
    (0..NAMES.len())
        .map(|index| {
            let last = state_at(log, index, at_ms);
            last.map_or(0, |a| {
                [a.five, a.week]
                    .into_iter()
                    .flatten()
                    .filter(|r| r.used >= 1.0 && r.reset_ms > at_ms)
                    .map(|r| r.reset_ms - at_ms)
                    .max()
                    .unwrap_or(0)
            })
        })
        .min()
        .unwrap_or(0)
}

/// The highest utilization of account `index`'s windows at `at_ms` (a window past its reset:
/// 0), from the upstream's last word.
fn used(log: &[Attempt], index: usize, at_ms: i64) -> (f64, f64) {
    let last = state_at(log, index, at_ms);
    let of = |reading: Option<Reading>| match reading {
        Some(r) if r.reset_ms > at_ms => r.used,
        _ => 0.0,
    };
    last.map_or((0.0, START_USED[index]), |a| (of(a.five), of(a.week)))
}

/// One client request and how it ended.
#[derive(Debug, Clone)]
struct Sent {
    seq: u64,
    session: usize,
    started_ms: i64,
    done_ms: i64,
    status: u16,
    error: String,
}

/// A session: when it starts, and its requests, each with the pause after it.
struct Session {
    start: Duration,
    gaps: Vec<Duration>,
}

fn sessions(setup: &Setup, seed: u64) -> Vec<Session> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mean = f64::from(SESSION_REQUESTS.0 + SESSION_REQUESTS.1) / 2.0;
    let per_second = setup.rate / mean;
    let mut at = 0.0;
    let mut out = Vec::new();
    loop {
        at += -rng.f64().max(1e-12).ln() / per_second;
        if at >= WEEK_S * RUN_WEEKS {
            return out;
        }
        let requests = rng.u32(SESSION_REQUESTS.0..=SESSION_REQUESTS.1);
        let gaps = (0..requests)
            .map(|_| setup.duration(GAP_S.0 + rng.f64() * (GAP_S.1 - GAP_S.0)))
            .collect();
        out.push(Session {
            start: setup.duration(at),
            gaps,
        });
    }
}

fn body(seq: u64, session: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": MODEL,
        "max_tokens": 64,
        "metadata": {"user_id": format!("user_bench_account_pool_session_{session}")},
        "messages": [{"role": "user", "content": format!("req {seq}")}],
    }))
    .unwrap_or_default()
}

async fn send(client: &reqwest::Client, url: &str, key: &str, body: Vec<u8>) -> (u16, String) {
    match client
        .post(url)
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
    {
        Ok(response) => {
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            let error = serde_json::from_str::<Value>(&text)
                .ok()
                .map(|v| {
                    let field = |name: &str| {
                        v.pointer(&format!("/error/{name}"))
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned()
                    };
                    format!("{} \"{}\"", field("type"), field("message"))
                })
                .unwrap_or_default();
            (status, error)
        }
        Err(error) => (0, format!("transport: {error}")),
    }
}

/// The relay under test: its handle, the URL clients use, the key they send, and the
/// selector's metrics when it runs apart.
struct Stack {
    relay: Arc<Relay>,
    url: String,
    key: String,
    selector: Option<selector_svc::server::Built>,
    _backends: Option<stack::Backends>,
}

impl Stack {
    fn metrics(&self) -> String {
        let mut text = self.relay.metrics.render();
        if let Some(built) = &self.selector {
            text.push_str(&built.selector.metrics().render());
        }
        text
    }
}

async fn standalone(base: &str) -> Result<Stack, String> {
    let accounts: String = NAMES
        .iter()
        .map(|name| {
            format!(
                "  - {{name: {name}, platform: anthropic, base_url: \"{base}\", api_key: cred-{name}, concurrency: 8}}\n"
            )
        })
        .collect();
    let yaml = format!(
        "api_keys:\n  - {{key: {CLIENT_KEY}, group: default, user: bench}}\naccounts:\n{accounts}prices:\n  - {{model: {MODEL}, input: 3, output: 15}}\n"
    );
    let (relay, address) =
        stack::standalone(&yaml, RelaySettings::default(), Default::default()).await?;
    Ok(Stack {
        relay,
        url: format!("http://{address}/v1/messages"),
        key: CLIENT_KEY.into(),
        selector: None,
        _backends: None,
    })
}

async fn distributed(base: &str) -> Result<Stack, String> {
    let backends = stack::backends().await?;
    for name in NAMES {
        backends
            .store
            .upsert_account(&stack::account(name, base, 8, 0))
            .await
            .map_err(|e| e.to_string())?;
    }
    let (_, key) = backends
        .store
        .create_api_key("bench", "bench", "default", 0)
        .await
        .map_err(|e| e.to_string())?;
    let (selector, selector_addr) = stack::selector(&backends).await?;
    let (_admission, admission_addr) =
        stack::admission(&backends.redis.url(), Default::default()).await?;
    let (relay, address) = stack::relay_with_handle(
        vec![format!("http://{selector_addr}")],
        vec![format!("http://{admission_addr}")],
        RelaySettings::default(),
    )
    .await?;
    Ok(Stack {
        relay,
        url: format!("http://{address}/v1/messages"),
        key: key.expose().to_owned(),
        selector: Some(selector),
        _backends: Some(backends),
    })
}

fn epoch(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

async fn run(args: Args) -> Result<(), String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let setup = Setup {
        scale: if args.quick { 0.25 } else { 1.0 },
        rate: args.rate,
    };
    let upstream = FakeUpstream::start().await.map_err(|e| e.to_string())?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(120))
        .build()
        .map_err(|e| e.to_string())?;
    let tap = Arc::new(Tap {
        upstream: upstream.base_url.clone(),
        http: http.clone(),
        log: Mutex::new(Vec::new()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let tap_url = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    let router = Router::new().fallback(pass).with_state(tap.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let stack = if args.distributed {
        distributed(&tap_url).await?
    } else {
        standalone(&tap_url).await?
    };

    // The weeks before the run: each account's starting utilization, sent straight to the
    // upstream (the relay never sees these answers). They start a 5-hour window too, which has
    // ended by the time the load starts.
    let prefill_at = now_ms();
    let start_ms = prefill_at + setup.ms(FIVE_HOUR_S) + 1_000;
    for (index, used) in START_USED.iter().enumerate() {
        upstream.set_windows(
            &credential(index),
            WindowBudgets {
                unit: WindowUnit::Requests,
                five_hour: Some(Window::new(setup.duration(FIVE_HOUR_S), FIVE_HOUR_CAPACITY)),
                weekly: Some(Window::new(setup.duration(WEEK_S), WEEK_CAPACITY)),
                weekly_anchor: Some(epoch(setup.anchor_ms(start_ms, index))),
                per_minute: None,
                models: Vec::new(),
            },
        );
        let prefill = (used * WEEK_CAPACITY as f64).round() as u64;
        for _ in 0..prefill {
            let (status, _) = send(
                &http,
                &format!("{tap_url}/v1/messages"),
                &credential(index),
                body(0, "prefill"),
            )
            .await;
            if status != 200 {
                return Err(format!("prefill of account {}: {status}", NAMES[index]));
            }
        }
    }
    upstream.set_delay(Duration::from_secs_f64(LATENCY_MS / 1000.0 * setup.scale));
    let mode = if args.distributed {
        "distributed (selector + admission over gRPC, Postgres, Redis)"
    } else {
        "standalone"
    };
    println!(
        "window-stack: relay {mode}, seed {}, {} req/s offered for {:.0} s{}",
        args.seed,
        setup.rate / setup.scale,
        WEEK_S * RUN_WEEKS * setup.scale,
        if args.quick {
            " (quick: 4x faster)"
        } else {
            ""
        }
    );
    println!(
        "  4 accounts; 5-hour-like window {FIVE_HOUR_CAPACITY} req / {:.0} s, weekly-like {WEEK_CAPACITY} req / {:.0} s; weekly starts at {:?} used, resets at {:?} s",
        FIVE_HOUR_S * setup.scale,
        WEEK_S * setup.scale,
        START_USED,
        FIRST_RESET.map(|r| (r * WEEK_S * setup.scale).round())
    );
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(start_ms - now_ms()).unwrap_or(0),
    ))
    .await;

    // The load: sessions at Poisson arrivals, each a few requests under one session id.
    let run_end_ms = start_ms + setup.ms(WEEK_S * RUN_WEEKS);
    let plan = sessions(&setup, args.seed);
    let sent = Arc::new(Mutex::new(Vec::<Sent>::new()));
    let next_seq = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let mut tasks = Vec::new();
    for (number, session) in plan.iter().enumerate() {
        let (client, url, key) = (http.clone(), stack.url.clone(), stack.key.clone());
        let (sent, next_seq) = (sent.clone(), next_seq.clone());
        let (start, gaps) = (session.start, session.gaps.clone());
        let id = format!("{}-{number}", args.seed);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(start).await;
            for gap in gaps {
                if now_ms() >= run_end_ms {
                    break;
                }
                let seq = next_seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let started_ms = now_ms();
                let (status, error) = send(&client, &url, &key, body(seq, &id)).await;
                sent.lock().unwrap_or_else(|p| p.into_inner()).push(Sent {
                    seq,
                    session: number,
                    started_ms,
                    done_ms: now_ms(),
                    status,
                    error,
                });
                tokio::time::sleep(gap).await;
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    // Let the last readings land (distributed: the 50 ms batches, the 200 ms cache).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let metrics = stack.metrics();
    let log = tap.log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut sent = sent.lock().unwrap_or_else(|p| p.into_inner()).clone();
    sent.sort_by_key(|s| s.seq);
    report(
        &setup,
        &upstream,
        &log,
        &sent,
        plan.len(),
        start_ms,
        run_end_ms,
    );
    println!("relay /metrics (usage windows, failovers):");
    for line in metrics.lines().filter(|l| {
        !l.starts_with('#')
            && (l.starts_with("selector_window_")
                || l.starts_with("relay_window_")
                || l.starts_with("relay_failovers_total"))
    }) {
        println!("  {line}");
    }
    if !metrics.contains("relay_window_writes_total{") {
        println!(
            "  (no relay_window_writes_total: {})",
            if args.distributed {
                "no RecordWindows call was made"
            } else {
                "standalone hands readings over in process"
            }
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("window-stack: {error}");
            ExitCode::FAILURE
        }
    }
}
