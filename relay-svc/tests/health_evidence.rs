//! Account health changes only on evidence a client cannot shape (docs/DESIGN.md §1).
//!
//! A randomized property test of the relay in both modes (standalone, engines in process; and
//! distributed: Postgres, Redis, selector, admission over gRPC). Random sequences of client
//! requests from a hostile family — every endpoint (`/v1/messages`, `count_tokens`,
//! `/v1/chat/completions`, `/v1/responses`), streaming or not, crafted and unknown models,
//! crafted text, large bodies in fixed cases — meet random upstream answers given to client
//! requests only (`FakeUpstream::script_clients`): every status 400–599 with each provider's
//! error types and codes (401/403 `authentication_error`, `invalid_api_key`,
//! `permission_error`, `model_not_found`, billing, overload…), HTML and empty bodies, error
//! events inside 200 streams, early closes, oversized answers, incomplete and broken streams,
//! heads that come too late. Never an exhausted-window assertion (those hard-block by design).
//! The selector's probe, which no client shapes, always gets a healthy answer. After each run
//! (once running confirmations had their probe block to finish) every account must be active,
//! not hard-blocked, its breaker closed with nothing counted, no unauthorized count, and no OAuth
//! token refreshed.
//!
//! The converse, in the same test: when the probe agrees (the upstream really fails, the key
//! really is revoked, the account really is out of credit, the OAuth token really is refused, the
//! upstream cannot be reached at all), the block, the count, the retirement and the refresh
//! happen.
//!
//! Every run prints its seed; a failure prints the seed and the run's steps (requests, the
//! answers queued, what the client got). Replay with `POOLGATE_EVIDENCE_SEED=<seed>`; bound the
//! random part per mode with `POOLGATE_EVIDENCE_SECS` (default 25).

use crate::support;

use std::fmt;
use std::time::{Duration, Instant};

use poolgate_core::account::Platform;
use poolgate_core::health::Breaker;
use poolgate_select::engine::UsageReadSettings;
use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::{FakeUpstream, Scripted, Window, WindowBudgets};
use relay_svc::proxy::RelaySettings;
use serde_json::{Value, json};
use support::{Mode, Options, Pool, Spec, env_u64, quick_probe};

/// Steps per run: the invariants are checked after each run.
const RUN_STEPS: usize = 14;
/// Largest body the relay keeps (requests and answers alike), small so oversized cases are cheap.
const MAX_BODY: usize = 1 << 20;
/// The relay's bound on the upstream's head.
const UPSTREAM_TIMEOUT: Duration = Duration::from_millis(1500);
const PROBE_MODELS: [&str; 2] = ["claude-haiku-4-5", "gpt-4o-mini"];
const KNOWN_MODELS: [&str; 2] = ["claude-x", "gpt-x"];

fn options() -> Options {
    Options {
        relay: RelaySettings {
            max_wait: Duration::from_secs(3),
            conflict_delay: Duration::from_millis(20),
            upstream_timeout: UPSTREAM_TIMEOUT,
            max_body_bytes: MAX_BODY,
            ping_after: Duration::from_millis(500),
            ping_every: Duration::from_millis(500),
            ..RelaySettings::default()
        },
        probe: quick_probe(),
        ..Options::default()
    }
}

/// The hostile phase's pool: two API-key accounts and a Claude subscription on Anthropic, two
/// API-key accounts on OpenAI, all healthy.
fn healthy_pool() -> Vec<Spec> {
    vec![
        Spec::api_key("a", Platform::Anthropic, 0),
        Spec::api_key("b", Platform::Anthropic, 0),
        Spec::oauth("sub", "access-sub", "rt-sub", 0),
        Spec::api_key("o", Platform::OpenAi, 0),
        Spec::api_key("o2", Platform::OpenAi, 0),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Messages,
    CountTokens,
    Chat,
    Responses,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Messages => "/v1/messages",
            Endpoint::CountTokens => "/v1/messages/count_tokens",
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Responses => "/v1/responses",
        }
    }
}

/// One client request of the hostile family.
#[derive(Debug, Clone)]
struct Request {
    endpoint: Endpoint,
    model: String,
    stream: bool,
    text: String,
    /// Extra bytes of content (the fixed large-body cases).
    pad: usize,
    max_tokens: u32,
}

