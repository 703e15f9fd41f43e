//! The upstream request: the URL and the headers
//! the header rules give it (`headers.rs`), the credential, and the body as the client sent it
//! with only the documented changes (`body.rs`). The relay never presents one client as another
//! (docs/SUBSCRIPTIONS.md).

use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use poolgate_core::account::{CredentialKind, chatgpt_account_id};
use poolgate_core::upstream::{chatgpt_responses_url, upstream_url};

use super::body;
use super::{Inbound, Relay};
use crate::client_api::Api;
use crate::ports::PlannedAccount;

use super::headers::*;

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
    http1_only: bool,
) -> Result<reqwest::Client, HttpClientError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10).min(timeout))
        .read_timeout(timeout)
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true);
    if http1_only {
        builder = builder.http1_only();
    }
    if let Some(proxy) = proxy {
        builder = builder.proxy(reqwest::Proxy::all(proxy).map_err(|_| HttpClientError::BadProxy)?);
    }
    builder.build().map_err(HttpClientError::Build)
}

impl Relay {
    /// The request `account` gets for `inbound`.
    pub(super) fn upstream_request(
        &self,
        inbound: &Inbound,
        account: &PlannedAccount,
    ) -> reqwest::RequestBuilder {
        let client = self.http.for_proxy(account.proxy_url.as_deref());
        let chatgpt = account.credential_kind == CredentialKind::ChatGptOAuth;
        let upstream = Upstream::of(inbound.api, account.credential_kind);
        let query = inbound
            .query
            .as_deref()
            .and_then(|query| upstream_query(upstream, query));
        let url = match query {
            _ if chatgpt => chatgpt_responses_url(&account.base_url),
            Some(query) => format!("{}?{query}", upstream_url(&account.base_url, inbound.path)),
            None => upstream_url(&account.base_url, inbound.path),
        };
        let mut request = self.upstream_headers(client.post(url), inbound, account);
        if !inbound.headers.contains_key(http::header::CONTENT_TYPE) {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        request.body(body::upstream_body(inbound, account))
    }

    /// The upgrade that opens an upstream socket for a socket turn (`upstream_socket.rs`): the
    /// Responses endpoint `upstream_request` would post to, asked for a WebSocket, with the same
    /// headers and credential, and the client's own socket flag (`beta`) when it sent one.
    pub(super) fn socket_handshake(
        &self,
        inbound: &Inbound,
        account: &PlannedAccount,
        beta: Option<&HeaderValue>,
        key: &str,
    ) -> reqwest::RequestBuilder {
        let client = self.http.for_socket(account.proxy_url.as_deref());
        let url = match account.credential_kind {
            CredentialKind::ChatGptOAuth => chatgpt_responses_url(&account.base_url),
            _ => upstream_url(&account.base_url, inbound.path),
        };
        let mut request = self
            .upstream_headers(client.get(url), inbound, account)
            .header(http::header::CONNECTION, "Upgrade")
            .header(http::header::UPGRADE, "websocket")
            .header(http::header::SEC_WEBSOCKET_VERSION, "13")
            .header(http::header::SEC_WEBSOCKET_KEY, key);
        if let Some(beta) = beta {
            request = request.header("openai-beta", beta.clone());
        }
        request
    }

    /// The headers of either: the client's the rules pass, what the account's upstream needs,
    /// and the credential.
    fn upstream_headers(
        &self,
        mut request: reqwest::RequestBuilder,
        inbound: &Inbound,
        account: &PlannedAccount,
    ) -> reqwest::RequestBuilder {
        let chatgpt = account.credential_kind == CredentialKind::ChatGptOAuth;
        let upstream = Upstream::of(inbound.api, account.credential_kind);
        let listed = connection_listed(&inbound.headers);
        for (name, value) in &inbound.headers {
            if forwarded(upstream, &listed, name.as_str()) {
                request = request.header(name, value);
            }
        }
        if chatgpt {
            // What Codex sends the ChatGPT backend with a subscription sign-in and a client
            // of the relay cannot (docs/SUBSCRIPTIONS.md): the account, from the token's auth
            // claim; and, when the client named no session, the relay's session hash as one.
            // Who is calling (`originator`, the user agent) is the client's to say: the relay
            // never names another client.
            if let Some(id) = chatgpt_account_id(account.credential.expose()) {
                request = request.header("chatgpt-account-id", id);
            }
            let named_session = ["session-id", "session_id"].iter().any(|name| {
                inbound.headers.contains_key(*name) && forwarded(upstream, &listed, name)
            });
            let relay_session = inbound
                .session_hash
                .as_deref()
                .and_then(|s| HeaderValue::from_str(s).ok());
            if let (false, Some(session)) = (named_session, relay_session) {
                request = request.header("session-id", session);
            }
        }
        request = request.header(http::header::ACCEPT_ENCODING, "identity");
        let credential = account.credential.expose();
        // `anthropic-beta` goes upstream once: the client's list, plus the account's own (an
        // OAuth account's `oauth-2025-04-20`, when the client did not send it).
        let own_betas: &[&str] = match (inbound.api, account.credential_kind) {
            (Api::Anthropic, CredentialKind::OAuth) => &["oauth-2025-04-20"],
            _ => &[],
        };
        // The client's betas go to Anthropic only, and not when its `Connection` names them.
        let no_betas = HeaderMap::new();
        let client_betas =
            if upstream == Upstream::Anthropic && !listed.iter().any(|l| l == "anthropic-beta") {
                &inbound.headers
            } else {
                &no_betas
            };
        if let Some(betas) = merged_betas(client_betas, own_betas) {
            request = request.header("anthropic-beta", betas);
        }
        request = match (inbound.api, account.credential_kind) {
            (Api::Anthropic, CredentialKind::ApiKey | CredentialKind::ChatGptOAuth) => {
                request.header("x-api-key", credential)
            }
            (Api::Anthropic, CredentialKind::OAuth) | (Api::OpenAi | Api::Cohere, _) => {
                request.bearer_auth(credential)
            }
        };
        request
    }
}
