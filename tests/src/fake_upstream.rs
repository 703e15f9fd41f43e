//! A fake upstream LLM server speaking enough of the Anthropic and OpenAI APIs for the demo
//! (`relay-svc --standalone --demo`), the tests and the benchmarks. It counts concurrent requests
//! per credential (and their peak), and answers from a per-credential script of queued outcomes
//! (429, 529, 500, 401, quota, delays, connections that break, answers too large), so tests can
//! drive every failover path.
//!
//! A test can also give every request one standing answer (`set_standing_answer`: an upstream
//! that fails or refuses everything until told otherwise), and the OAuth token endpoint
//! (`/oauth/token`) refreshes tokens as the providers' do, counting each refresh request.
//!
//! It tells the selector's confirmation probe (the fixed bodies of `selector-svc/src/confirm.rs`
//! `probe_request`) from client requests, so a test can give clients hostile answers while the
//! probe, which no client shapes, gets a healthy one (`script_clients`), or script both alike
//! (`script`) when the upstream really is broken.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Scripted {
    /// Answer with this status, headers and body.
    Fail {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Answer normally after this delay.
    Delay(Duration),
    /// A 200 head (the content type the normal answer has), part of the body, then the
    /// connection drops.
    EarlyClose,
    /// A 200 JSON answer whose body is this many bytes.
    Oversized(usize),
    /// The normal event stream (SSE, whatever the request asked) without its terminal events
    /// (Anthropic's `message_delta`/`message_stop`, chat's finish and `[DONE]`, Responses'
    /// `response.completed`), ended cleanly.
    IncompleteStream,
    /// The first half of the normal event stream (SSE), then the connection drops.
    BrokenStream,
    /// This answer after a pause (a refusal that arrives late, a head that comes too late).
    After(Duration, Box<Scripted>),
}

/// One request as the fake upstream received it (the first 1 000 are kept).
#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub path: String,
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Value,
    /// The selector's confirmation probe (one of its fixed bodies), not a client's request.
    pub probe: bool,
}

