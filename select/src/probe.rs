//! The probe: before an answer a client's request may have shaped changes an account's health,
//! poolgate asks the upstream again with a request the client cannot shape — a fixed minimal
//! request built here (`max_tokens: 1`, the platform's probe model) — under an admission lease,
//! so the probe never takes the account over its concurrency limit. The same probe is a
//! half-open breaker's check: no client request is let through as the probe (a crafted one
//! could keep the breaker open).
//!
//! This module is the probe; what its answer does, under which lock, is `confirmations.rs`
//! (and the engine's half-open check).

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use poolgate_core::lease::LeaseTerms;
use poolgate_runtime::ports::ProbeLeases;
use serde_json::json;

use poolgate_core::Clock;
use poolgate_core::account::{Account, CredentialKind, Platform, Service, chatgpt_account_id};
use poolgate_core::classify::{Classified, UpstreamError, classify, network_failure};
use poolgate_core::outcome::OutcomeClass;
use poolgate_core::upstream::{chatgpt_responses_url, upstream_url};
use poolgate_core::windows::{WindowReading, read_windows};

/// How a confirmation runs.
#[derive(Debug, Clone)]
pub struct ProbeSettings {
    /// Bound on the whole probe call (connect, answer, body).
    pub timeout: Duration,
    /// How long the probe waits for a slot on the account.
    pub lease_wait: Duration,
    /// The "confirming" hard block while the probe runs, and the lock's lifetime: longer than
    /// `lease_wait + timeout`, so a selector that dies mid-way leaves nothing behind for long.
    pub block: Duration,
    /// The probe model per platform, unless the account's `probe_model` says otherwise.
    pub anthropic_model: String,
    pub openai_model: String,
    /// The probe model of an account that serves embeddings but not chat, and of a rerank
    /// account.
    pub embeddings_model: String,
    pub rerank_model: String,
    /// After a confirmation the probe did not bear out, the account's next suspicious answers
    /// start none for this long: a client that keeps sending a request the upstream chokes on
    /// cannot keep the account blocked probe after probe.
    pub quiet_after_unconfirmed: Duration,
    /// A probe that could not be sent (no slot in time) is tried again after each of these,
    /// with the "confirming" block lifted meanwhile; then the quiet period starts. No client
    /// behaviour keeps an account confirming.
    pub inconclusive_retries: Vec<Duration>,
    /// How long a report of a refused OAuth token waits for the probe or refresh of that token
    /// to end (so concurrent refusals get the new token), within the request's wait budget.
    pub refusal_wait: Duration,
    /// After a token refresh, a refused probe with the new token blocks and counts instead of
    /// refreshing again, for this long (at most one refresh per account per floor).
    pub refresh_floor: Duration,
}

impl Default for ProbeSettings {
    fn default() -> Self {
        ProbeSettings {
            timeout: Duration::from_secs(30),
            lease_wait: Duration::from_secs(20),
            block: Duration::from_secs(90),
            anthropic_model: "claude-haiku-4-5".into(),
            openai_model: "gpt-4o-mini".into(),
            embeddings_model: "text-embedding-3-small".into(),
            rerank_model: "rerank-v3.5".into(),
            quiet_after_unconfirmed: Duration::from_secs(60),
            inconclusive_retries: vec![
                Duration::from_secs(5),
                Duration::from_secs(10),
                Duration::from_secs(20),
            ],
            refusal_wait: Duration::from_secs(10),
            refresh_floor: Duration::from_secs(60),
        }
    }
}

impl ProbeSettings {
    pub fn model_for(&self, account: &Account) -> String {
        match &account.probe_model {
            Some(model) if !model.is_empty() => model.clone(),
            _ => match ProbeKind::of(account) {
                ProbeKind::Messages => self.anthropic_model.clone(),
                ProbeKind::ChatGpt | ProbeKind::Chat => self.openai_model.clone(),
                ProbeKind::Embeddings => self.embeddings_model.clone(),
                ProbeKind::Rerank => self.rerank_model.clone(),
            },
        }
    }
}

