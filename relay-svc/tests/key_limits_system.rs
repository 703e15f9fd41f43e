//! A client key's limits as a system (docs/DESIGN.md §4 "Client key limits", §6): what key_limits.rs checks on one relay, here across relays, across a crash and
//! through the official CLIs.
//!
//! 1. A total budget spent by concurrent clients over two relays on one admission/selector
//!    stack is overspent by at most the requests in flight when it ran out (at most the key's
//!    concurrency); after that every request on either relay is refused 402 and reaches no
//!    upstream.
//! 2. A relay killed (`kill -9`, a process) while holding both of a key's slots: the key's
//!    slots come back within the orphan grace (the lease streams ended with the process), not
//!    before it, and another relay then serves the key.
//! 3. Claude Code (`claude -p`) and Codex (`codex exec`), at their pinned versions, with a key
//!    whose budget is spent: each run exits non-zero, says why (the budget) and reaches no
//!    upstream. Claude Code asks the relay once. Codex does not honour `x-should-retry: false`:
//!    it reconnects `stream_max_retries` times (default 5, so 6 requests, every one refused), and
//!    once with `stream_max_retries = 0`. The CLIs come from `scripts/clients.sh` or
//!    `POOLGATE_CLIENTS_BIN`, as in clis.rs.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::processes::Env;
use poolgate_core::account::{Platform, Price};
use poolgate_core::lease::Settings;
use poolgate_operator::grpc::SelectorAdmin;
use poolgate_proto::selector::v1 as spb;
use poolgate_testkit::fake_upstream::{FakeUpstream, Scripted};
use poolgate_testkit::{Scratch, eventually, free_port};
use relay_svc::proxy::{Relay, RelaySettings};
use serde_json::{Value, json};

/// The fake upstream's answers: 10 input and 7 output tokens each.
const TOKENS_PER_ANSWER: u64 = 17;
/// USD per million tokens, input and output alike: an answer costs $1.70.
const PRICE_PER_MTOK: f64 = 100_000.0;
const COST_PER_ANSWER: f64 = TOKENS_PER_ANSWER as f64 * PRICE_PER_MTOK / 1e6;