impl SeenRequest {
    /// The credential the request carried (`x-api-key`, else the bearer token).
    pub fn credential(&self) -> String {
        credential(&self.headers)
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CredentialStats {
    pub current: u32,
    pub peak: u32,
    pub total: u64,
}

#[derive(Default)]
struct FakeState {
    stats: Mutex<HashMap<String, CredentialStats>>,
    scripts: Mutex<HashMap<String, VecDeque<Scripted>>>,
    /// Answers for client requests only: the probe skips this queue.
    client_scripts: Mutex<HashMap<String, VecDeque<Scripted>>>,
    /// The answer every request gets when nothing is queued for it (none: the normal one).
    standing: Mutex<Option<Scripted>>,
    /// `count_tokens` requests received per credential (they count nowhere else).
    count_tokens: Mutex<HashMap<String, u64>>,
    /// `/oauth/token` answers after this long (so refusals can pile up behind one refresh).
    token_delay: Mutex<Duration>,
    /// Probes received per credential (all of them, not only the first 1 000 requests).
    probes: Mutex<HashMap<String, u64>>,
    /// Every answer waits this long before its head (simulated model latency).
    delay: Mutex<Duration>,
    /// Pause between stream events.
    chunk_delay: Mutex<Duration>,
    seen_models: Mutex<Vec<String>>,
    seen: Mutex<Vec<SeenRequest>>,
    /// When set, any other model gets the real APIs' 404, which echoes the model name.
    known_models: Mutex<Option<HashSet<String>>>,
    /// Credentials whose account has no credit left: every request gets the billing answer.
    out_of_credit: Mutex<HashSet<String>>,
    /// Claude subscription (OAuth) tokens: served only on requests with the OAuth beta and
    /// Claude Code's identity as the first system block, as Anthropic's API does.
    claude_code_only: Mutex<HashSet<String>>,
    /// Revoked access tokens: every request with one gets a 401.
    revoked: Mutex<HashSet<String>>,
    /// Refresh tokens used at `/oauth/token` (each is good once, as upstream).
    refreshed: Mutex<Vec<Value>>,
}

/// A handle on a running fake upstream.
#[derive(Clone)]
pub struct FakeUpstream {
    state: Arc<FakeState>,
    pub base_url: String,
}

impl FakeUpstream {
    /// Starts on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on("127.0.0.1:0".parse().map_err(std::io::Error::other)?).await
    }

    /// Starts on `addr`. Besides the two APIs it serves a control API: `POST /_mock/script`
    /// (`{"credential": "...", "answers": [{"status": 429, "headers": {...}, "body": "..."},
    /// {"delay_ms": 500}, {"early_close": true}, {"oversized": 100000},
    /// {"incomplete_stream": true}, {"broken_stream": true}, {"after_ms": 900, "status": 401}]}`,
    /// with `"clients_only": true` for answers the probe skips), `GET /_mock/stats` (per
    /// credential: current, peak, total), `GET /_mock/requests` (what was received, `probe`
    /// marking the selector's) and `POST /_mock/reset` (peaks back to the current count).
    pub async fn start_on(addr: std::net::SocketAddr) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(FakeState::default());
        let router = Router::new()
            .route("/v1/messages", post(messages))
            .route("/v1/messages/count_tokens", post(count_tokens))
            .route("/v1/chat/completions", post(chat))
            .route("/v1/responses", post(responses))
            .route("/codex/responses", post(chatgpt_codex))
            .route("/oauth/token", post(oauth_token))
            .route("/backend-api/codex/responses", post(chatgpt_codex))
            .route("/_mock/script", post(control_script))
            .route("/_mock/stats", axum::routing::get(control_stats))
            .route("/_mock/reset", post(control_reset))
            .route("/_mock/requests", axum::routing::get(control_requests))
            // The real APIs take requests of tens of MB (axum's default cap is 2 MB).
            .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
            .with_state(state.clone());
        tokio::spawn(async move {
            use axum::serve::ListenerExt;
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, router).await;
        });
        Ok(FakeUpstream {
            state,
            base_url: format!("http://{addr}"),
        })
    }

    /// Queues answers for requests made with `credential`, the selector's probe included (an
    /// upstream that really fails fails the probe too).
    pub fn script(&self, credential: &str, answers: impl IntoIterator<Item = Scripted>) {
        let mut scripts = self.state.scripts.lock().unwrap_or_else(|p| p.into_inner());
        scripts
            .entry(credential.to_owned())
            .or_default()
            .extend(answers);
    }

    /// Queues answers for client requests made with `credential`: the selector's probe skips
    /// them (and gets the next `script` answer, or the normal one). A client request takes these
    /// first, then `script`'s.
    pub fn script_clients(&self, credential: &str, answers: impl IntoIterator<Item = Scripted>) {
        let mut scripts = self
            .state
            .client_scripts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        scripts
            .entry(credential.to_owned())
            .or_default()
            .extend(answers);
    }

    /// Every request with no queued answer (the probe's included, whatever its credential)
    /// gets `answer`, each time, until `None` puts the normal answers back: an upstream that
    /// fails or refuses everything for as long as a test says.
    pub fn set_standing_answer(&self, answer: Option<Scripted>) {
        *self
            .state
            .standing
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = answer;
    }

    /// Drops every answer still queued by `script_clients`.
    pub fn clear_client_scripts(&self) {
        self.state
            .client_scripts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// `/oauth/token` answers after `delay` (the request is recorded at once).
    pub fn set_token_delay(&self, delay: Duration) {
        *self
            .state
            .token_delay
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = delay;
    }

    /// Only these models exist; any other gets a 404 that echoes the model name, as the real
    /// APIs answer (`model: <name>`), so a client controls part of that error body.
    pub fn set_known_models(&self, models: &[&str]) {
        *self
            .state
            .known_models
            .lock()
            .unwrap_or_else(|p| p.into_inner()) =
            Some(models.iter().map(|m| (*m).to_owned()).collect());
    }

    /// The account behind `credential` has no credit left (or has again): every request gets
    /// the provider's billing answer (Anthropic's 400 credit-balance error, OpenAI's 429
    /// `insufficient_quota`).
    pub fn set_out_of_credit(&self, credential: &str, out: bool) {
        let mut set = self
            .state
            .out_of_credit
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if out {
            set.insert(credential.to_owned());
        } else {
            set.remove(credential);
        }
    }

    /// `credential` is a Claude subscription token: Messages requests without the
    /// `oauth-2025-04-20` beta get a 401, and those whose first system block is not Claude
    /// Code's identity get Anthropic's 400 ("only authorized for use with Claude Code").
    pub fn set_claude_code_only(&self, credential: &str) {
        self.state
            .claude_code_only
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(credential.to_owned());
    }

    /// The upstream no longer accepts this access token (401 `authentication_error`).
    pub fn revoke(&self, credential: &str) {
        self.state
            .revoked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(credential.to_owned());
    }

    /// The refresh requests `/oauth/token` received (their JSON bodies), oldest first.
    pub fn token_requests(&self) -> Vec<Value> {
        self.state
            .refreshed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_delay(&self, delay: Duration) {
        *self.state.delay.lock().unwrap_or_else(|p| p.into_inner()) = delay;
    }

    pub fn set_chunk_delay(&self, delay: Duration) {
        *self
            .state
            .chunk_delay
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = delay;
    }

    pub fn stats(&self, credential: &str) -> CredentialStats {
        let stats = self.state.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.get(credential).copied().unwrap_or_default()
    }

    /// Forgets peaks and totals (between test phases).
    pub fn reset_stats(&self) {
        let mut stats = self.state.stats.lock().unwrap_or_else(|p| p.into_inner());
        for stat in stats.values_mut() {
            stat.peak = stat.current;
            stat.total = 0;
        }
    }

    pub fn seen_models(&self) -> Vec<String> {
        self.state
            .seen_models
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn seen_headers(&self) -> Vec<HeaderMap> {
        self.seen_requests()
            .into_iter()
            .map(|r| r.headers)
            .collect()
    }

    /// Every request received (path, query, headers, body), oldest first.
    pub fn seen_requests(&self) -> Vec<SeenRequest> {
        self.state
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many `/v1/messages/count_tokens` requests came with `credential` (they are not in
    /// `stats`, `seen_requests` or `seen_models`).
    pub fn count_tokens_calls(&self, credential: &str) -> u64 {
        self.state
            .count_tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(credential)
            .copied()
            .unwrap_or(0)
    }

    /// How many of the selector's probes came with `credential`.
    pub fn probe_count(&self, credential: &str) -> u64 {
        self.state
            .probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(credential)
            .copied()
            .unwrap_or(0)
    }

    /// The selector's probes received with `credential`, oldest first (among the first 1 000
    /// requests).
    pub fn probes(&self, credential: &str) -> Vec<SeenRequest> {
        self.seen_requests()
            .into_iter()
            .filter(|r| r.probe && r.credential() == credential)
            .collect()
    }
}

/// Whether `request` (sent to `path`) is the selector's confirmation probe: exactly one of the
/// fixed bodies `selector-svc/src/confirm.rs` `probe_request` sends, nothing else in it.
/// Anthropic: `max_tokens: 1` and one user "ping" (OAuth: Claude Code's identity as the only
/// system block); OpenAI chat: `max_completion_tokens: 1` and the same message; ChatGPT: the
/// "Answer in one word." instructions with the ping as input. A client could send the same
/// bytes; it would then get the probe's answers, which is what the upstream would do too.
pub fn is_probe(path: &str, request: &Value) -> bool {
    let Some(fields) = request.as_object() else {
        return false;
    };
    let ping = json!([{"role": "user", "content": "ping"}]);
    let only = |allowed: &[&str]| fields.keys().all(|k| allowed.contains(&k.as_str()));
    let model = fields.get("model").is_some_and(Value::is_string);
    if path.ends_with("/v1/messages") {
        let identity =
            json!([{"type": "text", "text": poolgate_core::upstream::CLAUDE_CODE_IDENTITY}]);
        model
            && only(&["model", "max_tokens", "messages", "system"])
            && fields.get("max_tokens") == Some(&json!(1))
            && fields.get("messages") == Some(&ping)
            && fields
                .get("system")
                .is_none_or(|system| *system == identity)
    } else if path.ends_with("/chat/completions") {
        model
            && only(&["model", "max_completion_tokens", "messages"])
            && fields.get("max_completion_tokens") == Some(&json!(1))
            && fields.get("messages") == Some(&ping)
    } else if path.ends_with("/responses") {
        model
            && only(&["model", "instructions", "input", "store", "stream"])
            && fields.get("instructions") == Some(&json!("Answer in one word."))
            && fields.get("input") == Some(&ping)
            && fields.get("store") == Some(&Value::Bool(false))
            && fields.get("stream") == Some(&Value::Bool(true))
    } else {
        false
    }
}

/// The next scripted answer for a request with `credential`: a client's takes the client-only
/// queue first; the probe only the shared one; then the standing answer, if any.
fn take_scripted(state: &FakeState, credential: &str, probe: bool) -> Option<Scripted> {
    if !probe {
        let client = state
            .client_scripts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(credential)
            .and_then(VecDeque::pop_front);
        if client.is_some() {
            return client;
        }
    }
    let queued = state
        .scripts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_mut(credential)
        .and_then(VecDeque::pop_front);
    queued.or_else(|| {
        state
            .standing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    })
}

/// Waits out `After` wrappers; the answer inside them.
async fn after_pauses(mut scripted: Option<Scripted>) -> Option<Scripted> {
    while let Some(Scripted::After(pause, inner)) = scripted {
        tokio::time::sleep(pause).await;
        scripted = Some(*inner);
    }
    scripted
}

/// One answer of the control API's JSON form (see [`FakeUpstream::start_on`]).
fn parse_answer(answer: &Value) -> Option<Scripted> {
    if let Some(ms) = answer.get("after_ms").and_then(Value::as_u64) {
        let mut inner = answer.clone();
        if let Some(fields) = inner.as_object_mut() {
            fields.remove("after_ms");
        }
        return parse_answer(&inner)
            .map(|inner| Scripted::After(Duration::from_millis(ms), Box::new(inner)));
    }
    let flag = |name: &str| answer.get(name).and_then(Value::as_bool) == Some(true);
    if let Some(ms) = answer.get("delay_ms").and_then(Value::as_u64) {
        return Some(Scripted::Delay(Duration::from_millis(ms)));
    }
    if flag("early_close") {
        return Some(Scripted::EarlyClose);
    }
    if let Some(bytes) = answer.get("oversized").and_then(Value::as_u64) {
        return Some(Scripted::Oversized(
            usize::try_from(bytes).unwrap_or(usize::MAX),
        ));
    }
    if flag("incomplete_stream") {
        return Some(Scripted::IncompleteStream);
    }
    if flag("broken_stream") {
        return Some(Scripted::BrokenStream);
    }
    let status = answer.get("status").and_then(Value::as_u64)?;
    let headers = answer
        .get("headers")
        .and_then(Value::as_object)
        .map(|h| {
            h.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| v.to_string()),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let body = match answer.get("body") {
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => "{}".into(),
    };
    Some(Scripted::Fail {
        status: status.min(999) as u16,
        headers,
        body,
    })
}

async fn control_script(
    State(state): State<Arc<FakeState>>,
    axum::Json(request): axum::Json<Value>,
) -> Response {
    let Some(credential) = request.get("credential").and_then(Value::as_str) else {
        return (StatusCode::BAD_REQUEST, "credential: required").into_response();
    };
    let answers: Vec<Scripted> = request
        .get("answers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(parse_answer)
        .collect();
    let count = answers.len();
    let queue = if request.get("clients_only").and_then(Value::as_bool) == Some(true) {
        &state.client_scripts
    } else {
        &state.scripts
    };
    queue
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(credential.to_owned())
        .or_default()
        .extend(answers);
    axum::Json(json!({"queued": count})).into_response()
}

async fn control_stats(State(state): State<Arc<FakeState>>) -> Response {
    let stats = state.stats.lock().unwrap_or_else(|p| p.into_inner());
    let body: serde_json::Map<String, Value> = stats
        .iter()
        .map(|(credential, s)| {
            (
                credential.clone(),
                json!({"current": s.current, "peak": s.peak, "total": s.total}),
            )
        })
        .collect();
    axum::Json(Value::Object(body)).into_response()
}

/// What the fake received: path, query, headers (credentials masked) and body of each request.
async fn control_requests(State(state): State<Arc<FakeState>>) -> Response {
    let seen = state.seen.lock().unwrap_or_else(|p| p.into_inner());
    let requests: Vec<Value> = seen
        .iter()
        .map(|r| {
            let headers: serde_json::Map<String, Value> = r
                .headers
                .iter()
                .map(|(name, value)| {
                    let value = if matches!(name.as_str(), "authorization" | "x-api-key") {
                        "***".to_owned()
                    } else {
                        value.to_str().unwrap_or("").to_owned()
                    };
                    (name.as_str().to_owned(), Value::String(value))
                })
                .collect();
            json!({"path": r.path, "query": r.query, "headers": headers, "body": r.body, "probe": r.probe})
        })
        .collect();
    axum::Json(Value::Array(requests)).into_response()
}

async fn control_reset(State(state): State<Arc<FakeState>>) -> Response {
    let mut stats = state.stats.lock().unwrap_or_else(|p| p.into_inner());
    for stat in stats.values_mut() {
        stat.peak = stat.current;
        stat.total = 0;
    }
    StatusCode::NO_CONTENT.into_response()
}

fn credential(headers: &HeaderMap) -> String {
    if let Some(key) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return key.to_owned();
    }
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
        .to_owned()
}

/// Counts the request as in flight until dropped.
struct InFlight {
    state: Arc<FakeState>,
    credential: String,
}

impl InFlight {
    fn enter(state: &Arc<FakeState>, credential: &str) -> Self {
        let mut stats = state.stats.lock().unwrap_or_else(|p| p.into_inner());
        let stat = stats.entry(credential.to_owned()).or_default();
        stat.current += 1;
        stat.total += 1;
        stat.peak = stat.peak.max(stat.current);
        InFlight {
            state: state.clone(),
            credential: credential.to_owned(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut stats = self.state.stats.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(stat) = stats.get_mut(&self.credential) {
            stat.current = stat.current.saturating_sub(1);
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Anthropic,
    Chat,
    Responses,
}

async fn messages(
    State(state): State<Arc<FakeState>>,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer(state, Shape::Anthropic, uri, headers, body).await
}

async fn chat(
    State(state): State<Arc<FakeState>>,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer(state, Shape::Chat, uri, headers, body).await
}

async fn responses(
    State(state): State<Arc<FakeState>>,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer(state, Shape::Responses, uri, headers, body).await
}

/// An OAuth token endpoint as the providers' answer refresh requests (JSON in): a refresh token
/// is good once; the new access token is `<refresh token>-access`, the new refresh token
/// `<refresh token>-next`.
async fn oauth_token(
    State(state): State<Arc<FakeState>>,
    axum::Json(request): axum::Json<Value>,
) -> Response {
    let refresh = request
        .get("refresh_token")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let reused = {
        let mut seen = state.refreshed.lock().unwrap_or_else(|p| p.into_inner());
        let reused = seen
            .iter()
            .any(|r| r.get("refresh_token") == request.get("refresh_token"));
        seen.push(request.clone());
        reused
    };
    let pause = *state.token_delay.lock().unwrap_or_else(|p| p.into_inner());
    tokio::time::sleep(pause).await;
    if refresh.is_empty()
        || reused
        || request.get("grant_type").and_then(Value::as_str) != Some("refresh_token")
        || request
            .get("client_id")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "invalid_grant"})),
        )
            .into_response();
    }
    axum::Json(json!({
        "access_token": format!("{refresh}-access"),
        "refresh_token": format!("{refresh}-next"),
        "expires_in": 3600,
    }))
    .into_response()
}

/// An access token as ChatGPT's sign-in issues them (unsigned here): a JWT whose
/// `https://api.openai.com/auth` claim names the ChatGPT account.
pub fn fake_chatgpt_token(account_id: &str) -> String {
    use base64::Engine;
    let encode = |value: Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string().as_bytes())
    };
    format!(
        "{}.{}.fake-signature",
        encode(json!({"alg": "none", "typ": "JWT"})),
        encode(
            json!({"https://api.openai.com/auth": {"chatgpt_account_id": account_id}, "exp": 4_102_444_800u64})
        )
    )
}

/// The ChatGPT backend's Codex endpoint: refuses what the real one refuses (a missing or wrong
/// `chatgpt-account-id`, no `OpenAI-Beta: responses=experimental`, no `originator` or
/// `session_id`, `store` not false, `stream` not true), then answers as `/v1/responses`.
async fn chatgpt_codex(
    State(state): State<Arc<FakeState>>,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let token = header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let claimed = poolgate_core::account::chatgpt_account_id(token);
    let problem = if claimed.is_none() || header("chatgpt-account-id") != claimed.as_deref() {
        Some("chatgpt-account-id does not match the token")
    } else if header("openai-beta") != Some("responses=experimental") {
        Some("OpenAI-Beta: responses=experimental is required")
    } else if header("originator").is_none() {
        Some("originator is required")
    } else if header("session_id").is_none() {
        Some("session_id is required")
    } else if request.get("store") != Some(&Value::Bool(false)) {
        Some("Store must be set to false")
    } else if request.get("stream") != Some(&Value::Bool(true)) {
        Some("Stream must be set to true")
    } else {
        None
    };
    if let Some(detail) = problem {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"detail": detail})),
        )
            .into_response();
    }
    answer(state, Shape::Responses, uri, headers, body).await
}

