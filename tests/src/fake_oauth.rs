//! Fake authorization servers of Anthropic (Claude Code's sign-in) and OpenAI (the Codex CLI's),
//! on one loopback port, following the real endpoints' paths, parameters and answers as the
//! pinned CLIs use them (docs/SUBSCRIPTIONS.md, "Signing accounts in", cites each rule):
//!
//! - Anthropic: `GET /cai/oauth/authorize` (the browser; signs in the next user and redirects to
//!   the redirect URI with `code` and `state`), `POST /v1/oauth/token` (JSON: the
//!   authorization-code exchange with the PKCE verifier, and refreshes), `GET
//!   /api/oauth/profile` (needs `user:profile`);
//! - OpenAI: `GET /oauth/authorize`, `POST /oauth/token` (form-encoded code exchange; JSON
//!   refresh), `POST /api/accounts/deviceauth/usercode` and `POST
//!   /api/accounts/deviceauth/token` (the device-code flow: 403 until approved).
//!
//! Codes are single-use and expire after [`CODE_TTL`]; a verifier that does not hash to the
//! challenge, another client id or redirect URI is `invalid_grant`, as the servers answer. The
//! test plays the user: [`FakeOAuth::sign_in_as`] sets who signs in next, [`FakeOAuth::approve`]
//! approves a device code.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Claude Code's and the Codex CLI's public client ids.
pub const CLAUDE_CLIENT_ID: &str = "9d1c250a-e61b-44d9-88ed-5944d1962f5e";
pub const CODEX_CLIENT_ID: &str = "app_EMoamEEZ73f0CkXaXp7hrann";
pub const CLAUDE_REDIRECT_URI: &str = "https://platform.claude.com/oauth/code/callback";
pub const CODEX_REDIRECT_URI: &str = "http://localhost:1455/auth/callback";
pub const CODEX_DEVICE_REDIRECT_URI: &str = "https://auth.openai.com/deviceauth/callback";
/// How long an authorization code is good for.
pub const CODE_TTL: Duration = Duration::from_secs(600);

/// Who signs in at the authorize page.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeUser {
    pub user_id: String,
    pub organisation_id: String,
    pub email: String,
    /// Anthropic: `claude_max`, `claude_pro`; OpenAI: `plus`, `pro`, `team`.
    pub plan: String,
}

impl FakeUser {
    pub fn new(user_id: &str, organisation_id: &str, email: &str, plan: &str) -> Self {
        FakeUser {
            user_id: user_id.into(),
            organisation_id: organisation_id.into(),
            email: email.into(),
            plan: plan.into(),
        }
    }
}

struct Grant {
    user: FakeUser,
    client_id: String,
    redirect_uri: String,
    challenge: String,
    state: String,
    scope: String,
    issued: Instant,
}

struct Device {
    user_code: String,
    approved: Option<FakeUser>,
}

/// An access token the fake issued, and what it may do.
#[derive(Debug, Clone)]
pub struct Issued {
    pub user: FakeUser,
    pub scope: String,
    pub refreshable: bool,
}

#[derive(Default)]
struct OAuthState {
    next_user: Option<FakeUser>,
    grants: HashMap<String, Grant>,
    devices: HashMap<String, Device>,
    /// Access token -> what it is.
    issued: HashMap<String, Issued>,
    refresh_tokens: HashMap<String, FakeUser>,
    counter: u64,
    /// Every token request's grant type, oldest first.
    exchanges: Vec<String>,
}

impl OAuthState {
    fn next(&mut self, prefix: &str) -> String {
        self.counter += 1;
        format!("{prefix}{}{:08x}", self.counter, fastrand::u32(..))
    }
}

