//! A fake upstream LLM server speaking enough of the Anthropic and OpenAI APIs for the demo
//! (`relay-svc --standalone --demo`), the tests and the benchmarks. It counts concurrent requests
//! per credential (and their peak), and answers from a per-credential script of queued outcomes
//! (429, 529, 500, 401, quota, delays), so tests can drive every failover path.

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
}

/// One request as the fake upstream received it (the first 1 000 are kept).
#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub path: String,
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Value,
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
    /// {"delay_ms": 500}]}`), `GET /_mock/stats` (per credential: current, peak, total) and
    /// `POST /_mock/reset` (peaks back to the current count).
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

    /// Queues answers for requests made with `credential`.
    pub fn script(&self, credential: &str, answers: impl IntoIterator<Item = Scripted>) {
        let mut scripts = self.state.scripts.lock().unwrap_or_else(|p| p.into_inner());
        scripts
            .entry(credential.to_owned())
            .or_default()
            .extend(answers);
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
}

async fn control_script(
    State(state): State<Arc<FakeState>>,
    axum::Json(request): axum::Json<Value>,
) -> Response {
    let Some(credential) = request.get("credential").and_then(Value::as_str) else {
        return (StatusCode::BAD_REQUEST, "credential: required").into_response();
    };
    let mut answers = Vec::new();
    for answer in request
        .get("answers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(ms) = answer.get("delay_ms").and_then(Value::as_u64) {
            answers.push(Scripted::Delay(Duration::from_millis(ms)));
        } else if let Some(status) = answer.get("status").and_then(Value::as_u64) {
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
            answers.push(Scripted::Fail {
                status: status.min(999) as u16,
                headers,
                body,
            });
        }
    }
    let count = answers.len();
    state
        .scripts
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
            json!({"path": r.path, "query": r.query, "headers": headers, "body": r.body})
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
    let mut seen = state.refreshed.lock().unwrap_or_else(|p| p.into_inner());
    let reused = seen
        .iter()
        .any(|r| r.get("refresh_token") == request.get("refresh_token"));
    seen.push(request.clone());
    drop(seen);
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
    let scripted = state
        .scripts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_mut(&credential(&headers))
        .and_then(VecDeque::pop_front);
    if let Some(Scripted::Fail { status, body, .. }) = scripted {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (
            status,
            [(http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
    }
    axum::Json(json!({"input_tokens": body.len() / 4})).into_response()
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
            });
        }
    }
    let stream = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let scripted = state
        .scripts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_mut(&credential)
        .and_then(VecDeque::pop_front);
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
            drop(guard);
            return response;
        }
        Some(Scripted::Delay(extra)) => tokio::time::sleep(delay + extra).await,
        None => tokio::time::sleep(delay).await,
    }
    let id = format!("{:016x}", fastrand::u64(..));
    if !stream {
        let body = match shape {
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
        };
        drop(guard);
        return axum::Json(body).into_response();
    }
    let events: Vec<String> = match shape {
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
    };
    let stream = async_stream(events, chunk_delay, guard);
    let mut response = Response::new(Body::from_stream(stream));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    response
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

/// The events one by one; the in-flight guard lives until the stream is done (or dropped).
fn async_stream(
    events: Vec<String>,
    chunk_delay: Duration,
    guard: InFlight,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::unfold(
        (events.into_iter(), 0usize, guard),
        move |(mut events, sent, guard)| async move {
            let event = events.next()?;
            if sent > 0 {
                tokio::time::sleep(chunk_delay).await;
            }
            Some((Ok(Bytes::from(event)), (events, sent + 1, guard)))
        },
    )
}
