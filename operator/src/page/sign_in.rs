//! The status page's sign-in ("Add account", and "Sign in again" on an account in `error`): the
//! page's first writes. The same flows as the CLI's `login` (`crate::signin`), run by the
//! process serving the page: `POST /api/sign-in/start` makes the PKCE pair and the state and
//! answers the URL to open (the verifier stays here); `POST /api/sign-in/finish` takes what the
//! operator pasted, checks the state, exchanges the code and puts the account into the pool
//! through the page's [`crate::AdminEndpoint`].
//!
//! Both need the operator's session, and both refuse a cross-site request: the body must be
//! JSON (a form of another site cannot send it without a CORS preflight, which is never
//! answered), an `Origin` header must name this page's own host, a `Sec-Fetch-Site` header must
//! say `same-origin`; the session cookie is `SameSite=Strict` besides. A started sign-in is kept
//! by this process for [`PENDING_TTL`] (at most [`MAX_PENDING`] at once, the oldest dropped),
//! used once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, header};
use serde::{Deserialize, Serialize};

use super::{Page, endpoint_error, json_error, unauthenticated};
use crate::signin::{Pkce, SignInError, chatgpt, claude, http_client};

/// How long a started sign-in waits for its paste.
pub const PENDING_TTL: Duration = Duration::from_secs(600);
/// Started sign-ins kept at once.
pub const MAX_PENDING: usize = 32;

/// Sign-ins started on the page, by their id.
#[derive(Clone, Default)]
pub struct PendingSignIns {
    pending: Arc<Mutex<HashMap<String, Pending>>>,
    /// The authorization servers' base (`POOLGATE_OAUTH_BASE`, for tests), as the CLI's.
    oauth_base: Option<String>,
}

impl PendingSignIns {
    pub fn new(oauth_base: Option<String>) -> Self {
        PendingSignIns {
            pending: Arc::default(),
            oauth_base,
        }
    }
}

struct Pending {
    subscription: Subscription,
    pkce: Pkce,
    account_id: Option<i64>,
    name: Option<String>,
    group: Option<String>,
    started: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Subscription {
    /// Claude Code's sign-in.
    Claude,
    /// Claude Code's `setup-token`: a year, inference only, no refresh token.
    ClaudeSetupToken,
    /// The Codex CLI's sign-in.
    Chatgpt,
}

#[derive(Deserialize)]
pub(super) struct Start {
    subscription: Subscription,
    #[serde(default)]
    account_id: Option<i64>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    group: Option<String>,
}

#[derive(Serialize)]
struct Started {
    id: String,
    url: String,
    /// What the operator pastes back: `code` (Claude's page shows `code#state`) or `address`
    /// (the address ChatGPT's sign-in sent the browser to).
    paste: &'static str,
}

#[derive(Deserialize)]
pub(super) struct Finish {
    id: String,
    pasted: String,
}

/// A request the page's own script made: JSON, from this page's origin.
fn same_origin(headers: &HeaderMap, uri: &http::Uri) -> bool {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    // HTTP/1.1 names the host in `Host`; HTTP/2 in the request's authority.
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()));
    let origin_ok = match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(origin) => {
            let authority = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            authority.is_some() && authority == host
        }
    };
    let fetch_ok = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_none_or(|site| site == "same-origin");
    json && origin_ok && fetch_ok
}

fn cross_site() -> Response {
    json_error(
        StatusCode::FORBIDDEN,
        "permission_error",
        "a sign-in is started and finished by the status page itself",
    )
}

fn sign_in_error(error: &SignInError) -> Response {
    let status = match error {
        SignInError::Unreachable { .. } => StatusCode::BAD_GATEWAY,
        _ => StatusCode::BAD_REQUEST,
    };
    json_error(status, "invalid_request", format!("sign-in: {error}"))
}

fn random_id() -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(poolgate_select::crypto::Keyring::random_bytes::<16>())
}

/// Why `start` cannot end in an account: a name or group the store refuses, an account that is
/// not there or not of this subscription's kind.
async fn start_problem(page: &Page, start: &Start) -> Option<String> {
    for (field, value) in [("name", &start.name), ("group", &start.group)] {
        if let Some(value) = value.as_deref().filter(|v| !v.trim().is_empty())
            && (value.len() > 128 || value.chars().any(char::is_control))
        {
            return Some(format!(
                "invalid {field}: must be 1..=128 bytes, no control characters"
            ));
        }
    }
    let id = start.account_id?;
    if id <= 0 {
        return Some("invalid account_id: must be positive".into());
    }
    let kind = match start.subscription {
        Subscription::Chatgpt => "chatgpt_oauth",
        Subscription::Claude | Subscription::ClaudeSetupToken => "oauth",
    };
    match page.endpoint.accounts(None).await {
        Ok(accounts) => match accounts.iter().find(|a| a.id == id) {
            None => Some(format!("no account {id}")),
            Some(account) if account.credential_kind != kind => Some(format!(
                "account {id} is an {} {} account: this sign-in makes {kind} accounts",
                account.platform, account.credential_kind
            )),
            Some(_) => None,
        },
        // The finish says it if it still holds.
        Err(_) => None,
    }
}