impl Request {
    /// Never one of the probe's fixed bodies (`max_tokens` ≥ 2, never a bare "ping").
    fn body(&self) -> Value {
        let mut text = self.text.clone();
        if self.pad > 0 {
            text.push_str(&"x".repeat(self.pad));
        }
        match self.endpoint {
            Endpoint::Messages => json!({
                "model": self.model, "max_tokens": self.max_tokens, "stream": self.stream,
                "system": self.text,
                "metadata": {"user_id": self.text},
                "messages": [{"role": "user", "content": text}],
            }),
            Endpoint::CountTokens => json!({
                "model": self.model,
                "messages": [{"role": "user", "content": text}],
            }),
            Endpoint::Chat => json!({
                "model": self.model, "max_tokens": self.max_tokens, "stream": self.stream,
                "user": self.text,
                "messages": [{"role": "system", "content": self.text}, {"role": "user", "content": text}],
            }),
            Endpoint::Responses => json!({
                "model": self.model, "max_output_tokens": self.max_tokens.max(16), "stream": self.stream,
                "instructions": self.text,
                "input": [{"role": "user", "content": text}],
            }),
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let model: String = self.model.chars().take(40).collect();
        write!(
            f,
            "{} model={model:?}{}{}",
            self.endpoint.path(),
            if self.stream { " stream" } else { "" },
            if self.pad > 0 {
                format!(" +{} KiB", self.pad / 1024)
            } else {
                String::new()
            }
        )
    }
}

/// One upstream answer to a client request.
#[derive(Debug, Clone)]
enum Answer {
    Error {
        status: u16,
        label: &'static str,
        content_type: Option<&'static str>,
        body: String,
    },
    EarlyClose,
    Oversized,
    IncompleteStream,
    BrokenStream,
    /// The head comes after the relay's upstream timeout.
    LateHead,
    Normal,
}

impl Answer {
    fn scripted(&self) -> Scripted {
        match self {
            Answer::Error {
                status,
                content_type,
                body,
                ..
            } => Scripted::Fail {
                status: *status,
                headers: content_type
                    .map(|ct| vec![("content-type".to_owned(), ct.to_owned())])
                    .unwrap_or_default(),
                body: body.clone(),
            },
            Answer::EarlyClose => Scripted::EarlyClose,
            Answer::Oversized => Scripted::Oversized(MAX_BODY + 64 * 1024),
            Answer::IncompleteStream => Scripted::IncompleteStream,
            Answer::BrokenStream => Scripted::BrokenStream,
            Answer::LateHead => Scripted::Delay(UPSTREAM_TIMEOUT + Duration::from_millis(500)),
            Answer::Normal => Scripted::Delay(Duration::ZERO),
        }
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Error { status, label, .. } => write!(f, "{status} {label}"),
            Answer::EarlyClose => f.write_str("early-close"),
            Answer::Oversized => f.write_str("oversized"),
            Answer::IncompleteStream => f.write_str("incomplete-stream"),
            Answer::BrokenStream => f.write_str("broken-stream"),
            Answer::LateHead => f.write_str("late-head"),
            Answer::Normal => f.write_str("200"),
        }
    }
}

/// Crafted strings: billing and credential words, the credit-balance text, the probe model,
/// unicode, a very long one.
fn crafted(rng: &mut fastrand::Rng) -> String {
    let words = [
        "insufficient_quota",
        "billing_error",
        "billing_hard_limit_reached",
        "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
        "authentication_error",
        "invalid_api_key",
        "permission_error",
        "model_not_found",
        "usage_limit_reached",
        "overloaded_error",
        "api_error",
        "Missing scopes: api.responses.write",
        "OAuth token has been revoked.",
        "模型 ✓ \u{202e}",
    ];
    match rng.u8(0..10) {
        0 => "z".repeat(rng.usize(2000..6000)),
        1 => format!("hello {}", rng.u64(..)),
        _ => words[rng.usize(..words.len())].to_owned(),
    }
}

fn model(rng: &mut fastrand::Rng, endpoint: Endpoint) -> String {
    let anthropic = matches!(endpoint, Endpoint::Messages | Endpoint::CountTokens);
    match rng.u8(0..10) {
        0..=2 => KNOWN_MODELS[usize::from(!anthropic)].to_owned(),
        3 | 4 => format!(
            "{}-unknown-{}",
            if anthropic { "claude" } else { "gpt" },
            rng.u16(..)
        ),
        // The probe's own model: a client may ask for it too.
        5 => PROBE_MODELS[usize::from(!anthropic)].to_owned(),
        _ => crafted(rng),
    }
}