/// Why `probe_model` may not be the probe's model on an account of this platform and
/// credential kind, or `None` when it may. Since 2026 Anthropic serves a subscription (OAuth)
/// token on a non-Haiku model only to Claude Code's own requests (docs/SUBSCRIPTIONS.md), and
/// the probe is no client's: a Claude OAuth account's probe model must be a Haiku model. Every
/// place that sets an account's `probe_model` asks this (gRPC `UpsertAccount`, `selector-svc
/// admin upsert-account`, the standalone config file).
pub fn probe_model_refusal(
    platform: Platform,
    kind: CredentialKind,
    probe_model: &str,
) -> Option<String> {
    let model = probe_model.trim();
    if model.is_empty() || platform != Platform::Anthropic || kind != CredentialKind::OAuth {
        return None;
    }
    if model.to_ascii_lowercase().contains("haiku") {
        return None;
    }
    Some(format!(
        "a Claude OAuth account's probe must use a Haiku model (Anthropic serves subscription \
         tokens on other models only to Claude Code's own requests); got {model:?}"
    ))
}

/// What the probe got.
#[derive(Debug, Clone, PartialEq)]
pub struct Probed {
    /// Upstream status; 0 when no answer came.
    pub status: u16,
    pub classified: Classified,
    /// The error's `type/code` (never its message), for the status reason.
    pub summary: String,
    /// What the answer's headers said about the account's usage windows (none without an
    /// answer); stored where the answer is applied.
    pub windows: Vec<WindowReading>,
}

/// What a confirmation suspects (the selector engine and standalone mode alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suspicion {
    /// A billing-class answer: retire when confirmed.
    QuotaGone,
    /// The upstream failed on a request, or gave no answer after it started: hard block and
    /// breaker count when confirmed.
    Broken,
    /// The upstream refused the credential (or a 401/403 said neither request nor credential):
    /// block and count when confirmed; an OAuth token is refreshed first.
    Unauthorized,
}

impl Suspicion {
    pub fn as_str(self) -> &'static str {
        match self {
            Suspicion::QuotaGone => "quota_gone",
            Suspicion::Broken => "broken",
            Suspicion::Unauthorized => "unauthorized",
        }
    }

    /// The class a probe's answer must have to bear the suspicion out.
    pub fn class(self) -> OutcomeClass {
        match self {
            Suspicion::QuotaGone => OutcomeClass::QuotaGone,
            Suspicion::Broken => OutcomeClass::Broken,
            Suspicion::Unauthorized => OutcomeClass::Unauthorized,
        }
    }
}

/// Which request an account's probe is: one its upstream answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// Anthropic Messages.
    Messages,
    /// The ChatGPT backend's Codex Responses.
    ChatGpt,
    /// OpenAI chat completions.
    Chat,
    /// `/v1/embeddings`: an account that serves embeddings and not chat.
    Embeddings,
    /// `/v1/rerank` (Cohere's format; Jina and vLLM serve the same path).
    Rerank,
}

impl ProbeKind {
    pub fn of(account: &Account) -> ProbeKind {
        match account.platform {
            Platform::Anthropic => ProbeKind::Messages,
            Platform::Rerank => ProbeKind::Rerank,
            Platform::OpenAi if account.credential_kind == CredentialKind::ChatGptOAuth => {
                ProbeKind::ChatGpt
            }
            Platform::OpenAi if !account.serves(Service::Chat) => ProbeKind::Embeddings,
            Platform::OpenAi => ProbeKind::Chat,
        }
    }
}