/// A page write's body, once the request is the signed-in page's own (session, same origin);
/// otherwise the answer refusing it (401, 403, or 400 with `expected`).
fn page_write<T: serde::de::DeserializeOwned>(
    page: &Page,
    uri: &http::Uri,
    headers: &HeaderMap,
    body: &[u8],
    expected: &str,
) -> Result<T, Box<Response>> {
    if !page.signed_in(headers) {
        return Err(Box::new(unauthenticated()));
    }
    if !same_origin(headers, uri) {
        return Err(Box::new(cross_site()));
    }
    serde_json::from_slice(body).map_err(|_| {
        Box::new(json_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            expected,
        ))
    })
}

pub(super) async fn start(
    State(page): State<Page>,
    uri: http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let start: Start = match page_write(
        &page,
        &uri,
        &headers,
        &body,
        "expected {\"subscription\": \"claude\" | \"claude_setup_token\" | \"chatgpt\", …}",
    ) {
        Ok(start) => start,
        Err(refused) => return *refused,
    };
    // What can be refused before the code is spent is refused now.
    if let Some(problem) = start_problem(&page, &start).await {
        return json_error(StatusCode::BAD_REQUEST, "invalid_request", problem);
    }
    let pkce = Pkce::new();
    let base = page.sign_ins.oauth_base.as_deref();
    let (url, paste) = match start.subscription {
        Subscription::Claude => (claude::authorize_url(&pkce, claude::SCOPES, base), "code"),
        Subscription::ClaudeSetupToken => (
            claude::authorize_url(&pkce, claude::SETUP_TOKEN_SCOPES, base),
            "code",
        ),
        Subscription::Chatgpt => (chatgpt::authorize_url(&pkce, base), "address"),
    };
    let url = match url {
        Ok(url) => url,
        Err(error) => return sign_in_error(&error),
    };
    let id = random_id();
    {
        let mut pending = page
            .sign_ins
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        pending.retain(|_, p| p.started.elapsed() < PENDING_TTL);
        while pending.len() >= MAX_PENDING {
            let oldest = pending
                .iter()
                .min_by_key(|(_, p)| p.started)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(oldest) => pending.remove(&oldest),
                None => break,
            };
        }
        pending.insert(
            id.clone(),
            Pending {
                subscription: start.subscription,
                pkce,
                account_id: start.account_id,
                name: start.name.filter(|n| !n.trim().is_empty()),
                group: start.group.filter(|g| !g.trim().is_empty()),
                started: Instant::now(),
            },
        );
    }
    axum::Json(Started { id, url, paste }).into_response()
}

pub(super) async fn finish(
    State(page): State<Page>,
    uri: http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let finish: Finish = match page_write(
        &page,
        &uri,
        &headers,
        &body,
        "expected {\"id\", \"pasted\"}",
    ) {
        Ok(finish) => finish,
        Err(refused) => return *refused,
    };
    // Taken once: a second finish of the same sign-in is unknown.
    let pending = page
        .sign_ins
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&finish.id)
        .filter(|p| p.started.elapsed() < PENDING_TTL);
    let Some(pending) = pending else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "sign-in: no such sign-in in progress (finished, expired, or started elsewhere); start again",
        );
    };
    let http = match http_client() {
        Ok(http) => http,
        Err(error) => return sign_in_error(&error),
    };
    let base = page.sign_ins.oauth_base.as_deref();
    let exchanged = match pending.subscription {
        Subscription::Claude | Subscription::ClaudeSetupToken => {
            let setup_token = pending.subscription == Subscription::ClaudeSetupToken;
            match claude::read_paste(&finish.pasted, &pending.pkce.state) {
                Ok(code) => claude::exchange(&http, base, &code, &pending.pkce, setup_token).await,
                Err(error) => Err(error),
            }
        }
        Subscription::Chatgpt => {
            match chatgpt::read_redirect(&finish.pasted, &pending.pkce.state) {
                Ok(code) => {
                    chatgpt::exchange(
                        &http,
                        base,
                        &code,
                        &pending.pkce.verifier,
                        chatgpt::REDIRECT_URI,
                    )
                    .await
                }
                Err(error) => Err(error),
            }
        }
    };
    let mut sign_in = match exchanged {
        Ok(sign_in) => sign_in,
        Err(error) => return sign_in_error(&error),
    };
    sign_in.account_id = pending.account_id;
    sign_in.name = pending.name;
    sign_in.group = pending.group;
    match page.endpoint.sign_in(&sign_in).await {
        Ok(row) => axum::Json(row).into_response(),
        Err(error) => endpoint_error(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(
                http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
                value.parse().expect("value"),
            );
        }
        headers
    }

    fn same_origin_(headers: &HeaderMap) -> bool {
        same_origin(headers, &http::Uri::from_static("/api/sign-in/start"))
    }

    #[test]
    fn only_the_pages_own_json_requests_are_same_origin() {
        let json = ("content-type", "application/json");
        let host = ("host", "127.0.0.1:9464");
        assert!(same_origin_(&headers(&[json, host])));
        assert!(same_origin_(&headers(&[
            json,
            host,
            ("origin", "http://127.0.0.1:9464"),
            ("sec-fetch-site", "same-origin")
        ])));
        assert!(!same_origin_(&headers(&[
            ("content-type", "application/x-www-form-urlencoded"),
            host
        ])));
        assert!(!same_origin_(&headers(&[
            json,
            host,
            ("origin", "https://evil.example")
        ])));
        assert!(!same_origin_(&headers(&[json, host, ("origin", "null")])));
        assert!(!same_origin_(&headers(&[
            json,
            host,
            ("sec-fetch-site", "cross-site")
        ])));
    }
}