fn anthropic_error(rng: &mut fastrand::Rng, echo: &str) -> (&'static str, String) {
    let kinds: [(&str, String); 11] = [
        ("invalid_request_error", "max_tokens: required".into()),
        (
            "invalid_request_error",
            "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.".into(),
        ),
        ("authentication_error", "invalid x-api-key".into()),
        (
            "permission_error",
            "Your API key does not have permission to use the specified resource.".into(),
        ),
        ("not_found_error", format!("model: {echo}")),
        ("request_too_large", "Request exceeds the maximum size".into()),
        ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit".into()),
        ("api_error", "Internal server error".into()),
        ("overloaded_error", "Overloaded".into()),
        ("billing_error", "billing".into()),
        ("weird_new_error", echo.to_owned()),
    ];
    let (kind, message) = &kinds[rng.usize(..kinds.len())];
    (
        kind,
        json!({"type": "error", "error": {"type": kind, "message": message}}).to_string(),
    )
}

fn openai_error(rng: &mut fastrand::Rng, echo: &str) -> (&'static str, String) {
    let kinds: [(&str, &str, Option<&str>, String); 11] = [
        ("invalid_request_error", "invalid_request_error", None, format!("Invalid value: {echo}")),
        (
            "model_not_found",
            "invalid_request_error",
            Some("model_not_found"),
            format!("The model `{echo}` does not exist or you do not have access to it."),
        ),
        (
            "missing_scopes",
            "invalid_request_error",
            None,
            "You have insufficient permissions for this operation. Missing scopes: api.responses.write.".into(),
        ),
        ("invalid_api_key", "invalid_request_error", Some("invalid_api_key"), "Incorrect API key provided: sk-***".into()),
        ("insufficient_quota", "insufficient_quota", Some("insufficient_quota"), "You exceeded your current quota, please check your plan and billing details.".into()),
        ("billing_hard_limit_reached", "invalid_request_error", Some("billing_hard_limit_reached"), "Billing hard limit has been reached".into()),
        ("server_error", "server_error", None, "The server had an error while processing your request.".into()),
        ("rate_limit_exceeded", "requests", Some("rate_limit_exceeded"), "Rate limit reached for requests".into()),
        ("unsupported_country", "request_forbidden", Some("unsupported_country_region_territory"), "Country, region, or territory not supported".into()),
        ("permission_error", "permission_error", None, echo.to_owned()),
        ("unknown_code", "invalid_request_error", Some("weird_new_code"), echo.to_owned()),
    ];
    let (label, kind, code, message) = &kinds[rng.usize(..kinds.len())];
    (
        label,
        json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
            .to_string(),
    )
}

/// An error event inside a 200 stream, in the platform's format.
fn stream_error(rng: &mut fastrand::Rng, platform: Platform) -> (&'static str, String) {
    let kinds = [
        "api_error",
        "overloaded_error",
        "billing_error",
        "invalid_request_error",
    ];
    let kind = kinds[rng.usize(..kinds.len())];
    let body = match platform {
        Platform::Anthropic => format!(
            "event: message_start\ndata: {}\n\nevent: error\ndata: {}\n\n",
            json!({"type": "message_start", "message": {"id": "msg_e", "type": "message", "role": "assistant", "model": "claude-x", "content": [], "usage": {"input_tokens": 1, "output_tokens": 1}}}),
            json!({"type": "error", "error": {"type": kind, "message": "stream failed"}})
        ),
        Platform::OpenAi => format!(
            "data: {}\n\nevent: response.failed\ndata: {}\n\n",
            json!({"error": {"type": kind, "code": kind, "message": "stream failed"}}),
            json!({"type": "response.failed", "response": {"id": "resp_e", "status": "failed", "error": {"code": kind, "message": "stream failed"}}})
        ),
        Platform::Rerank => unreachable!("rerank answers never stream"),
    };
    (kind, body)
}