/// The fake authorization servers; dropping it stops them.
pub struct FakeOAuth {
    base: String,
    state: Arc<Mutex<OAuthState>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeOAuth {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Shared = Arc<Mutex<OAuthState>>;

fn lock(state: &Shared) -> std::sync::MutexGuard<'_, OAuthState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

fn oauth_error(status: StatusCode, error: &str) -> Response {
    (
        status,
        Json(json!({"error": error, "error_description": error})),
    )
        .into_response()
}

fn s256(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

fn jwt(claims: Value) -> String {
    format!(
        "{}.{}.fake-signature",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    )
}

impl FakeOAuth {
    /// Starts the servers on a free loopback port.
    pub async fn start() -> Result<Self, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind: {e}"))?;
        let address = listener.local_addr().map_err(|e| e.to_string())?;
        let state: Shared = Arc::default();
        let router = Router::new()
            .route("/cai/oauth/authorize", get(claude_authorize))
            .route("/v1/oauth/token", post(claude_token))
            .route("/api/oauth/profile", get(claude_profile))
            .route("/oauth/authorize", get(openai_authorize))
            .route("/oauth/token", post(openai_token))
            .route("/api/accounts/deviceauth/usercode", post(device_code))
            .route("/api/accounts/deviceauth/token", post(device_token))
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(FakeOAuth {
            base: format!("http://{address}"),
            state,
            task,
        })
    }

    /// `http://127.0.0.1:<port>`: what `--oauth-base` takes.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The user the next authorize page (or device approval) signs in.
    pub fn sign_in_as(&self, user: FakeUser) {
        lock(&self.state).next_user = Some(user);
    }

    /// Approves the device code `user_code` as `user` (what the user does on the page).
    pub fn approve(&self, user_code: &str, user: FakeUser) -> bool {
        let mut state = lock(&self.state);
        match state
            .devices
            .values_mut()
            .find(|device| device.user_code == user_code)
        {
            Some(device) => {
                device.approved = Some(user);
                true
            }
            None => false,
        }
    }

    /// The access tokens issued so far, and what each is.
    pub fn issued(&self) -> HashMap<String, Issued> {
        lock(&self.state).issued.clone()
    }

    /// Every token request's grant type, oldest first.
    pub fn exchanges(&self) -> Vec<String> {
        lock(&self.state).exchanges.clone()
    }

    /// The user codes handed out by the device flow, newest last.
    pub fn device_codes(&self) -> Vec<String> {
        lock(&self.state)
            .devices
            .values()
            .map(|device| device.user_code.clone())
            .collect()
    }
}

/// The authorize page: checks what the CLI sent, signs the next user in, redirects to the
/// redirect URI with the code and the state (Anthropic's callback page then shows
/// `code#state`).
fn authorize(
    state: &Shared,
    query: &HashMap<String, String>,
    client_id: &str,
    redirect_uris: &[&str],
) -> Response {
    let field = |name: &str| query.get(name).map(String::as_str).unwrap_or_default();
    if field("client_id") != client_id {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_client");
    }
    if !redirect_uris.contains(&field("redirect_uri")) {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_request");
    }
    if field("response_type") != "code"
        || field("code_challenge_method") != "S256"
        || field("code_challenge").len() < 43
        || field("state").is_empty()
        || field("scope").is_empty()
    {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_request");
    }
    let mut state = lock(state);
    let Some(user) = state.next_user.clone() else {
        return oauth_error(StatusCode::FORBIDDEN, "access_denied");
    };
    let code = state.next("code-");
    state.grants.insert(
        code.clone(),
        Grant {
            user,
            client_id: client_id.to_owned(),
            redirect_uri: field("redirect_uri").to_owned(),
            challenge: field("code_challenge").to_owned(),
            state: field("state").to_owned(),
            scope: field("scope").to_owned(),
            issued: Instant::now(),
        },
    );
    let mut location = reqwest_free_url(field("redirect_uri"));
    location.push_str(&format!("?code={code}&state={}", field("state")));
    (StatusCode::FOUND, [(header::LOCATION, location)]).into_response()
}

fn reqwest_free_url(url: &str) -> String {
    url.split('?').next().unwrap_or(url).to_owned()
}

/// Takes a code for an exchange: once, in time, from the client and redirect it was issued to,
/// with the verifier of its challenge; `None` is `invalid_grant`.
fn take_grant(
    state: &mut OAuthState,
    code: &str,
    client_id: &str,
    redirect_uri: &str,
    verifier: &str,
) -> Option<Grant> {
    let grant = state.grants.remove(code)?;
    let good = grant.issued.elapsed() <= CODE_TTL
        && grant.client_id == client_id
        && grant.redirect_uri == redirect_uri
        && s256(verifier) == grant.challenge;
    good.then_some(grant)
}

async fn claude_authorize(
    State(state): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    authorize(&state, &query, CLAUDE_CLIENT_ID, &[CLAUDE_REDIRECT_URI])
}

async fn claude_token(State(state): State<Shared>, Json(request): Json<Value>) -> Response {
    let field = |name: &str| {
        request
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let mut state = lock(&state);
    state.exchanges.push(field("grant_type").to_owned());
    match field("grant_type") {
        "authorization_code" => {
            let grant = match take_grant(
                &mut state,
                field("code"),
                field("client_id"),
                field("redirect_uri"),
                field("code_verifier"),
            ) {
                Some(grant) => grant,
                None => return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant"),
            };
            if field("state") != grant.state {
                return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant");
            }
            // `claude setup-token`: the one scope and a long life, no refresh token.
            let long_lived = request.get("expires_in").and_then(Value::as_u64);
            let inference_only = grant.scope == "user:inference";
            let access = state.next("sk-ant-oat01-fake-");
            let refreshable = !inference_only;
            state.issued.insert(
                access.clone(),
                Issued {
                    user: grant.user.clone(),
                    scope: grant.scope.clone(),
                    refreshable,
                },
            );
            let mut answer = json!({
                "token_type": "Bearer",
                "access_token": access,
                "expires_in": if inference_only { long_lived.unwrap_or(28_800) } else { 28_800 },
                "scope": grant.scope,
                "account": {"uuid": grant.user.user_id, "email_address": grant.user.email},
                "organization": {"uuid": grant.user.organisation_id, "name": "Org"},
            });
            if refreshable {
                let refresh = state.next("sk-ant-ort01-fake-");
                state.refresh_tokens.insert(refresh.clone(), grant.user);
                answer["refresh_token"] = refresh.into();
            }
            Json(answer).into_response()
        }
        "refresh_token" => refresh(&mut state, field("refresh_token"), "sk-ant-oat01-fake-"),
        _ => oauth_error(StatusCode::BAD_REQUEST, "unsupported_grant_type"),
    }
}

fn refresh(state: &mut OAuthState, token: &str, prefix: &str) -> Response {
    let Some(user) = state.refresh_tokens.remove(token) else {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant");
    };
    let access = state.next(prefix);
    let next = state.next("refresh-");
    state.issued.insert(
        access.clone(),
        Issued {
            user: user.clone(),
            scope: String::new(),
            refreshable: true,
        },
    );
    state.refresh_tokens.insert(next.clone(), user);
    Json(json!({"access_token": access, "refresh_token": next, "expires_in": 3600})).into_response()
}

async fn claude_profile(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let state = lock(&state);
    let Some(issued) = state.issued.get(token) else {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"type": "error", "error": {"type": "authentication_error", "message": "Invalid bearer token"}})),
        )
            .into_response();
    };
    if !issued.scope.split(' ').any(|s| s == "user:profile") {
        return (
            StatusCode::FORBIDDEN,
            Json(json!({"type": "error", "error": {"type": "permission_error", "message": "OAuth token does not meet scope requirement user:profile"}})),
        )
            .into_response();
    }
    let user = &issued.user;
    Json(json!({
        "account": {"uuid": user.user_id, "email": user.email, "has_claude_max": user.plan == "claude_max", "has_claude_pro": user.plan == "claude_pro"},
        "organization": {"uuid": user.organisation_id, "organization_type": user.plan, "rate_limit_tier": "default_claude_max_20x"},
    }))
    .into_response()
}