async fn count_tokens(
    State(state): State<Arc<FakeState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let credential = credential(&headers);
    *state
        .count_tokens
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(credential.clone())
        .or_default() += 1;
    // Never the probe's: count_tokens is a client endpoint only.
    let scripted = after_pauses(take_scripted(&state, &credential, false)).await;
    let counted = json!({"input_tokens": body.len() / 4});
    match scripted {
        Some(Scripted::Fail {
            status,
            headers,
            body,
        }) => fail_response(status, headers, body),
        Some(Scripted::Delay(pause)) => {
            tokio::time::sleep(pause).await;
            axum::Json(counted).into_response()
        }
        Some(Scripted::EarlyClose) => {
            let text = counted.to_string();
            cut_short(&text, "application/json", None)
        }
        Some(Scripted::Oversized(bytes)) => oversized(bytes, "count", None),
        Some(scripted @ (Scripted::IncompleteStream | Scripted::BrokenStream)) => {
            let events = normal_events(Shape::Anthropic, "count", "count_tokens", &Value::Null);
            event_stream(
                cut_events(Shape::Anthropic, events, &scripted),
                Duration::ZERO,
                None,
            )
        }
        Some(Scripted::After(..)) | None => axum::Json(counted).into_response(),
    }
}

/// A scripted failure: this status, JSON, these headers and body.
fn fail_response(status: u16, headers: Vec<(String, String)>, body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// A 200 of `content_type` that sends the first half of `text`, then drops the connection
/// (a body stream that fails makes hyper abort the connection mid-body).
fn cut_short(text: &str, content_type: &'static str, guard: Option<InFlight>) -> Response {
    let mut half = text.len() / 2;
    while !text.is_char_boundary(half) {
        half -= 1;
    }
    let chunks = vec![
        Ok(Bytes::copy_from_slice(&text.as_bytes()[..half])),
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "scripted early close",
        )),
    ];
    let mut response = Response::new(Body::from_stream(paced(chunks, Duration::ZERO, guard)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

/// A 200 JSON answer of exactly `bytes` bytes (a message padded out), sent in pieces.
fn oversized(bytes: usize, id: &str, guard: Option<InFlight>) -> Response {
    static PADDING: [u8; 64 * 1024] = [b'x'; 64 * 1024];
    let prefix = format!(r#"{{"id":"msg_{id}","type":"message","padding":""#);
    let suffix = r#""}"#;
    let (prefix, suffix) = if bytes >= prefix.len() + suffix.len() {
        (prefix, suffix)
    } else {
        (String::new(), "")
    };
    let mut padding = bytes - prefix.len() - suffix.len();
    let mut chunks = vec![Ok(Bytes::from(prefix))];
    while padding > 0 {
        let piece = padding.min(PADDING.len());
        chunks.push(Ok(Bytes::from_static(&PADDING[..piece])));
        padding -= piece;
    }
    chunks.push(Ok(Bytes::from_static(suffix.as_bytes())));
    let mut response = Response::new(Body::from_stream(paced(chunks, Duration::ZERO, guard)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// `IncompleteStream`: the events without the terminal ones; `BrokenStream`: the first half,
/// then the connection drops. Any other answer: the events as they are.
fn cut_events(
    shape: Shape,
    mut events: Vec<String>,
    how: &Scripted,
) -> Vec<Result<Bytes, std::io::Error>> {
    let broken = matches!(how, Scripted::BrokenStream);
    match how {
        Scripted::IncompleteStream => {
            let keep = match shape {
                // Without `message_delta` (the stop reason) and `message_stop`.
                Shape::Anthropic => events.len().saturating_sub(2),
                // The first chunk only: no finish reason, no usage, no `[DONE]`.
                Shape::Chat => 1,
                // Without `response.completed`.
                Shape::Responses => events.len().saturating_sub(1),
            };
            events.truncate(keep);
        }
        Scripted::BrokenStream => events.truncate((events.len() / 2).max(1)),
        _ => {}
    }
    let mut chunks: Vec<Result<Bytes, std::io::Error>> =
        events.into_iter().map(|e| Ok(Bytes::from(e))).collect();
    if broken {
        chunks.push(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "scripted broken stream",
        )));
    }
    chunks
}

/// An SSE answer of these chunks, paced, the in-flight guard held until it ends.
fn event_stream(
    chunks: Vec<Result<Bytes, std::io::Error>>,
    chunk_delay: Duration,
    guard: Option<InFlight>,
) -> Response {
    let mut response = Response::new(Body::from_stream(paced(chunks, chunk_delay, guard)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    response
}

async fn answer(
    state: Arc<FakeState>,
    shape: Shape,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let credential = credential(&headers);
    let guard = InFlight::enter(&state, &credential);
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_owned();
    let probe = is_probe(uri.path(), &request);
    if probe {
        *state
            .probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(credential.clone())
            .or_default() += 1;
    }
    state
        .seen_models
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(model.clone());
    {
        let mut seen = state.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() < 1000 {
            seen.push(SeenRequest {
                path: uri.path().to_owned(),
                query: uri.query().map(str::to_owned),
                headers: headers.clone(),
                body: request.clone(),
                probe,
            });
        }
    }
    let stream = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let scripted = after_pauses(take_scripted(&state, &credential, probe)).await;
    let delay = *state.delay.lock().unwrap_or_else(|p| p.into_inner());
    let chunk_delay = *state.chunk_delay.lock().unwrap_or_else(|p| p.into_inner());
    let broke = state
        .out_of_credit
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&credential);
    let unknown_model = state
        .known_models
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|known| !known.contains(&model));
    let subscription = shape == Shape::Anthropic
        && state
            .claude_code_only
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&credential);
    let refused_subscription = subscription
        .then(|| claude_code_refusal(&headers, &request))
        .flatten();
    let revoked = state
        .revoked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&credential);
    let scripted = scripted.or_else(|| {
        let (status, body) = if revoked {
            (
                401,
                json!({"type": "error", "error": {"type": "authentication_error", "message": "OAuth token has been revoked."}}),
            )
        } else if let Some(refusal) = refused_subscription {
            refusal
        } else if broke {
            match shape {
                Shape::Anthropic => (
                    400,
                    json!({"type": "error", "error": {"type": "invalid_request_error", "message": "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}),
                ),
                Shape::Chat | Shape::Responses => (
                    429,
                    json!({"error": {"message": "You exceeded your current quota, please check your plan and billing details.", "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}),
                ),
            }
        } else if unknown_model {
            match shape {
                Shape::Anthropic => (
                    404,
                    json!({"type": "error", "error": {"type": "not_found_error", "message": format!("model: {model}")}}),
                ),
                Shape::Chat | Shape::Responses => (
                    404,
                    json!({"error": {"message": format!("The model `{model}` does not exist or you do not have access to it."), "type": "invalid_request_error", "param": null, "code": "model_not_found"}}),
                ),
            }
        } else {
            return None;
        };
        Some(Scripted::Fail {
            status,
            headers: Vec::new(),
            body: body.to_string(),
        })
    });
    match scripted {
        Some(Scripted::Fail {
            status,
            headers,
            body,
        }) => {
            tokio::time::sleep(delay).await;
            drop(guard);
            return fail_response(status, headers, body);
        }
        Some(Scripted::Delay(extra)) => tokio::time::sleep(delay + extra).await,
        Some(Scripted::After(..)) | None => tokio::time::sleep(delay).await,
        Some(Scripted::EarlyClose) => {
            tokio::time::sleep(delay).await;
            let id = format!("{:016x}", fastrand::u64(..));
            return if stream {
                let events = normal_events(shape, &id, &model, &request);
                cut_short(
                    events.first().map(String::as_str).unwrap_or_default(),
                    "text/event-stream",
                    Some(guard),
                )
            } else {
                let body = normal_body(shape, &id, &model).to_string();
                cut_short(&body, "application/json", Some(guard))
            };
        }
        Some(Scripted::Oversized(bytes)) => {
            tokio::time::sleep(delay).await;
            let id = format!("{:016x}", fastrand::u64(..));
            return oversized(bytes, &id, Some(guard));
        }
        Some(how @ (Scripted::IncompleteStream | Scripted::BrokenStream)) => {
            tokio::time::sleep(delay).await;
            let id = format!("{:016x}", fastrand::u64(..));
            let events = normal_events(shape, &id, &model, &request);
            return event_stream(cut_events(shape, events, &how), chunk_delay, Some(guard));
        }
    }
    let id = format!("{:016x}", fastrand::u64(..));
    if !stream {
        let body = normal_body(shape, &id, &model);
        drop(guard);
        return axum::Json(body).into_response();
    }
    let events = normal_events(shape, &id, &model, &request);
    event_stream(
        events.into_iter().map(|e| Ok(Bytes::from(e))).collect(),
        chunk_delay,
        Some(guard),
    )
}

/// The normal (non-streamed) answer of `shape`.
fn normal_body(shape: Shape, id: &str, model: &str) -> Value {
    match shape {
        Shape::Anthropic => json!({
            "id": format!("msg_{id}"), "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": "Hello from the fake upstream."}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        }),
        Shape::Chat => json!({
            "id": format!("chatcmpl-{id}"), "object": "chat.completion", "created": 1_700_000_000, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the fake upstream."}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}
        }),
        Shape::Responses => json!({
            "id": format!("resp_{id}"), "object": "response", "created_at": 1_700_000_000, "model": model, "status": "completed",
            "output": [{"type": "message", "id": format!("msg_{id}"), "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": "Hello from the fake upstream.", "annotations": []}]}],
            "usage": {"input_tokens": 10, "output_tokens": 7, "total_tokens": 17}
        }),
    }
}

/// The normal event stream of `shape` (chat: with usage when the request asked for it).
fn normal_events(shape: Shape, id: &str, model: &str, request: &Value) -> Vec<String> {
    match shape {
        Shape::Anthropic => vec![
            format!(
                "event: message_start\ndata: {}\n\n",
                json!({"type": "message_start", "message": {"id": format!("msg_{id}"), "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 1}}})
            ),
            format!(
                "event: content_block_start\ndata: {}\n\n",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            ),
            format!(
                "event: content_block_delta\ndata: {}\n\n",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}})
            ),
            format!(
                "event: content_block_delta\ndata: {}\n\n",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " there."}})
            ),
            format!(
                "event: content_block_stop\ndata: {}\n\n",
                json!({"type": "content_block_stop", "index": 0})
            ),
            format!(
                "event: message_delta\ndata: {}\n\n",
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 7}})
            ),
            format!(
                "event: message_stop\ndata: {}\n\n",
                json!({"type": "message_stop"})
            ),
        ],
        Shape::Chat => {
            // As the real API: usage only when asked for (`stream_options.include_usage`), then
            // `"usage": null` on every chunk and a last chunk with no choices and the usage.
            let with_usage = request
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                == Some(true);
            let chunk = |choices: Value, usage: Value| {
                let mut chunk = json!({"id": format!("chatcmpl-{id}"), "object": "chat.completion.chunk", "created": 1_700_000_000, "model": model, "choices": choices});
                if with_usage {
                    chunk["usage"] = usage;
                }
                format!("data: {chunk}\n\n")
            };
            let mut events = vec![
                chunk(
                    json!([{"index": 0, "delta": {"role": "assistant", "content": "Hello"}, "finish_reason": null}]),
                    Value::Null,
                ),
                chunk(
                    json!([{"index": 0, "delta": {"content": " there."}, "finish_reason": "stop"}]),
                    Value::Null,
                ),
            ];
            if with_usage {
                events.push(chunk(
                    json!([]),
                    json!({"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}),
                ));
            }
            events.push("data: [DONE]\n\n".to_owned());
            events
        }
        Shape::Responses => {
            // The full sequence the Codex CLI expects, as the real API sends it.
            let msg = format!("msg_{id}");
            let text = "Hello there.";
            let item = |status: &str, content: Value| json!({"id": msg, "type": "message", "status": status, "role": "assistant", "content": content});
            let part = json!({"type": "output_text", "text": text, "annotations": []});
            let response = |status: &str, output: Value, usage: Value| json!({"id": format!("resp_{id}"), "object": "response", "created_at": 1_700_000_000, "model": model, "status": status, "output": output, "usage": usage});
            let usage = json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 17});
            [
                json!({"type": "response.created", "response": response("in_progress", json!([]), Value::Null)}),
                json!({"type": "response.in_progress", "response": response("in_progress", json!([]), Value::Null)}),
                json!({"type": "response.output_item.added", "output_index": 0, "item": item("in_progress", json!([]))}),
                json!({"type": "response.content_part.added", "item_id": msg, "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
                json!({"type": "response.output_text.delta", "item_id": msg, "output_index": 0, "content_index": 0, "delta": text}),
                json!({"type": "response.output_text.done", "item_id": msg, "output_index": 0, "content_index": 0, "text": text}),
                json!({"type": "response.content_part.done", "item_id": msg, "output_index": 0, "content_index": 0, "part": part}),
                json!({"type": "response.output_item.done", "output_index": 0, "item": item("completed", json!([part]))}),
                json!({"type": "response.completed", "response": response("completed", json!([item("completed", json!([part]))]), usage)}),
            ]
            .into_iter()
            .enumerate()
            .map(|(sequence, mut event)| {
                event["sequence_number"] = json!(sequence);
                let name = event["type"].as_str().unwrap_or("message").to_owned();
                format!("event: {name}\ndata: {event}\n\n")
            })
            .collect()
        }
    }
}

/// Why Anthropic would refuse a subscription token on this request, if it would.
fn claude_code_refusal(headers: &HeaderMap, request: &Value) -> Option<(u16, Value)> {
    let betas = headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    let bearer =
        headers.contains_key(http::header::AUTHORIZATION) && !headers.contains_key("x-api-key");
    if !bearer || !betas.split(',').any(|b| b.trim() == "oauth-2025-04-20") {
        return Some((
            401,
            json!({"type": "error", "error": {"type": "authentication_error", "message": "OAuth authentication is currently not supported."}}),
        ));
    }
    let first = match request.get("system") {
        Some(Value::String(text)) => Some(text.as_str()),
        Some(Value::Array(blocks)) => blocks
            .first()
            .and_then(|b| b.get("text"))
            .and_then(Value::as_str),
        _ => None,
    };
    let identity = "You are Claude Code, Anthropic's official CLI for Claude.";
    if !first.is_some_and(|text| text.starts_with(identity)) {
        return Some((
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "This credential is only authorized for use with Claude Code and cannot be used for other API requests."}}),
        ));
    }
    None
}