fn answer(rng: &mut fastrand::Rng, platform: Platform) -> Answer {
    let echo = crafted(rng);
    match rng.u8(0..100) {
        0..=54 => {
            // Every status can come, the refusals (401/403) and the usual ones most often.
            let status = match rng.u8(0..4) {
                0 => [401, 403][rng.usize(..2)],
                1 => {
                    let usual = [
                        400, 402, 404, 408, 409, 413, 422, 429, 500, 502, 503, 504, 529,
                    ];
                    usual[rng.usize(..usual.len())]
                }
                _ => rng.u16(400..600),
            };
            // Mostly the platform's own format; sometimes the other one's, HTML or nothing.
            let (label, content_type, body) = match (rng.u8(0..10), platform) {
                (0, _) => (
                    "html",
                    Some("text/html"),
                    "<html><body><h1>403 Forbidden</h1></body></html>".to_owned(),
                ),
                (1, _) => ("empty", None, String::new()),
                (2, Platform::Anthropic) | (3..=9, Platform::OpenAi) => {
                    let (label, body) = openai_error(rng, &echo);
                    (label, None, body)
                }
                _ => {
                    let (label, body) = anthropic_error(rng, &echo);
                    (label, None, body)
                }
            };
            Answer::Error {
                status,
                label,
                content_type,
                body,
            }
        }
        55..=61 => {
            let (label, body) = stream_error(rng, platform);
            Answer::Error {
                status: 200,
                label,
                content_type: Some("text/event-stream"),
                body,
            }
        }
        62..=69 => Answer::EarlyClose,
        70..=76 => Answer::Oversized,
        77..=83 => Answer::IncompleteStream,
        84..=90 => Answer::BrokenStream,
        91..=92 => Answer::LateHead,
        _ => Answer::Normal,
    }
}

/// One step: requests sent together, after the client-only answers are queued.
#[derive(Debug, Clone)]
struct Step {
    requests: Vec<Request>,
    /// Per credential, the answers its client requests get in order (then the normal one).
    answers: Vec<(String, Vec<Answer>)>,
}

fn credentials(specs: &[Spec]) -> Vec<(String, Platform)> {
    specs
        .iter()
        .map(|s| (s.credential.clone(), s.platform))
        .collect()
}

fn request(rng: &mut fastrand::Rng) -> Request {
    let endpoint = [
        Endpoint::Messages,
        Endpoint::Messages,
        Endpoint::CountTokens,
        Endpoint::Chat,
        Endpoint::Responses,
    ][rng.usize(..5)];
    Request {
        endpoint,
        model: model(rng, endpoint),
        stream: endpoint != Endpoint::CountTokens && rng.bool(),
        text: crafted(rng),
        pad: 0,
        max_tokens: rng.u32(2..64),
    }
}

fn step(rng: &mut fastrand::Rng, creds: &[(String, Platform)], requests: Vec<Request>) -> Step {
    // Enough for every upstream call of these requests (failover budget 3, conflict retries).
    let per = 4 * requests.len();
    let answers = creds
        .iter()
        .map(|(credential, platform)| {
            (
                credential.clone(),
                (0..per).map(|_| answer(rng, *platform)).collect(),
            )
        })
        .collect();
    Step { requests, answers }
}

/// The fixed cases: large bodies, under and over the relay's limit, on every endpoint.
fn large_bodies(rng: &mut fastrand::Rng, creds: &[(String, Platform)]) -> Vec<Step> {
    [
        (Endpoint::Messages, MAX_BODY - 100 * 1024, false),
        (Endpoint::Messages, MAX_BODY + 512 * 1024, true),
        (Endpoint::CountTokens, MAX_BODY - 100 * 1024, false),
        (Endpoint::Chat, MAX_BODY - 100 * 1024, true),
        (Endpoint::Responses, MAX_BODY + 512 * 1024, false),
    ]
    .into_iter()
    .map(|(endpoint, pad, stream)| {
        let request = Request {
            endpoint,
            model: KNOWN_MODELS[usize::from(!matches!(
                endpoint,
                Endpoint::Messages | Endpoint::CountTokens
            ))]
            .to_owned(),
            stream,
            text: crafted(rng),
            pad,
            max_tokens: 32,
        };
        step(rng, creds, vec![request])
    })
    .collect()
}

/// A run of `RUN_STEPS` steps from `seed` (1–3 requests each, sent together).
fn sequence(seed: u64, creds: &[(String, Platform)]) -> Vec<Step> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..RUN_STEPS)
        .map(|_| {
            let n = if rng.u8(0..4) == 0 {
                rng.usize(2..4)
            } else {
                1
            };
            let requests = (0..n).map(|_| request(&mut rng)).collect();
            step(&mut rng, creds, requests)
        })
        .collect()
}

/// What one step came to, for the failure report.
struct Ran {
    step: Step,
    statuses: Vec<u16>,
}

impl fmt::Display for Ran {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (request, status) in self.step.requests.iter().zip(&self.statuses) {
            writeln!(f, "    {request} -> client got {status}")?;
        }
        for (credential, answers) in &self.step.answers {
            let answers: Vec<String> = answers.iter().map(ToString::to_string).collect();
            writeln!(f, "      {credential} answers: {}", answers.join(", "))?;
        }
        Ok(())
    }
}