async fn openai_authorize(
    State(state): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    authorize(&state, &query, CODEX_CLIENT_ID, &[CODEX_REDIRECT_URI])
}

fn openai_tokens(state: &mut OAuthState, user: FakeUser) -> Response {
    let auth = json!({
        "chatgpt_account_id": user.organisation_id,
        "chatgpt_user_id": user.user_id,
        "user_id": user.user_id,
        "chatgpt_plan_type": user.plan,
    });
    let exp = jiff::Timestamp::now().as_second() + 864_000;
    let id_token =
        jwt(json!({"email": user.email, "https://api.openai.com/auth": auth, "exp": exp}));
    let access = jwt(json!({
        "https://api.openai.com/auth": {"chatgpt_account_id": user.organisation_id},
        "exp": exp,
        "jti": state.next("jti-"),
    }));
    let refresh = state.next("rt_fake_");
    state.issued.insert(
        access.clone(),
        Issued {
            user: user.clone(),
            scope: "openid profile email offline_access api.connectors.read api.connectors.invoke"
                .into(),
            refreshable: true,
        },
    );
    state.refresh_tokens.insert(refresh.clone(), user);
    Json(json!({"id_token": id_token, "access_token": access, "refresh_token": refresh, "expires_in": 864_000}))
        .into_response()
}