/// An answer as the client got it.
struct Answered {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answered {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn message(&self) -> &str {
        self.body["error"]["message"].as_str().unwrap_or_default()
    }
}

/// A Messages request with `key` to the relay at `base`.
async fn send(http: &reqwest::Client, base: &str, key: &str) -> Answered {
    let response = http
        .post(format!("{base}/v1/messages"))
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("the relay answers");
    Answered {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body: response.json().await.unwrap_or(Value::Null),
    }
}

/// The key's self-service view.
async fn view(http: &reqwest::Client, base: &str, key: &str) -> Value {
    let response = http
        .get(format!("{base}/v1/poolgate/key"))
        .bearer_auth(key)
        .send()
        .await
        .expect("the relay answers");
    assert_eq!(response.status(), 200);
    response.json().await.expect("JSON")
}

/// Waits until the key's usage ledger shows `requests` served; returns the view.
async fn ledger_shows(http: &reqwest::Client, base: &str, key: &str, requests: usize) -> Value {
    eventually(Duration::from_secs(15), || async {
        let view = view(http, base, key).await;
        (view["usage"]["total"]["requests"] == requests as i64).then_some(view)
    })
    .await
    .unwrap_or_else(|error| panic!("{requests} requests in the usage ledger: {error}"))
}

/// `relay_key_refusals_total{reason}` of one relay.
fn refusals(relay: &Relay, reason: &str) -> u64 {
    relay
        .metrics
        .key_refusals
        .with_label_values(&[reason])
        .get()
}

/// `relay_requests_total`, every endpoint: each request that reached the relay's routes.
fn relay_requests(relay: &Relay) -> f64 {
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&relay.metrics.registry.gather())
        .expect("metrics encode");
    text.lines()
        .filter(|line| line.starts_with("relay_requests_total"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One selector, one admission replica and Postgres/Redis, in process, with an Anthropic
/// account (`cred-claude`, concurrency 8) and an OpenAI one (`cred-gpt`) on the fake upstream,
/// both models priced so an answer costs [`COST_PER_ANSWER`].
struct Stack {
    upstream: FakeUpstream,
    selector_url: String,
    admission_url: String,
    admin: poolgate_operator::grpc::AdminClient,
    _running: Box<dyn std::any::Any + Send>,
}

async fn stack(lease: Settings) -> Stack {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let backends = common::backends().await.expect("backends start");
    for (name, platform) in [("claude", Platform::Anthropic), ("gpt", Platform::OpenAi)] {
        let mut account = common::account(name, &upstream.base_url, 8, 0);
        account.platform = platform;
        backends
            .store
            .upsert_account(&account)
            .await
            .expect("account");
    }
    for model in ["claude-x", "gpt-x"] {
        let price = Price {
            input_per_mtok: PRICE_PER_MTOK,
            output_per_mtok: PRICE_PER_MTOK,
            ..Price::default()
        };
        backends.store.set_price(model, price).await.expect("price");
    }
    let (selector, selector_addr) = common::selector(&backends).await.expect("selector starts");
    let (admission, admission_addr) = common::admission(&backends.redis.url(), lease)
        .await
        .expect("admission starts");
    let selector_url = format!("http://{selector_addr}");
    let admin = SelectorAdmin::connect(&selector_url, "admin", Some(common::SERVICE_TOKEN))
        .await
        .expect("the admin API answers")
        .client();
    Stack {
        upstream,
        selector_url,
        admission_url: format!("http://{admission_addr}"),
        admin,
        _running: Box::new((backends, selector, admission)),
    }
}

impl Stack {
    /// A key made as an operator makes it: through the selector's admin API.
    async fn key(
        &mut self,
        user: &str,
        limits: impl FnOnce(&mut spb::CreateApiKeyRequest),
    ) -> String {
        let mut request = spb::CreateApiKeyRequest {
            user: user.into(),
            group: "default".into(),
            name: user.into(),
            ..Default::default()
        };
        limits(&mut request);
        self.admin
            .create_api_key(request)
            .await
            .expect("the key is created")
            .into_inner()
            .api_key
    }

    /// An in-process relay over the stack.
    async fn relay(&self, settings: RelaySettings) -> (Arc<Relay>, String) {
        let (relay, addr) = common::relay_with_handle(
            vec![self.selector_url.clone()],
            vec![self.admission_url.clone()],
            settings,
        )
        .await
        .expect("relay starts");
        (relay, format!("http://{addr}"))
    }

    fn upstream_requests(&self) -> usize {
        self.upstream.seen_requests().len()
    }
}

/// The budget of the key the clients share, in USD: about eighteen answers, a few rounds of the
/// clients.
const BUDGET_USD: f64 = 30.0;
/// Concurrent clients, split over the two relays; each sends one request at a time.
const CLIENTS: usize = 8;
/// The key's concurrency: what bounds its requests in flight. Without it the clients' number
/// would not: a relay answers the client before its release charges the spend (finish.rs spawns
/// it), so a client's next request can be admitted while its last one is still uncharged.
const KEY_CONCURRENCY: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_spent_over_two_relays_under_load_is_overspent_by_at_most_the_requests_in_flight()
{
    let mut stack = stack(Settings::default()).await;
    let key = stack
        .key("spender", |request| {
            request.key_budget_total_usd = BUDGET_USD;
            request.key_concurrency_limit = KEY_CONCURRENCY as i32;
        })
        .await;
    let (relay_a, base_a) = stack.relay(RelaySettings::default()).await;
    let (relay_b, base_b) = stack.relay(RelaySettings::default()).await;
    let relays = [
        (relay_a.clone(), base_a.clone()),
        (relay_b.clone(), base_b.clone()),
    ];
    // Slow enough that every client's request overlaps the others'.
    stack.upstream.set_delay(Duration::from_millis(150));
    let http = reqwest::Client::new();

    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (http, key) = (http.clone(), key.clone());
            let base = relays[client % 2].1.clone();
            tokio::spawn(async move {
                let mut served = 0usize;
                loop {
                    let answer = send(&http, &base, &key).await;
                    match answer.status {
                        200 => served += 1,
                        402 => {
                            assert_eq!(answer.header("x-should-retry"), Some("false"));
                            assert!(answer.message().contains("budget"), "{}", answer.body);
                            return served;
                        }
                        status => panic!("client {client}: {status} {}", answer.body),
                    }
                    assert!(served < 100, "client {client} was never refused");
                }
            })
        })
        .collect();
    let mut served_per_relay = [0usize; 2];
    for (client, task) in clients.into_iter().enumerate() {
        served_per_relay[client % 2] += task.await.expect("client task");
    }
    let ran_out_after = started.elapsed();
    let served = served_per_relay[0] + served_per_relay[1];
    let upstream_served = stack.upstream_requests();
    assert_eq!(
        upstream_served, served,
        "every answer the clients got came from the upstream, and nothing else reached it"
    );
    assert!(
        served_per_relay.iter().all(|n| *n > 0),
        "both relays spent from the budget: {served_per_relay:?}"
    );
    let peak = stack.upstream.stats("cred-claude").peak;
    assert!(
        (2..=KEY_CONCURRENCY as u32).contains(&peak),
        "the key's requests overlapped, within its concurrency: peak {peak}"
    );

    // The ledger records what was spent: every served request at its known cost.
    let view = ledger_shows(&http, &base_a, &key, served).await;
    let recorded = view["usage"]["total"]["cost_usd"]
        .as_f64()
        .expect("total cost in the view");
    assert!(
        (recorded - served as f64 * COST_PER_ANSWER).abs() < 1e-6,
        "ledger {recorded} for {served} answers: {view}"
    );
    let bound = BUDGET_USD + KEY_CONCURRENCY as f64 * COST_PER_ANSWER;
    assert!(
        recorded >= BUDGET_USD,
        "the budget ran out before it was refused: {recorded}"
    );
    assert!(
        recorded <= bound,
        "spent ${recorded:.2} ({served} answers) of a ${BUDGET_USD} budget: over the bound ${bound:.2} (budget + {KEY_CONCURRENCY} in flight × ${COST_PER_ANSWER})"
    );
    eprintln!(
        "{CLIENTS} clients over two relays, key concurrency {KEY_CONCURRENCY}: {served} answers ({served_per_relay:?}), ${recorded:.2} of ${BUDGET_USD}, bound ${bound:.2}, in {ran_out_after:?}"
    );

    // After it ran out, every request on either relay is refused and reaches no upstream.
    let refused_before = refusals(&relay_a, "budget") + refusals(&relay_b, "budget");
    assert!(refused_before >= CLIENTS as u64, "each client was refused");
    let before = stack.upstream_requests();
    for n in 0..10 {
        let base = &relays[n % 2].1;
        let answer = send(&http, base, &key).await;
        assert_eq!(answer.status, 402, "{}", answer.body);
        assert_eq!(answer.header("x-should-retry"), Some("false"));
    }
    assert_eq!(
        stack.upstream_requests(),
        before,
        "no refused request reached an upstream"
    );
    assert_eq!(
        refusals(&relay_a, "budget") + refusals(&relay_b, "budget"),
        refused_before + 10
    );
    let after = ledger_shows(&http, &base_b, &key, served).await;
    assert_eq!(
        after["usage"]["total"]["cost_usd"], view["usage"]["total"]["cost_usd"],
        "refusals charged nothing"
    );
}

/// Admission's lease timing for the kill test: a long TTL, so a slot that comes back within the
/// grace came back because the holder's stream ended, not because its lease expired.
const LEASE_TTL: Duration = Duration::from_secs(30);
const ORPHAN_GRACE: Duration = Duration::from_secs(3);
/// Slack on top of a deadline for a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(3);
/// How long relay B's requests wait for the key's slot.
const B_MAX_WAIT: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_holding_a_keys_slots_frees_them_within_the_orphan_grace() {
    let mut stack = stack(Settings {
        lease_ttl: LEASE_TTL,
        orphan_grace: ORPHAN_GRACE,
        ..Settings::default()
    })
    .await;
    let key = stack
        .key("pair", |request| request.key_concurrency_limit = 2)
        .await;
    let open = stack.key("open", |_| {}).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();

    // Relay A: the relay-svc binary, a process to kill.
    let (port, metrics_port) = (free_port().expect("port"), free_port().expect("port"));
    let env = Env { vars: vec![] };
    let relay_a = env.spawn(
        "relay-svc",
        "relay-a",
        &[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics-listen",
            &format!("127.0.0.1:{metrics_port}"),
            "--selector-url",
            &stack.selector_url,
            "--admission-url",
            &stack.admission_url,
        ],
    );
    let base_a = format!("http://127.0.0.1:{port}");
    eventually(Duration::from_secs(30), || async {
        let response = http
            .post(format!("{base_a}/v1/messages"))
            .header("x-api-key", &open)
            .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .ok()?;
        (response.status().as_u16() == 200).then_some(())
    })
    .await
    .expect("relay A serves");
    // Relay B: in process, waiting only briefly for the key's slot.
    let (_relay_b, base_b) = stack
        .relay(RelaySettings {
            max_wait: B_MAX_WAIT,
            ..RelaySettings::default()
        })
        .await;

    // Two slow requests through A hold both of the key's slots.
    stack.upstream.reset_stats();
    stack.upstream.script_clients(
        "cred-claude",
        [
            Scripted::Delay(Duration::from_secs(120)),
            Scripted::Delay(Duration::from_secs(120)),
        ],
    );
    let holders: Vec<_> = (0..2)
        .map(|_| {
            let (http, base, key) = (http.clone(), base_a.clone(), key.clone());
            tokio::spawn(async move {
                let _ = http
                    .post(format!("{base}/v1/messages"))
                    .header("x-api-key", &key)
                    .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
                    .send()
                    .await;
            })
        })
        .collect();
    eventually(Duration::from_secs(10), || async {
        (stack.upstream.stats("cred-claude").current == 2).then_some(())
    })
    .await
    .expect("both slow requests are upstream");

    // Held: relay B refuses the key (its concurrency), while the account still serves others.
    let held = send(&http, &base_b, &key).await;
    assert_eq!(held.status, 429, "the key's slots are held: {}", held.body);
    assert!(held.message().contains("concurrency"), "{}", held.body);
    let other = send(&http, &base_b, &open).await;
    assert_eq!(other.status, 200, "the account is not full: {}", other.body);

    relay_a.kill9();
    let killed = Instant::now();
    for holder in holders {
        let _ = holder.await;
    }
    // Through B, the key is refused until its slots come back, then served.
    let mut refused_after_kill = 0;
    let served_after = loop {
        let answer = send(&http, &base_b, &key).await;
        match answer.status {
            200 => break killed.elapsed(),
            429 => refused_after_kill += 1,
            status => panic!("{status} {}", answer.body),
        }
        assert!(
            killed.elapsed() <= ORPHAN_GRACE + SLACK,
            "the key's slots were still held {:?} after relay A died (orphan grace {ORPHAN_GRACE:?}, lease ttl {LEASE_TTL:?})",
            killed.elapsed()
        );
    };
    eprintln!(
        "relay A killed: the key was served through B {served_after:?} after, {refused_after_kill} refusals before"
    );
    assert!(
        served_after + Duration::from_millis(300) >= ORPHAN_GRACE,
        "the slots came back {served_after:?} after the kill, before the orphan grace {ORPHAN_GRACE:?}: a dead holder's lease is resumable until then"
    );
    // Both slots came back: two at once are served (the upstream answers slowly once more).
    stack.upstream.script_clients(
        "cred-claude",
        [
            Scripted::Delay(Duration::from_millis(300)),
            Scripted::Delay(Duration::from_millis(300)),
        ],
    );
    let (first, second) = tokio::join!(send(&http, &base_b, &key), send(&http, &base_b, &key));
    assert_eq!((first.status, second.status), (200, 200), "{}", second.body);
}

// --- The pinned CLIs and a spent budget. ---

const CLI_KEY: &str = "pgk-cli-budget-key-0001";
/// Codex's `model_providers.<id>.stream_max_retries` default (its config reference).
const CODEX_STREAM_MAX_RETRIES: u64 = 5;

/// As clis.rs finds them: `POOLGATE_CLIENTS_BIN`, else `scripts/clients.sh`.
fn clients_bin() -> PathBuf {
    if let Some(dir) = std::env::var_os("POOLGATE_CLIENTS_BIN") {
        return PathBuf::from(dir);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = std::process::Command::new("bash")
        .arg(root.join("scripts/clients.sh"))
        .output()
        .expect("bash runs");
    assert!(
        output.status.success(),
        "scripts/clients.sh failed (npm and the registry are needed once): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
}

/// How a CLI run ended.
struct Run {
    success: bool,
    /// stdout and stderr together.
    output: String,
    took: Duration,
}

/// Runs a CLI with a clean environment (PATH for node, a scratch HOME, the given variables).
async fn run(program: &Path, args: &[&str], home: &Path, env: &[(&str, String)]) -> Run {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("TERM", "dumb")
        .current_dir(home)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let started = Instant::now();
    let output = tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .unwrap_or_else(|_| panic!("{} did not finish in 180 s", program.display()))
        .unwrap_or_else(|e| panic!("{} does not start: {e}", program.display()));
    Run {
        success: output.status.success(),
        output: format!(
            "{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
        took: started.elapsed(),
    }
}

async fn claude_code(bin: &Path, relay: &str, key: &str) -> Run {
    let home = Scratch::new("claude-home").expect("scratch");
    run(
        &bin.join("claude"),
        &["-p", "Say hello."],
        home.path(),
        &[
            ("ANTHROPIC_BASE_URL", relay.to_owned()),
            ("ANTHROPIC_API_KEY", key.to_owned()),
            ("DISABLE_TELEMETRY", "1".to_owned()),
            ("DISABLE_AUTOUPDATER", "1".to_owned()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_owned()),
        ],
    )
    .await
}

/// `codex exec` with the relay as a `model_providers` entry; `provider` adds lines to it.
async fn codex(bin: &Path, relay: &str, key: &str, provider: &str) -> Run {
    let home = Scratch::new("codex-home").expect("scratch");
    let codex_home = home.path().join(".codex");
    std::fs::create_dir_all(&codex_home).expect("mkdir");
    std::fs::write(
        codex_home.join("config.toml"),
        format!(
            "model = \"gpt-5-codex\"\nmodel_provider = \"poolgate\"\n\n[model_providers.poolgate]\nname = \"poolgate\"\nbase_url = \"{relay}/v1\"\nenv_key = \"POOLGATE_API_KEY\"\nwire_api = \"responses\"\n{provider}"
        ),
    )
    .expect("config.toml");
    run(
        &bin.join("codex"),
        &["exec", "--skip-git-repo-check", "Say hello."],
        home.path(),
        &[
            ("CODEX_HOME", codex_home.display().to_string()),
            ("POOLGATE_API_KEY", key.to_owned()),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_asks_once_and_codex_only_within_its_stream_retries_on_a_budget_refusal() {
    let bin = clients_bin();
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let yaml = format!(
        "api_keys:\n  - {{key: {CLI_KEY}, user: cli, group: default, budget_usd: {{total: 1}}}}\naccounts:\n  - {{name: claude-a, platform: anthropic, base_url: \"{base}\", credential: cred-claude-a, concurrency: 4}}\n  - {{name: codex-a, platform: openai, base_url: \"{base}\", credential: cred-codex-a, concurrency: 4}}\nprices:\n  claude-x: {{input: {PRICE_PER_MTOK}, output: {PRICE_PER_MTOK}}}\n",
        base = upstream.base_url
    );
    let (relay, addr) = common::standalone(&yaml, RelaySettings::default(), Default::default())
        .await
        .expect("standalone relay starts");
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    // One served request spends the $1 budget ($1.70).
    let first = send(&http, &base, CLI_KEY).await;
    assert_eq!(first.status, 200, "{}", first.body);
    ledger_shows(&http, &base, CLI_KEY, 1).await;
    let upstream_before = upstream.seen_requests().len();

    // What each run is expected to send. Claude Code honours `x-should-retry: false`: one
    // request. Codex 0.169.0 does not: it treats the 402 of `/v1/responses` like a dropped
    // stream and reconnects `stream_max_retries` times (its documented provider setting,
    // default 5), so a refused run sends 1 + 5 requests, each refused again and none reaching an
    // upstream; bounded, and with `stream_max_retries = 0` it sends exactly one.
    let runs = [
        ("claude -p", 1),
        ("codex exec", 1 + CODEX_STREAM_MAX_RETRIES),
        ("codex exec (stream_max_retries = 0)", 1),
    ];
    for (cli, expected) in runs {
        let (requests, refused) = (relay_requests(&relay), refusals(&relay, "budget"));
        let run = match cli {
            "claude -p" => claude_code(&bin, &base, CLI_KEY).await,
            "codex exec" => codex(&bin, &base, CLI_KEY, "").await,
            _ => codex(&bin, &base, CLI_KEY, "stream_max_retries = 0\n").await,
        };
        let reached = relay_requests(&relay) - requests;
        let refused = refusals(&relay, "budget") - refused;
        eprintln!(
            "{cli}: exit {}, {reached} requests at the relay, {refused} budget refusals, {:?}\n{}",
            if run.success { "0" } else { "non-zero" },
            run.took,
            run.output
        );
        assert_eq!(
            (reached, refused),
            (expected as f64, expected),
            "{cli}: requests that reached the relay, budget refusals (expected {expected}: more is a retry of a 402 with x-should-retry: false)"
        );
        assert!(!run.success, "{cli} exits non-zero: {}", run.output);
        assert!(
            run.output.to_lowercase().contains("budget"),
            "{cli} says why: {}",
            run.output
        );
    }
    assert_eq!(
        upstream.seen_requests().len(),
        upstream_before,
        "nothing reached an upstream"
    );
}