async fn run_step(pool: &Pool, step: &Step) -> Vec<u16> {
    pool.upstream.clear_client_scripts();
    for (credential, answers) in &step.answers {
        pool.upstream
            .script_clients(credential, answers.iter().map(Answer::scripted));
    }
    let calls = step.requests.iter().enumerate().map(|(n, request)| {
        let body = request.body();
        async move { pool.send(n, request.endpoint.path(), &body).await.0 }
    });
    futures_util::future::join_all(calls).await
}

/// After a run: waits for running confirmations (their "confirming" block lasts at most the
/// probe block), then lists every write a client's request must not have caused.
async fn violations(pool: &Pool) -> Vec<String> {
    let block = pool.options.probe.block;
    let settled = eventually(block + Duration::from_secs(2), || async {
        let health = pool.health().await;
        health
            .iter()
            .all(|h| h.hard_block().is_none())
            .then_some(health)
    })
    .await;
    let health = match settled {
        Ok(health) => health,
        Err(_) => pool.health().await,
    };
    let mut found = Vec::new();
    for h in &health {
        if h.status != "active" {
            found.push(format!("{h}: status {} — taken out of service", h.status));
        }
        if let Some(b) = h.hard_block() {
            found.push(format!(
                "{h}: still hard-blocked ({}) {:?} after the run, longer than the probe block",
                b.class, block
            ));
        }
        if h.blocks.iter().any(|b| b.kind == "breaker")
            || h.breaker.is_some_and(|b| b != Breaker::Closed)
        {
            found.push(format!("{h}: breaker not closed"));
        }
        if h.failures.is_some_and(|n| n > 0) {
            found.push(format!("{h}: broken outcomes counted toward the breaker"));
        }
        if h.unauthorized.is_some_and(|n| n > 0) {
            found.push(format!("{h}: unauthorized outcomes counted"));
        }
    }
    let refreshes = pool.upstream.token_requests();
    if !refreshes.is_empty() {
        found.push(format!(
            "the OAuth token was refreshed {} time(s) on client requests alone: {refreshes:?}",
            refreshes.len()
        ));
    }
    let counters = pool.counters();
    let writes = [
        ("selector_outcomes_total", vec![("applied", "hard_block")]),
        ("selector_outcomes_total", vec![("applied", "breaker_open")]),
        ("selector_outcomes_total", vec![("applied", "error")]),
        ("selector_breaker_changes_total", vec![]),
        ("selector_retirements_total", vec![]),
        (
            "selector_confirmations_total",
            vec![("result", "confirmed")],
        ),
        ("selector_token_refreshes_total", vec![]),
    ];
    for (name, having) in &writes {
        for (series, value) in counters.nonzero(name, having) {
            found.push(format!("selector counter {series} = {value}"));
        }
    }
    found
}

fn probes(pool: &Pool) -> u64 {
    pool.accounts
        .iter()
        .map(|(name, _)| {
            let credential = healthy_pool()
                .into_iter()
                .find(|s| s.name == name)
                .map(|s| s.credential)
                .unwrap_or_default();
            pool.upstream.probe_count(&credential)
        })
        .sum()
}

/// The random part: runs until the budget is spent (or the one seed asked for); `Err` with the
/// seed and the failing run.
async fn explore(mode: Mode) -> Result<String, String> {
    let specs = healthy_pool();
    let creds = credentials(&specs);
    let pool = Pool::start(mode, &specs, options()).await;
    let mut known: Vec<&str> = KNOWN_MODELS.to_vec();
    known.extend(PROBE_MODELS);
    pool.upstream.set_known_models(&known);
    pool.upstream.set_claude_code_only("access-sub");
    let budget = Duration::from_secs(env_u64("POOLGATE_EVIDENCE_SECS").unwrap_or(25));
    let fixed = env_u64("POOLGATE_EVIDENCE_SEED");
    let first_seed = fixed.unwrap_or_else(|| fastrand::u64(..));
    println!(
        "health evidence ({mode}): first seed {first_seed} (replay: POOLGATE_EVIDENCE_SEED={first_seed})"
    );
    let started = Instant::now();
    let (mut runs, mut requests) = (0u64, 0usize);
    loop {
        let seed = first_seed.wrapping_add(runs);
        let mut steps = sequence(seed, &creds);
        if runs == 0 {
            let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
            steps.splice(0..0, large_bodies(&mut rng, &creds));
        }
        runs += 1;
        let mut ran = Vec::new();
        for step in steps {
            let statuses = run_step(&pool, &step).await;
            requests += statuses.len();
            ran.push(Ran { step, statuses });
        }
        pool.upstream.clear_client_scripts();
        let found = violations(&pool).await;
        if !found.is_empty() {
            let steps: String = ran
                .iter()
                .enumerate()
                .map(|(n, r)| format!("  step {n}:\n{r}"))
                .collect();
            return Err(format!(
                "{mode}: seed {seed} (replay: POOLGATE_EVIDENCE_SEED={seed}): client requests \
                 changed account health while the probe was healthy:\n  - {}\n  health now:\n{}\n  the run:\n{steps}",
                found.join("\n  - "),
                pool.health()
                    .await
                    .iter()
                    .map(|h| format!("    {h}\n"))
                    .collect::<String>(),
            ));
        }
        if fixed.is_some() || started.elapsed() >= budget {
            break;
        }
    }
    let probes = probes(&pool);
    let counters = pool.counters();
    let summary = format!(
        "{mode}: {runs} runs, {requests} client requests in {:?}; {probes} probes, confirmations {:?}",
        started.elapsed(),
        counters.nonzero("selector_confirmations_total", &[])
    );
    if probes == 0 {
        return Err(format!(
            "{summary}: no probe ran at all — the hostile answers never reached the confirmation path, the test proves nothing"
        ));
    }
    Ok(summary)
}

