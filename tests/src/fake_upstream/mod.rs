//! A fake upstream LLM server speaking enough of the Anthropic and OpenAI APIs (and of OpenAI's
//! embeddings and Cohere's rerank) for the demo (`relay-svc --standalone --demo`), the tests and
//! the benchmarks. It counts concurrent requests per credential (and their peak), and answers
//! from a per-credential script of queued outcomes (429, 529, 500, 401, quota, delays,
//! connections that break, answers too large), so tests can drive every failover path.
//!
//! A test can also give every request one standing answer (`set_standing_answer`: an upstream
//! that fails or refuses everything until told otherwise), and the OAuth token endpoint
//! (`/oauth/token`) refreshes tokens as the providers' do, counting each refresh request.
//!
//! It tells the selector's confirmation probe (the fixed bodies of `selector-svc/src/confirm.rs`
//! `probe_request`) from client requests, so a test can give clients hostile answers while the
//! probe, which no client shapes, gets a healthy one (`script_clients`), or script both alike
//! (`script`) when the upstream really is broken.
//!
//! `mod.rs` holds the server's state and its public API; the rest is split by job: the model
//! endpoints (`answer`), the Anthropic-only parts (`anthropic`), the ChatGPT backend
//! (`chatgpt`), the embeddings and rerank endpoints (`plain`, their checks and answers in
//! `embeddings` and `rerank`), the OAuth token endpoint (`oauth`), the probe's recognition
//! (`probe`), the scripted answers (`scripted`) and the control API that queues them
//! (`control`), the normal answers (`bodies`) and the response builders (`stream`).
//!
//! A credential can also be given usage windows (`set_windows`: a 5-hour-like and a weekly-like
//! budget, a per-minute request limit), reported in the real upstreams' rate-limit headers on
//! every model answer and enforced with their 429s (`windows`, which states how they run).
//! Without them nothing of this shows.

mod answer;
mod anthropic;
mod bodies;
mod chatgpt;
mod control;
mod embeddings;
#[cfg(test)]
mod embeddings_rerank_tests;
mod oauth;
mod plain;
mod probe;
mod rerank;
mod scripted;
mod socket;
mod stream;
#[cfg(test)]
mod tests;
mod usage_api;
mod windows;
#[cfg(test)]
mod windows_tests;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::HeaderMap;
use serde_json::Value;

pub use anthropic::{
    BILLING_BLOCK_OPENING, THIRD_PARTY_MESSAGE, ThirdPartyAnswer, opens_with_billing_block,
};
pub use chatgpt::fake_chatgpt_token;
pub use probe::is_probe;
pub use scripted::Scripted;
pub use windows::{ModelFamily, ModelWindow, WARNING_AT, Window, WindowBudgets, WindowUnit};

use answer::{chat, messages, responses};
use anthropic::count_tokens;
use chatgpt::chatgpt_codex;
use control::{control_requests, control_reset, control_script, control_stats, control_windows};
use oauth::oauth_token;
use plain::{embeddings, rerank_v1, rerank_v2};
use socket::{chatgpt_socket, platform_socket};

/// One request as the fake upstream received it (the first 1 000 are kept).
#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub path: String,
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Value,
    /// The body's bytes as they arrived.
    pub raw: bytes::Bytes,
    /// The selector's confirmation probe (one of its fixed bodies), not a client's request.
    pub probe: bool,
    /// The upstream socket that carried it (numbered from 1 as they open), as a
    /// `response.create` frame (`body` and `raw` are the frame); `None` over HTTP.
    pub socket: Option<u64>,
}

/// A request that came as a socket's frame (`socket.rs`): recorded as the frame, answered as
/// the body the socket stands for.
pub(super) struct Via {
    socket: u64,
    frame: bytes::Bytes,
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
    /// Claude subscription (OAuth) tokens: served only with the OAuth beta, and on a non-Haiku
    /// model only on requests that open `system` with Claude Code's billing block, as
    /// Anthropic's API does since 2026-03-17 (`anthropic::claude_code_refusal`).
    claude_code_only: Mutex<HashSet<String>>,
    /// How the third-party refusal is worded.
    third_party_answer: Mutex<anthropic::ThirdPartyAnswer>,
    /// Revoked access tokens: every request with one gets a 401.
    revoked: Mutex<HashSet<String>>,
    /// Refresh tokens used at `/oauth/token` (each is good once, as upstream).
    refreshed: Mutex<Vec<Value>>,
    /// Usage windows per credential (only those given some).
    windows: Mutex<HashMap<String, windows::Account>>,
    /// Calls of the usage endpoints per credential (`usage_api`).
    usage_calls: Mutex<HashMap<String, u64>>,
    /// The usage endpoints answer 404 (an upstream that has none).
    no_usage_endpoints: Mutex<bool>,
    /// Upstream sockets opened so far.
    sockets_opened: std::sync::atomic::AtomicU64,
    /// Socket upgrades are answered 405 (an upstream that has no socket).
    no_sockets: Mutex<bool>,
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

