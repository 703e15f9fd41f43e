//! The upstream request: URL, the header rules (what passes from the client, what the relay
//! sets: credentials, betas, a subscription account's identity), the body as the account needs
//! it (mapped model, Claude Code's identity line, usage asked for); the headers a response
//! keeps on its way back; the HTTP clients (one per account proxy).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use poolgate_core::account::{CredentialKind, chatgpt_account_id};
use poolgate_core::upstream::{CLAUDE_CODE_IDENTITY, chatgpt_responses_url, upstream_url};
use serde_json::Value;

use super::{Inbound, Relay};
use crate::api::Api;
use crate::backends::Planned;

/// Request headers passed upstream as they are: what the official SDKs and CLIs send (Claude
/// Code: `anthropic-*`, `x-app`, `x-stainless-*`, `x-claude-code-session-id`; Codex: `originator`,
/// `session-id`, `thread-id`, `x-client-request-id`, `x-codex-*`). Everything else (credentials,
/// cookies, hop-by-hop, encodings, `host`) is dropped or set by the relay.
const PASSED_HEADERS: [&str; 11] = [
    "content-type",
    "accept",
    "user-agent",
    "idempotency-key",
    "openai-beta",
    "originator",
    "session-id",
    "session_id",
    "thread-id",
    "x-client-request-id",
    "x-app",
];

/// Header prefixes passed upstream (`anthropic-beta` is merged with the account's own betas).
const PASSED_PREFIXES: [&str; 4] = ["anthropic-", "x-stainless-", "x-codex-", "x-claude-code-"];

/// Whether a client's request header goes upstream.
pub fn passes_upstream(name: &str) -> bool {
    PASSED_HEADERS.contains(&name)
        || (PASSED_PREFIXES.iter().any(|p| name.starts_with(p)) && name != "anthropic-beta")
}

/// The `anthropic-beta` value sent upstream: the client's betas (every header line, comma
/// lists) and the account's own, each once, in order.
pub fn merged_betas(client: &HeaderMap, own: &[&str]) -> Option<String> {
    let mut betas: Vec<String> = Vec::new();
    let client_betas = client
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim);
    for beta in client_betas.chain(own.iter().copied()) {
        if !beta.is_empty() && !betas.iter().any(|b| b == beta) {
            betas.push(beta.to_owned());
        }
    }
    (!betas.is_empty()).then(|| betas.join(","))
}

/// Response headers never copied back (hop-by-hop, or re-computed).
const DROPPED_RESPONSE_HEADERS: [&str; 6] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "content-encoding",
    "keep-alive",
    "x-request-id",
];

/// An HTTP client the relay could not build.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    /// The proxy URL is not one (not printed: it may carry the proxy's password).
    #[error("bad proxy url")]
    BadProxy,
    #[error("http client: {0}")]
    Build(reqwest::Error),
}

pub(super) fn build_client(
    timeout: Duration,
    proxy: Option<&str>,
) -> Result<reqwest::Client, HttpClientError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10).min(timeout))
        .read_timeout(timeout)
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true);
    if let Some(proxy) = proxy {
        builder = builder.proxy(reqwest::Proxy::all(proxy).map_err(|_| HttpClientError::BadProxy)?);
    }
    builder.build().map_err(HttpClientError::Build)
}

impl Relay {
    /// The client for an account's proxy (built once per proxy), or the direct one.
    fn client_for(&self, proxy: Option<&str>) -> reqwest::Client {
        let Some(proxy) = proxy.filter(|p| !p.is_empty()) else {
            return self.http.clone();
        };
        let mut proxied = self.proxied.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = proxied.get(proxy) {
            return client.clone();
        }
        match build_client(self.settings.upstream_timeout, Some(proxy)) {
            Ok(client) => {
                proxied.insert(proxy.to_owned(), client.clone());
                client
            }
            Err(error) => {
                tracing::warn!(%error, "account proxy unusable; calling directly");
                self.http.clone()
            }
        }
    }