/// The converse: evidence the client cannot shape does change health. Returns what failed.
async fn converse(mode: Mode) -> Vec<String> {
    let dead = format!(
        "http://127.0.0.1:{}",
        poolgate_testkit::free_port().expect("free port")
    );
    let specs = vec![
        Spec::api_key("a", Platform::Anthropic, 0),
        Spec::api_key("k", Platform::Anthropic, 1),
        Spec::oauth("csub", "access-csub", "rt-csub", 2),
        Spec::api_key("b", Platform::Anthropic, 9),
        Spec::api_key("o", Platform::OpenAi, 0),
        Spec {
            base_url: Some(dead),
            ..Spec::api_key("dead", Platform::OpenAi, 1)
        },
        Spec::api_key("o2", Platform::OpenAi, 9),
    ];
    let pool = Pool::start(mode, &specs, options()).await;
    let block_ms = pool.options.probe.block.as_millis() as u64;
    let settle = pool.options.probe.block + Duration::from_secs(4);
    let mut failed = Vec::new();
    let message = |n: u32| json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": format!("converse {n} {}", fastrand::u64(..))}]});
    let chat = |n: u32| json!({"model": "gpt-x", "max_tokens": 8, "messages": [{"role": "user", "content": format!("converse {n} {}", fastrand::u64(..))}]});
    // A hard block longer than any "confirming" one: the outcome applied.
    let blocked = |name: &'static str, class: &'static str| {
        let pool = &pool;
        async move {
            let h = pool.health_of(name).await;
            let applied = h
                .hard_block()
                .is_some_and(|b| b.remaining_ms > block_ms && b.class == class);
            applied.then_some(h)
        }
    };

    // 1. The upstream really fails: the client's 500 and the probe's 500.
    let api_error =
        r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#;
    pool.upstream.script(
        "cred-a",
        (0..2).map(|_| Scripted::Fail {
            status: 500,
            headers: vec![],
            body: api_error.into(),
        }),
    );
    let (status, body) = pool.send(0, "/v1/messages", &message(1)).await;
    if status != 200 {
        failed.push(format!(
            "broken: the client's request was not failed over: {status} {body}"
        ));
    }
    match eventually(settle, || blocked("a", "broken")).await {
        Ok(h) => {
            if h.failures.is_some_and(|n| n == 0) {
                failed.push(format!(
                    "broken, confirmed by the probe: no breaker count: {h}"
                ));
            }
        }
        Err(_) => failed.push(format!(
            "broken, confirmed by the probe ({} probes to a): no hard block: {}",
            pool.upstream.probe_count("cred-a"),
            pool.health_of("a").await
        )),
    }

    // 2. The key really is revoked: the client's 401 and the probe's.
    pool.upstream.revoke("cred-k");
    let (status, body) = pool.send(0, "/v1/messages", &message(2)).await;
    if status != 200 {
        failed.push(format!(
            "revoked key: the client's request was not failed over: {status} {body}"
        ));
    }
    match eventually(settle, || blocked("k", "unauthorized")).await {
        Ok(h) => {
            if h.unauthorized.is_some_and(|n| n == 0) {
                failed.push(format!(
                    "revoked key, confirmed by the probe: not counted: {h}"
                ));
            }
        }
        Err(_) => failed.push(format!(
            "revoked key, confirmed by the probe ({} probes to k): no hard block: {}",
            pool.upstream.probe_count("cred-k"),
            pool.health_of("k").await
        )),
    }

    // 3. The OAuth token really is refused: one refresh, the request served with the new token.
    pool.upstream.revoke("access-csub");
    let (status, body) = pool.send(0, "/v1/messages", &message(3)).await;
    let refreshes = pool.upstream.token_requests();
    let served_new = pool
        .upstream
        .seen_requests()
        .iter()
        .any(|r| !r.probe && r.credential() == "rt-csub-access");
    if status != 200 || refreshes.len() != 1 || !served_new {
        failed.push(format!(
            "refused OAuth token: expected a 200 served with the refreshed token after one refresh; got {status} {body}, {} refresh(es) {refreshes:?}, served with the new token: {served_new}",
            refreshes.len()
        ));
    }
    // Confirmed by the usage endpoint the CLI reads, not by an inference probe.
    let (usage_calls, probes) = (
        pool.upstream.usage_calls("access-csub"),
        pool.upstream.probe_count("access-csub"),
    );
    if usage_calls == 0 || probes != 0 {
        failed.push(format!(
            "refused OAuth token: expected the usage endpoint to confirm it and no inference probe; got {usage_calls} usage call(s), {probes} probe(s)"
        ));
    }
    let sub = eventually(settle, || async {
        let h = pool.health_of("csub").await;
        h.hard_block().is_none().then_some(h)
    })
    .await;
    if sub.is_err() {
        failed.push(format!(
            "refused OAuth token, refreshed: the refusal the refresh fixed still blocks: {}",
            pool.health_of("csub").await
        ));
    }

    // 4. Really out of credit: the client's quota answer and the probe's.
    pool.upstream.set_out_of_credit("cred-o", true);
    let (status, body) = pool.send(0, "/v1/chat/completions", &chat(4)).await;
    if status != 200 {
        failed.push(format!(
            "out of credit: the client's request was not failed over: {status} {body}"
        ));
    }
    let retired = eventually(settle, || async {
        let h = pool.health_of("o").await;
        (h.status == "retired").then_some(h)
    })
    .await;
    if retired.is_err() {
        failed.push(format!(
            "out of credit, confirmed by the probe ({} probes to o): not retired: {}",
            pool.upstream.probe_count("cred-o"),
            pool.health_of("o").await
        ));
    }

    // 5. The upstream cannot be reached at all (nothing sent): applies at once.
    let (status, body) = pool.send(0, "/v1/chat/completions", &chat(5)).await;
    if status != 200 {
        failed.push(format!(
            "unreachable: the client's request was not failed over: {status} {body}"
        ));
    }
    if eventually(settle, || blocked("dead", "broken"))
        .await
        .is_err()
    {
        failed.push(format!(
            "unreachable upstream (connect refused): no hard block: {}",
            pool.health_of("dead").await
        ));
    }
    failed
}