/// The chunks one by one, `chunk_delay` apart; the in-flight guard (if any) lives until the
/// stream is done (or dropped). An `Err` chunk makes the server drop the connection there.
fn paced(
    chunks: Vec<Result<Bytes, std::io::Error>>,
    chunk_delay: Duration,
    guard: Option<InFlight>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::unfold(
        (chunks.into_iter(), 0usize, guard),
        move |(mut chunks, sent, guard)| async move {
            let chunk = chunks.next()?;
            if sent > 0 && !chunk_delay.is_zero() {
                tokio::time::sleep(chunk_delay).await;
            }
            if chunk.is_err() {
                // Pending for a moment first, so the server flushes the head and what came
                // before: the break is then mid-body, not before the head.
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            Some((chunk, (chunks, sent + 1, guard)))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anthropic_probe() -> Value {
        json!({"model": "claude-haiku-4-5", "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]})
    }

    #[test]
    fn the_probes_fixed_bodies_are_recognised_and_nothing_else() {
        assert!(is_probe("/v1/messages", &anthropic_probe()));
        let mut oauth = anthropic_probe();
        oauth["system"] =
            json!([{"type": "text", "text": poolgate_core::upstream::CLAUDE_CODE_IDENTITY}]);
        assert!(is_probe("/v1/messages", &oauth));
        assert!(is_probe(
            "/v1/chat/completions",
            &json!({"model": "gpt-4o-mini", "max_completion_tokens": 1, "messages": [{"role": "user", "content": "ping"}]})
        ));
        assert!(is_probe(
            "/backend-api/codex/responses",
            &json!({"model": "gpt-5", "instructions": "Answer in one word.", "input": [{"role": "user", "content": "ping"}], "store": false, "stream": true})
        ));
        let mut longer = anthropic_probe();
        longer["max_tokens"] = json!(2);
        let mut streamed = anthropic_probe();
        streamed["stream"] = json!(true);
        let mut other_system = anthropic_probe();
        other_system["system"] = json!("You are Claude Code, Anthropic's official CLI for Claude.");
        for body in [longer, streamed, other_system] {
            assert!(!is_probe("/v1/messages", &body), "{body}");
        }
        assert!(!is_probe("/v1/chat/completions", &anthropic_probe()));
    }

    async fn post(base: &str, credential: &str, body: &Value) -> reqwest::Response {
        // reqwest is built without a bundled TLS provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::new()
            .post(format!("{base}/v1/messages"))
            .header("x-api-key", credential)
            .json(body)
            .send()
            .await
            .expect("the fake answers")
    }

    fn client(stream: bool) -> Value {
        json!({"model": "claude-x", "max_tokens": 8, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
    }

    #[tokio::test]
    async fn client_only_answers_skip_the_probe_and_shared_ones_do_not() {
        let fake = FakeUpstream::start().await.expect("fake starts");
        let fail = |status| Scripted::Fail {
            status,
            headers: vec![],
            body: "{}".into(),
        };
        fake.script_clients("k", [fail(500)]);
        fake.script("k", [fail(503)]);
        let probe = post(&fake.base_url, "k", &anthropic_probe()).await;
        assert_eq!(
            probe.status().as_u16(),
            503,
            "the probe takes the shared queue only"
        );
        let probe = post(&fake.base_url, "k", &anthropic_probe()).await;
        assert_eq!(probe.status().as_u16(), 200);
        let answer = post(&fake.base_url, "k", &client(false)).await;
        assert_eq!(answer.status().as_u16(), 500, "the client's own answer");
        assert_eq!(fake.probe_count("k"), 2);
        let flags: Vec<bool> = fake.seen_requests().iter().map(|r| r.probe).collect();
        assert_eq!(flags, [true, true, false]);
    }

    #[tokio::test]
    async fn a_standing_answer_serves_every_request_after_the_queue_until_cleared() {
        let fake = FakeUpstream::start().await.expect("fake starts");
        let fail = |status| Scripted::Fail {
            status,
            headers: vec![],
            body: "{}".into(),
        };
        fake.script("k", [fail(529)]);
        fake.set_standing_answer(Some(fail(500)));
        let mut statuses = Vec::new();
        for (credential, body) in [
            ("k", client(false)),
            ("k", anthropic_probe()),
            ("other", client(false)),
        ] {
            statuses.push(
                post(&fake.base_url, credential, &body)
                    .await
                    .status()
                    .as_u16(),
            );
        }
        assert_eq!(
            statuses,
            [529, 500, 500],
            "the queue first, then every request"
        );
        fake.set_standing_answer(None);
        let answer = post(&fake.base_url, "k", &client(false)).await;
        assert_eq!(answer.status().as_u16(), 200);
        assert_eq!(fake.probe_count("k"), 1);
        assert_eq!(fake.count_tokens_calls("k"), 0);
    }

    #[tokio::test]
    async fn broken_answers_break_where_they_say() {
        let fake = FakeUpstream::start().await.expect("fake starts");
        fake.script_clients(
            "k",
            [
                Scripted::EarlyClose,
                Scripted::EarlyClose,
                Scripted::Oversized(200_000),
                Scripted::IncompleteStream,
                Scripted::BrokenStream,
            ],
        );
        for stream in [false, true] {
            let early = post(&fake.base_url, "k", &client(stream)).await;
            assert_eq!(early.status().as_u16(), 200);
            assert!(
                early.bytes().await.is_err(),
                "an early close (stream {stream})"
            );
        }
        let big = post(&fake.base_url, "k", &client(false)).await;
        let body = big.bytes().await.expect("a whole body");
        assert_eq!(body.len(), 200_000);
        assert!(serde_json::from_slice::<Value>(&body).is_ok(), "still JSON");
        let incomplete = post(&fake.base_url, "k", &client(false)).await;
        let text = incomplete.text().await.expect("ends cleanly");
        assert!(text.contains("content_block_delta") && !text.contains("message_stop"));
        let broken = post(&fake.base_url, "k", &client(true)).await;
        assert!(broken.bytes().await.is_err(), "a stream broken mid-way");
        for _ in 0..100 {
            if fake.stats("k").current == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(fake.stats("k").current, 0, "nothing left in flight");
    }
}