/// The probe request: fixed, minimal, nothing of any client in it.
pub fn probe_request(
    client: &reqwest::Client,
    account: &Account,
    model: &str,
) -> reqwest::RequestBuilder {
    let credential = account.credential.expose();
    match ProbeKind::of(account) {
        ProbeKind::Messages => {
            let body = json!({
                "model": model,
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "ping"}],
            });
            let request = client
                .post(upstream_url(&account.base_url, "/v1/messages"))
                .header("anthropic-version", "2023-06-01");
            match account.credential_kind {
                CredentialKind::ApiKey | CredentialKind::ChatGptOAuth => {
                    request.header("x-api-key", credential).json(&body)
                }
                // No client's identity and no client's beta: the probe is poolgate's own request,
                // on a Haiku model (`probe_model_refusal`), which Anthropic serves a subscription
                // token without Claude Code's billing block (docs/SUBSCRIPTIONS.md, "Probes and
                // usage readings").
                CredentialKind::OAuth => request
                    .bearer_auth(credential)
                    .header("anthropic-beta", "oauth-2025-04-20")
                    .json(&body),
            }
        }
        ProbeKind::ChatGpt => {
            let mut request = client
                .post(chatgpt_responses_url(&account.base_url))
                .bearer_auth(credential)
                .header("openai-beta", "responses=experimental")
                .header("originator", "codex_cli_rs")
                // The ChatGPT backend refuses a request without one (400), as it would every
                // probe: a fresh id per probe, so it binds nothing.
                .header(
                    "session_id",
                    format!("poolgate-probe-{:016x}", fastrand::u64(..)),
                );
            if let Some(id) = chatgpt_account_id(credential) {
                request = request.header("chatgpt-account-id", id);
            }
            request.json(&json!({
                "model": model,
                "instructions": "Answer in one word.",
                "input": [{"role": "user", "content": "ping"}],
                "store": false,
                "stream": true,
            }))
        }
        ProbeKind::Chat => client
            .post(upstream_url(&account.base_url, "/v1/chat/completions"))
            .bearer_auth(credential)
            .json(&json!({
                "model": model,
                "max_completion_tokens": 1,
                "messages": [{"role": "user", "content": "ping"}],
            })),
        ProbeKind::Embeddings => client
            .post(upstream_url(&account.base_url, "/v1/embeddings"))
            .bearer_auth(credential)
            .json(&json!({"model": model, "input": "ping"})),
        ProbeKind::Rerank => client
            .post(upstream_url(&account.base_url, "/v1/rerank"))
            .bearer_auth(credential)
            .json(&json!({"model": model, "query": "ping", "documents": ["ping"]})),
    }
}

/// Sends the probe and classifies its answer with the relay's rules, at `clock`'s time.
pub async fn send_probe(
    client: &reqwest::Client,
    account: &Account,
    settings: &ProbeSettings,
    hard_block_threshold_ms: u64,
    clock: &Clock,
) -> Probed {
    let model = settings.model_for(account);
    let request = probe_request(client, account, &model).timeout(settings.timeout);
    let response = match request.send().await {
        Ok(response) => response,
        Err(error) => {
            tracing::warn!(account_id = account.id, error = %error.without_url(), "confirmation probe got no answer");
            return Probed {
                status: 0,
                classified: network_failure(),
                summary: "network".into(),
                windows: Vec::new(),
            };
        }
    };
    let status = response.status().as_u16();
    let headers: HeaderMap = response.headers().clone();
    let windows = read_windows(response.headers(), clock.wall_ms());
    let body = response.bytes().await.unwrap_or_default();
    let body = &body[..body.len().min(64 * 1024)];
    Probed {
        status,
        windows,
        classified: classify(
            status,
            &headers,
            body,
            clock.wall_ms(),
            hard_block_threshold_ms,
        ),
        summary: UpstreamError::parse(body)
            .map(|e| e.summary())
            .unwrap_or_default(),
    }
}

/// The probe under a lease on the account: its cooldown (a "confirming" block) does not refuse
/// the lease; its concurrency and RPM limits do. `Err`: no probe was sent, and why.
pub async fn probe_under_lease(
    leases: &Arc<dyn ProbeLeases>,
    client: &reqwest::Client,
    account: &Account,
    settings: &ProbeSettings,
    hard_block_threshold_ms: u64,
    clock: &Clock,
) -> Result<Probed, &'static str> {
    let terms = LeaseTerms {
        account_id: account.id,
        concurrency_limit: account.concurrency_limit,
        rpm_limit: account.rpm_limit,
        user: None,
        session_hash: None,
        session_window_limit_micros: 0,
        session_bound: false,
        ignore_cooldown: true,
        key: None,
    };
    let lease = match leases.acquire_probe(&terms, settings.lease_wait).await {
        Ok(Some(lease_id)) => lease_id,
        Ok(None) => return Err("no_slot"),
        Err(error) => {
            tracing::warn!(account_id = account.id, %error, "probe: admission unavailable");
            return Err("admission_unavailable");
        }
    };
    let probed = send_probe(client, account, settings, hard_block_threshold_ms, clock).await;
    leases.release_probe(&lease, &terms).await;
    Ok(probed)
}