async fn hold(mode: Mode) {
    let started = Instant::now();
    let explored = explore(mode).await;
    let converse = converse(mode).await;
    println!("health evidence ({mode}): {:?} in all", started.elapsed());
    let mut report = Vec::new();
    match &explored {
        Ok(summary) => println!("health evidence {summary}: no violation"),
        Err(failure) => report.push(failure.clone()),
    }
    if !converse.is_empty() {
        report.push(format!(
            "{mode}: evidence the client cannot shape did not apply:\n  - {}",
            converse.join("\n  - ")
        ));
    }
    assert!(report.is_empty(), "{}", report.join("\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_requests_never_take_a_healthy_account_out_of_service_standalone() {
    hold(Mode::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_requests_never_take_a_healthy_account_out_of_service_distributed() {
    hold(Mode::Distributed).await;
}

/// Every OAuth account's windows are read from its usage endpoint at start (one no
/// request has touched included), and a window block whose reset the endpoint shows passed (a
/// later period, barely used) is lifted at once.
async fn usage_read_at_start_and_a_passed_window_block_lifted(mode: Mode) {
    const HOUR: Duration = Duration::from_secs(3600);
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    upstream.set_windows(
        "access-w",
        WindowBudgets {
            five_hour: Some(Window::new(5 * HOUR, 10)),
            weekly: Some(Window::new(7 * 24 * HOUR, 100)),
            ..WindowBudgets::default()
        },
    );
    // One request straight to the upstream (not through the relay) starts both periods.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let started = reqwest::Client::new()
        .post(format!("{}/v1/messages", upstream.base_url))
        .bearer_auth("access-w")
        .header("anthropic-beta", "oauth-2025-04-20")
        .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("the fake answers");
    assert_eq!(started.status(), 200);
    let specs = [Spec {
        base_url: Some(upstream.base_url.clone()),
        ..Spec::oauth("w", "access-w", "rt-w", 0)
    }];
    let pool = Pool::start(
        mode,
        &specs,
        Options {
            usage_reads: UsageReadSettings {
                every: Duration::from_secs(1),
                ..UsageReadSettings::default()
            },
            ..options()
        },
    )
    .await;
    let read = eventually(Duration::from_secs(10), || async {
        let windows = pool.windows_of("w").await;
        windows
            .iter()
            .any(|(kind, used)| kind == "5h" && *used == Some(0.1))
            .then_some(windows)
    })
    .await;
    assert!(
        read.is_ok(),
        "{mode}: the untouched account's windows were not read at start: {:?} ({} usage calls)",
        pool.windows_of("w").await,
        upstream.usage_calls("access-w")
    );
    assert_eq!(
        upstream.seen_requests().len(),
        1,
        "{mode}: no model request went out"
    );

    // A 429 naming an exhausted 5-hour window that resets in an hour: a window block.
    let reset = poolgate_core::now_ms() / 1000 + 3600;
    upstream.script_clients(
        "access-w",
        [Scripted::Fail {
            status: 429,
            headers: vec![
                (
                    "anthropic-ratelimit-unified-status".into(),
                    "rejected".into(),
                ),
                (
                    "anthropic-ratelimit-unified-representative-claim".into(),
                    "five_hour".into(),
                ),
                (
                    "anthropic-ratelimit-unified-reset".into(),
                    reset.to_string(),
                ),
                (
                    "anthropic-ratelimit-unified-5h-status".into(),
                    "rejected".into(),
                ),
                (
                    "anthropic-ratelimit-unified-5h-utilization".into(),
                    "1.0".into(),
                ),
                (
                    "anthropic-ratelimit-unified-5h-reset".into(),
                    reset.to_string(),
                ),
            ],
            body:
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"Rate limited"}}"#
                    .into(),
        }],
    );
    let (status, _) = pool
        .send(0, "/v1/messages", &json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "limit"}]}))
        .await;
    assert_ne!(status, 200, "{mode}: the scripted 429 was not met");
    // The endpoint shows the 5-hour window in a later period, at 10 %: the block goes.
    let lifted = eventually(Duration::from_secs(10), || async {
        let h = pool.health_of("w").await;
        h.hard_block().is_none().then_some(h)
    })
    .await;
    assert!(
        lifted.is_ok(),
        "{mode}: the window block was not lifted after the usage endpoint showed the window open: {}",
        pool.health_of("w").await
    );
}