/// The code exchange is form-encoded (as Codex sends it); a refresh is JSON.
async fn openai_token(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let fields: HashMap<String, String> = if json {
        match serde_json::from_slice::<HashMap<String, Value>>(&body) {
            Ok(map) => map
                .into_iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_owned())))
                .collect(),
            Err(_) => return oauth_error(StatusCode::BAD_REQUEST, "invalid_request"),
        }
    } else {
        match form_fields(&body) {
            Some(map) => map,
            None => return oauth_error(StatusCode::BAD_REQUEST, "invalid_request"),
        }
    };
    let field = |name: &str| fields.get(name).map(String::as_str).unwrap_or_default();
    let mut state = lock(&state);
    state.exchanges.push(field("grant_type").to_owned());
    match (field("grant_type"), json) {
        ("authorization_code", false) => {
            let redirect = field("redirect_uri");
            if redirect == CODEX_DEVICE_REDIRECT_URI {
                // A device flow's code: its verifier came from the server itself.
            } else if redirect != CODEX_REDIRECT_URI {
                return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant");
            }
            match take_grant(
                &mut state,
                field("code"),
                field("client_id"),
                redirect,
                field("code_verifier"),
            ) {
                Some(grant) => openai_tokens(&mut state, grant.user),
                None => oauth_error(StatusCode::BAD_REQUEST, "invalid_grant"),
            }
        }
        ("refresh_token", _) => {
            if field("client_id") != CODEX_CLIENT_ID {
                return oauth_error(StatusCode::BAD_REQUEST, "invalid_client");
            }
            refresh(&mut state, field("refresh_token"), "fake-chatgpt-access-")
        }
        _ => oauth_error(StatusCode::BAD_REQUEST, "unsupported_grant_type"),
    }
}

/// An `application/x-www-form-urlencoded` body's fields; `None` when it is not one.
fn form_fields(body: &[u8]) -> Option<HashMap<String, String>> {
    let text = std::str::from_utf8(body).ok()?;
    let decode = |part: &str| -> Option<String> {
        let bytes = part.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' => {
                    let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                    out.push(u8::from_str_radix(hex, 16).ok()?);
                    i += 2;
                }
                byte => out.push(byte),
            }
            i += 1;
        }
        String::from_utf8(out).ok()
    };
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            Some((decode(key)?, decode(value)?))
        })
        .collect()
}

async fn device_code(State(state): State<Shared>, Json(request): Json<Value>) -> Response {
    if request.get("client_id").and_then(Value::as_str) != Some(CODEX_CLIENT_ID) {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_client");
    }
    let mut state = lock(&state);
    let id = state.next("deviceauth-");
    let user_code = format!("{:04X}-{:04X}", fastrand::u16(..), fastrand::u16(..));
    state.devices.insert(
        id.clone(),
        Device {
            user_code: user_code.clone(),
            approved: None,
        },
    );
    Json(json!({"device_auth_id": id, "user_code": user_code, "interval": "1"})).into_response()
}

/// 403 until the code is approved; then the authorization code with the PKCE pair the server
/// made, to exchange at `/oauth/token` with the device redirect.
async fn device_token(State(state): State<Shared>, Json(request): Json<Value>) -> Response {
    let field = |name: &str| {
        request
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let mut state = lock(&state);
    let approved = match state.devices.get(field("device_auth_id")) {
        Some(device) if device.user_code == field("user_code") => device.approved.clone(),
        _ => return oauth_error(StatusCode::NOT_FOUND, "device_auth_not_found"),
    };
    let Some(user) = approved else {
        return oauth_error(StatusCode::FORBIDDEN, "authorization_pending");
    };
    state.devices.remove(field("device_auth_id"));
    let verifier = URL_SAFE_NO_PAD.encode(fastrand::u64(..).to_le_bytes().repeat(4));
    let code = state.next("device-code-");
    state.grants.insert(
        code.clone(),
        Grant {
            user,
            client_id: CODEX_CLIENT_ID.into(),
            redirect_uri: CODEX_DEVICE_REDIRECT_URI.into(),
            challenge: s256(&verifier),
            state: String::new(),
            scope: "openid profile email offline_access api.connectors.read api.connectors.invoke"
                .into(),
            issued: Instant::now(),
        },
    );
    Json(json!({"authorization_code": code, "code_challenge": s256(&verifier), "code_verifier": verifier}))
        .into_response()
}