    /// Starts on `addr`. Besides the model APIs (Anthropic's, OpenAI's chat, Responses and
    /// embeddings, Cohere's rerank at `/v1/rerank` and `/v2/rerank`) it serves a control API: `POST /_mock/script`
    /// (`{"credential": "...", "answers": [{"status": 429, "headers": {...}, "body": "..."},
    /// {"delay_ms": 500}, {"early_close": true}, {"oversized": 100000},
    /// {"incomplete_stream": true}, {"broken_stream": true}, {"after_ms": 900, "status": 401}]}`,
    /// with `"clients_only": true` for answers the probe skips), `GET /_mock/stats` (per
    /// credential: current, peak, total), `GET /_mock/requests` (what was received, `probe`
    /// marking the selector's), `POST /_mock/reset` (peaks back to the current count) and
    /// `POST /_mock/windows` (`{"credential": "...", "unit": "requests" | "tokens",
    /// "five_hour": {"seconds": 2, "capacity": 3}, "weekly": {"seconds": 60, "capacity": 10,
    /// "start": <epoch s, optional>}, "per_minute": {"capacity": 5, "seconds": 60}}`, any of the
    /// three omitted; none: the credential's windows cleared).
    pub async fn start_on(addr: std::net::SocketAddr) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(FakeState::default());
        let router = Router::new()
            .route("/v1/messages", post(messages))
            .route("/v1/messages/count_tokens", post(count_tokens))
            .route("/v1/chat/completions", post(chat))
            .route("/v1/responses", post(responses).get(platform_socket))
            .route("/v1/embeddings", post(embeddings))
            .route("/v1/rerank", post(rerank_v1))
            .route("/v2/rerank", post(rerank_v2))
            .route("/codex/responses", post(chatgpt_codex).get(chatgpt_socket))
            .route("/oauth/token", post(oauth_token))
            .route(
                "/backend-api/codex/responses",
                post(chatgpt_codex).get(chatgpt_socket),
            )
            .route(
                "/api/oauth/usage",
                axum::routing::get(usage_api::claude_usage),
            )
            .route("/wham/usage", axum::routing::get(usage_api::chatgpt_usage))
            .route(
                "/backend-api/wham/usage",
                axum::routing::get(usage_api::chatgpt_usage),
            )
            .route("/_mock/script", post(control_script))
            .route("/_mock/stats", axum::routing::get(control_stats))
            .route("/_mock/reset", post(control_reset))
            .route("/_mock/requests", axum::routing::get(control_requests))
            .route("/_mock/windows", post(control_windows))
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

    /// How a third-party request on a subscription token is refused: the newest wording
    /// (the default) or the bare "Error" of March 2026.
    pub fn set_third_party_answer(&self, answer: ThirdPartyAnswer) {
        *self
            .state
            .third_party_answer
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = answer;
    }

    /// `credential` is a Claude subscription token: Messages requests without the
    /// `oauth-2025-04-20` beta get a 401, and those on a non-Haiku model whose `system` does not
    /// open with Claude Code's billing block get Anthropic's third-party 400
    /// (`anthropic::claude_code_refusal`).
    pub fn set_claude_code_only(&self, credential: &str) {
        self.state
            .claude_code_only
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(credential.to_owned());
    }

    /// Gives `credential` usage windows, replacing any it had (usage back to nothing): its
    /// answers carry the upstreams' rate-limit headers and a request on an exhausted window gets
    /// the real 429. Budgets with no window clear them (see the `windows` module for how they
    /// run, count and refuse).
    pub fn set_windows(&self, credential: &str, budgets: WindowBudgets) {
        windows::set(&self.state, credential, budgets);
    }

    /// `credential` has no usage windows any more: no rate-limit headers, no refusals.
    pub fn clear_windows(&self, credential: &str) {
        windows::set(&self.state, credential, WindowBudgets::default());
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

    /// `false`: the usage endpoints answer 404, as a base URL that is not the upstream's would
    /// (its accounts' confirmations keep the inference probe).
    pub fn set_usage_endpoints(&self, served: bool) {
        *self
            .state
            .no_usage_endpoints
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = !served;
    }

    /// How many calls of the usage endpoints (Claude's `/api/oauth/usage`, ChatGPT's
    /// `/wham/usage`) came with `credential`.
    pub fn usage_calls(&self, credential: &str) -> u64 {
        self.state
            .usage_calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(credential)
            .copied()
            .unwrap_or(0)
    }

    /// How many upstream sockets were opened (the Responses WebSocket, `socket.rs`).
    pub fn sockets_opened(&self) -> u64 {
        self.state
            .sockets_opened
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// `false`: socket upgrades are answered 405, as an upstream with no socket would.
    pub fn set_sockets(&self, served: bool) {
        *self
            .state
            .no_sockets
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = !served;
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