    /// The request `account` gets for `inbound`.
    pub(super) fn upstream_request(
        &self,
        inbound: &Inbound,
        account: &Planned,
    ) -> reqwest::RequestBuilder {
        let client = self.client_for(account.proxy_url.as_deref());
        let chatgpt = account.credential_kind == CredentialKind::ChatGptOAuth;
        let url = match &inbound.query {
            _ if chatgpt => chatgpt_responses_url(&account.base_url),
            Some(query) => format!("{}?{query}", upstream_url(&account.base_url, inbound.path)),
            None => upstream_url(&account.base_url, inbound.path),
        };
        let mut request = client.post(url);
        for (name, value) in &inbound.headers {
            // The ChatGPT backend gets its own `openai-beta` and session headers below.
            let replaced =
                chatgpt && matches!(name.as_str(), "openai-beta" | "session_id" | "session-id");
            if passes_upstream(name.as_str()) && !replaced {
                request = request.header(name, value);
            }
        }
        if chatgpt {
            // What the Codex CLI sends the ChatGPT backend with a subscription sign-in (see
            // docs/SUBSCRIPTIONS.md): the account (from the token's auth claim), the beta, who
            // is calling, and the session (the client's, else the relay's session hash).
            request = request.header("openai-beta", "responses=experimental");
            if let Some(id) = chatgpt_account_id(account.credential.expose()) {
                request = request.header("chatgpt-account-id", id);
            }
            if !inbound.headers.contains_key("originator") {
                request = request.header("originator", "codex_cli_rs");
            }
            let session = ["session-id", "session_id"]
                .iter()
                .find_map(|name| inbound.headers.get(*name).cloned())
                .or_else(|| {
                    inbound
                        .session_hash
                        .as_deref()
                        .and_then(|s| HeaderValue::from_str(s).ok())
                });
            if let Some(session) = session {
                request = request.header("session_id", session);
            }
        }
        request = request.header(http::header::ACCEPT_ENCODING, "identity");
        let credential = account.credential.expose();
        // `anthropic-beta` goes upstream once: the client's list, plus the account's own. A
        // subscription (OAuth) token serves only Claude Code's requests: other clients' requests
        // get Claude Code's identity (its beta here, its system line below).
        let as_claude_code = needs_claude_code_identity(inbound, account);
        let own_betas: &[&str] = match (inbound.api, account.credential_kind) {
            (Api::Anthropic, CredentialKind::OAuth) if as_claude_code => {
                &["claude-code-20250219", "oauth-2025-04-20"]
            }
            (Api::Anthropic, CredentialKind::OAuth) => &["oauth-2025-04-20"],
            _ => &[],
        };
        if let Some(betas) = merged_betas(&inbound.headers, own_betas) {
            request = request.header("anthropic-beta", betas);
        }
        request = match (inbound.api, account.credential_kind) {
            (Api::Anthropic, CredentialKind::ApiKey | CredentialKind::ChatGptOAuth) => {
                request.header("x-api-key", credential)
            }
            (Api::Anthropic, CredentialKind::OAuth) | (Api::OpenAi, _) => {
                request.bearer_auth(credential)
            }
        };
        let ask_usage = asks_stream_usage(inbound, account);
        let body =
            if account.mapped_model != inbound.model || ask_usage || as_claude_code || chatgpt {
                // `inbound.json` is an object (checked when the request came in).
                let mut json = inbound.json.clone();
                json["model"] = Value::String(account.mapped_model.clone());
                if as_claude_code {
                    let mut system =
                        vec![serde_json::json!({"type": "text", "text": CLAUDE_CODE_IDENTITY})];
                    match json.get("system") {
                        Some(Value::String(text)) if !text.is_empty() => {
                            system.push(serde_json::json!({"type": "text", "text": text}));
                        }
                        Some(Value::Array(blocks)) => system.extend(blocks.iter().cloned()),
                        _ => {}
                    }
                    json["system"] = Value::Array(system);
                }
                if chatgpt {
                    // The backend keeps nothing and always streams (a non-streaming client's answer
                    // is folded from the stream).
                    json["store"] = Value::Bool(false);
                    json["stream"] = Value::Bool(true);
                }
                if ask_usage {
                    match json
                        .get_mut("stream_options")
                        .and_then(Value::as_object_mut)
                    {
                        Some(options) => {
                            options.insert("include_usage".into(), Value::Bool(true));
                        }
                        None => json["stream_options"] = serde_json::json!({"include_usage": true}),
                    }
                }
                Bytes::from(serde_json::to_vec(&json).unwrap_or_else(|_| inbound.body.to_vec()))
            } else {
                inbound.body.clone()
            };
        if !inbound.headers.contains_key(http::header::CONTENT_TYPE) {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        request.body(body)
    }
}

/// The headers a response keeps on its way to the client.
pub(super) fn response_headers(upstream: &HeaderMap) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in upstream {
        if !DROPPED_RESPONSE_HEADERS.contains(&name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    headers
}

/// Whether the request already opens with Claude Code's identity line (Claude Code's own
/// requests do; they go upstream untouched).
fn opens_with_claude_code_identity(json: &Value) -> bool {
    match json.get("system") {
        Some(Value::String(text)) => text.trim_start().starts_with(CLAUDE_CODE_IDENTITY),
        Some(Value::Array(blocks)) => blocks
            .first()
            .and_then(|block| block.get("text"))
            .and_then(Value::as_str)
            .is_some_and(|text| text.trim_start().starts_with(CLAUDE_CODE_IDENTITY)),
        _ => false,
    }
}

/// A Messages request of another client (an SDK, curl) on a Claude subscription (OAuth)
/// account: Anthropic serves such tokens only for Claude Code, so the request gets Claude Code's
/// identity line as its first system block and Claude Code's beta, as sub2api and
/// claude-relay-service do. `count_tokens` takes no system prompt and is left alone.
fn needs_claude_code_identity(inbound: &Inbound, account: &Planned) -> bool {
    inbound.api == Api::Anthropic
        && inbound.path == "/v1/messages"
        && account.credential_kind == CredentialKind::OAuth
        && !opens_with_claude_code_identity(&inbound.json)
}

/// An OpenAI chat stream whose client did not ask for usage, on an account that allows asking:
/// the relay asks the upstream for it (so streamed spend is recorded) and strips it from what
/// the client gets.
pub(super) fn asks_stream_usage(inbound: &Inbound, account: &Planned) -> bool {
    inbound.api == Api::OpenAi
        && inbound.path == "/v1/chat/completions"
        && inbound.stream
        && account.stream_usage
        && inbound
            .json
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            != Some(true)
}

/// `x-request-id` of every response.
pub fn request_id_header() -> (HeaderName, HeaderValue) {
    let id = format!("req_{:016x}{:08x}", fastrand::u64(..), fastrand::u32(..));
    (
        HeaderName::from_static("x-request-id"),
        HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("req_unknown")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_clis_send_goes_upstream_and_credentials_do_not() {
        for name in [
            "anthropic-version",
            "anthropic-dangerous-direct-browser-access",
            "x-stainless-os",
            "x-stainless-retry-count",
            "x-app",
            "x-claude-code-session-id",
            "originator",
            "session-id",
            "session_id",
            "thread-id",
            "x-client-request-id",
            "x-codex-turn-metadata",
            "x-codex-beta-features",
            "user-agent",
        ] {
            assert!(passes_upstream(name), "{name}");
        }
        for name in [
            "authorization",
            "x-api-key",
            "cookie",
            "host",
            "content-length",
            "accept-encoding",
            "connection",
            "anthropic-beta",
            "x-forwarded-for",
        ] {
            assert!(!passes_upstream(name), "{name}");
        }
    }

    #[test]
    fn anthropic_beta_goes_once_with_the_accounts_own() {
        let mut headers = HeaderMap::new();
        headers.append(
            "anthropic-beta",
            HeaderValue::from_static("claude-code-20250219, oauth-2025-04-20"),
        );
        headers.append(
            "anthropic-beta",
            HeaderValue::from_static("interleaved-thinking-2025-05-14"),
        );
        assert_eq!(
            merged_betas(&headers, &["oauth-2025-04-20"]).as_deref(),
            Some("claude-code-20250219,oauth-2025-04-20,interleaved-thinking-2025-05-14")
        );
        assert_eq!(
            merged_betas(&HeaderMap::new(), &["oauth-2025-04-20"]).as_deref(),
            Some("oauth-2025-04-20")
        );
        assert_eq!(merged_betas(&HeaderMap::new(), &[]), None);
    }
}