/// An OAuth account whose upstream has no usage endpoint (404) keeps the inference
/// probe for its credential confirmations: a revoked token is probed, then refreshed once.
async fn without_a_usage_endpoint_the_inference_probe_confirms(mode: Mode) {
    let pool = Pool::start(
        mode,
        &[
            Spec::oauth("n", "access-n", "rt-n", 0),
            Spec::api_key("b", Platform::Anthropic, 9),
        ],
        options(),
    )
    .await;
    pool.upstream.set_usage_endpoints(false);
    pool.upstream.revoke("access-n");
    let (status, body) = pool
        .send(0, "/v1/messages", &json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "no usage"}]}))
        .await;
    assert_eq!(status, 200, "{mode}: {body}");
    let refreshed = eventually(Duration::from_secs(10), || async {
        (pool.upstream.token_requests().len() == 1).then_some(())
    })
    .await;
    assert!(refreshed.is_ok(), "{mode}: no refresh");
    assert!(
        pool.upstream.probe_count("access-n") >= 1,
        "{mode}: the confirmation sent no inference probe ({} usage calls)",
        pool.upstream.usage_calls("access-n")
    );
    assert_eq!(
        pool.upstream.token_requests().len(),
        1,
        "{mode}: refreshed once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_read_at_start_and_lifts_a_passed_window_block_standalone() {
    usage_read_at_start_and_a_passed_window_block_lifted(Mode::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_read_at_start_and_lifts_a_passed_window_block_distributed() {
    usage_read_at_start_and_a_passed_window_block_lifted(Mode::Distributed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_usage_endpoint_the_inference_probe_confirms_standalone() {
    without_a_usage_endpoint_the_inference_probe_confirms(Mode::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_usage_endpoint_the_inference_probe_confirms_distributed() {
    without_a_usage_endpoint_the_inference_probe_confirms(Mode::Distributed).await;
}