/// What a half-open breaker's probe decides: only the upstream's own failure (5xx, no
/// answer) keeps the breaker open; any other answer shows the account is reachable.
pub fn breaker_closes(probed: &Probed) -> bool {
    probed.classified.class != OutcomeClass::Broken
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use poolgate_core::account::{AccountStatus, Secret};

    /// An active account for unit tests.
    pub(crate) fn test_account(
        platform: Platform,
        kind: CredentialKind,
        credential: &str,
        base_url: &str,
    ) -> Account {
        Account {
            serves: Vec::new(),
            id: 1,
            name: "a1".into(),
            group: "g".into(),
            platform,
            base_url: base_url.into(),
            credential_kind: kind,
            credential: Secret::new(credential),
            oauth: None,
            status: AccountStatus::Active,
            status_reason: String::new(),
            priority: 0,
            weight: 1,
            concurrency_limit: 0,
            rpm_limit: 0,
            session_window_limit_usd: 0.0,
            allowed_models: vec![],
            model_mapping: Default::default(),
            proxy_url: None,
            probe_model: None,
            stream_usage: true,
            identity: Default::default(),
        }
    }

    fn account(platform: Platform, kind: CredentialKind) -> Account {
        test_account(platform, kind, "tok", "http://127.0.0.1:9")
    }

    /// The probe is poolgate's own request; nothing in it presents it as Claude Code
    /// (no identity line, no `claude-code-*` beta), on any account.
    #[test]
    fn the_probe_carries_no_clients_identity() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::new();
        for kind in [CredentialKind::OAuth, CredentialKind::ApiKey] {
            let account = account(Platform::Anthropic, kind);
            let request = probe_request(&client, &account, "claude-haiku-4-5")
                .build()
                .expect("builds");
            let body: serde_json::Value =
                serde_json::from_slice(request.body().and_then(|b| b.as_bytes()).expect("a body"))
                    .expect("json");
            assert!(body.get("system").is_none(), "{kind:?}: {body}");
            assert!(
                !body.to_string().contains("Claude Code"),
                "{kind:?}: {body}"
            );
            let betas = request
                .headers()
                .get("anthropic-beta")
                .map(|v| v.to_str().unwrap_or_default().to_owned())
                .unwrap_or_default();
            assert!(!betas.contains("claude-code"), "{kind:?}: {betas}");
            if kind == CredentialKind::OAuth {
                assert_eq!(betas, "oauth-2025-04-20");
            }
        }
    }

    #[test]
    fn a_claude_oauth_probe_model_must_be_haiku() {
        let (a, o) = (Platform::Anthropic, Platform::OpenAi);
        assert!(probe_model_refusal(a, CredentialKind::OAuth, "claude-sonnet-4-6").is_some());
        assert!(probe_model_refusal(a, CredentialKind::OAuth, "claude-opus-4-1").is_some());
        assert!(probe_model_refusal(a, CredentialKind::OAuth, "claude-haiku-4-5").is_none());
        assert!(probe_model_refusal(a, CredentialKind::OAuth, "").is_none());
        assert!(probe_model_refusal(a, CredentialKind::ApiKey, "claude-sonnet-4-6").is_none());
        assert!(probe_model_refusal(o, CredentialKind::ChatGptOAuth, "gpt-5").is_none());
    }

    #[test]
    fn urls_join_with_or_without_v1() {
        assert_eq!(
            upstream_url("https://api.anthropic.com", "/v1/messages"),
            "https://api.anthropic.com/v1/messages"
        );
        assert_eq!(
            upstream_url("http://127.0.0.1:9/v1/", "/v1/chat/completions"),
            "http://127.0.0.1:9/v1/chat/completions"
        );
    }
}
