//! The status page: the pool at a glance in a browser, read-only, from the same admin API the
//! operator CLI uses (an [`AdminEndpoint`]: in process on the selector's `--admin-http-listen`
//! and on the standalone relay's `--admin-listen`). A server-rendered HTML shell with a little
//! plain JavaScript (`app.js`) that reads `GET /api/status` and `GET /api/keys` every 2 s and
//! updates the tables in place; no frontend build.
//!
//! Without a session `/` is the login form and nothing else; `/api/*` answer 401. `POST /login`
//! takes the admin token (constant-time comparison; a wrong one waits out
//! `poolgate_runtime::failed_auth`'s fixed delay) and sets the session cookie ([`session`]). Every
//! answer carries a Content-Security-Policy without inline script or framing, `nosniff`,
//! `no-store` and `no-referrer`. No credential is shown beyond its last four characters (a client
//! key's leading characters are dropped too).

pub mod serve;
pub mod session;
pub mod sign_in;

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::FormRejection;
use axum::extract::{DefaultBodyLimit, Form, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use poolgate_runtime::failed_auth::FailedAttempts;
use serde::{Deserialize, Serialize};

use crate::view::{ErrorBody, KeyRow, StatusAnswer, UsageReport};
use crate::{AdminEndpoint, OperatorError};

pub use serve::{serve, tls_config};
pub use session::Sessions;

const INDEX_HTML: &str = include_str!("index.html");
const LOGIN_HTML: &str = include_str!("login.html");
const APP_JS: &str = include_str!("app.js");
const STYLE_CSS: &str = include_str!("style.css");

/// Where the login page says a token was refused (a fixed text, nothing from the request).
const REFUSED_MARK: &str = "<!-- refused -->";
const REFUSED_TEXT: &str = r#"<p class="refused" role="alert">That token was refused.</p>"#;

/// The page's policy: its own script, style and API only; never framed; forms post only here.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'; object-src 'none'";

/// The per-key view covers the last 24 hours.
const KEYS_WINDOW_MS: i64 = 24 * 3600 * 1000;

/// A login form is the token and nothing else.
const MAX_BODY_BYTES: usize = 4096;

/// How the page is served: the session cookie is `Secure` over TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

#[derive(Clone)]
struct Page {
    endpoint: Arc<dyn AdminEndpoint>,
    token: Arc<str>,
    sessions: Sessions,
    failed: FailedAttempts,
    sign_ins: sign_in::PendingSignIns,
}

/// `/api/keys`: every client key with its usage against its budgets per period, and each key's
/// usage over the last 24 h.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeysAnswer {
    pub keys: Vec<KeyRow>,
    pub usage: UsageReport,
}

#[derive(Deserialize)]
struct Login {
    token: String,
}

/// The page's routes over `endpoint`, behind `admin_token`. The caller keeps the page off when
/// there is no admin token; an empty one refuses every login. No fallback of its own: merged
/// into the standalone relay's admin router, every other path stays that router's (behind the
/// admin token).
pub fn router(endpoint: Arc<dyn AdminEndpoint>, admin_token: &str, scheme: Scheme) -> Router {
    let page = Page {
        endpoint,
        token: Arc::from(admin_token),
        sessions: Sessions::new(admin_token, scheme == Scheme::Https),
        failed: FailedAttempts::default(),
        // The authorization servers are the real ones unless a test points them elsewhere (the
        // CLI's `--oauth-base` reads the same variable).
        sign_ins: sign_in::PendingSignIns::new(
            std::env::var("POOLGATE_OAUTH_BASE")
                .ok()
                .filter(|base| !base.is_empty()),
        ),
    };
    Router::new()
        .route("/", get(index))
        .route("/login", post(login))
        .route("/logout", post(logout))
        .route("/app.js", get(app_js))
        .route("/style.css", get(style_css))
        .route("/api/status", get(status))
        .route("/api/keys", get(keys))
        .route("/api/sign-in/start", post(sign_in::start))
        .route("/api/sign-in/finish", post(sign_in::finish))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(page)
}

/// The headers every answer carries, whatever made it.
async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

fn json_error(status: StatusCode, kind: &str, message: impl std::fmt::Display) -> Response {
    (status, axum::Json(ErrorBody::new(kind, message))).into_response()
}

fn login_form(refused: bool) -> String {
    LOGIN_HTML.replace(REFUSED_MARK, if refused { REFUSED_TEXT } else { "" })
}

impl Page {
    fn signed_in(&self, headers: &HeaderMap) -> bool {
        self.sessions.in_headers(headers, poolgate_core::now_ms())
    }
}

async fn index(State(page): State<Page>, headers: HeaderMap) -> Response {
    if page.signed_in(&headers) {
        html(StatusCode::OK, INDEX_HTML.to_owned())
    } else {
        html(StatusCode::OK, login_form(false))
    }
}

async fn login(State(page): State<Page>, form: Result<Form<Login>, FormRejection>) -> Response {
    let given = form.map(|Form(login)| login.token).unwrap_or_default();
    let right = !given.is_empty()
        && !page.token.is_empty()
        && poolgate_rpc::service_auth::constant_time_eq(given.as_bytes(), page.token.as_bytes());
    if !right {
        page.failed.refused().await;
        return html(StatusCode::UNAUTHORIZED, login_form(true));
    }
    let cookie = page.sessions.set_cookie(poolgate_core::now_ms());
    see_other(&cookie)
}

async fn logout(State(page): State<Page>) -> Response {
    see_other(&page.sessions.clear_cookie())
}

/// Back to `/` with `cookie` set.
fn see_other(cookie: &str) -> Response {
    match HeaderValue::from_str(cookie) {
        Ok(cookie) => (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, HeaderValue::from_static("/")),
                (header::SET_COOKIE, cookie),
            ],
        )
            .into_response(),
        // The cookie is ASCII this module built: unreachable, and no session if it were not.
        Err(_) => json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "cannot set the session cookie",
        ),
    }
}

async fn app_js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        APP_JS,
    )
        .into_response()
}

async fn style_css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        STYLE_CSS,
    )
        .into_response()
}

fn unauthenticated() -> Response {
    json_error(
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        "no valid session: log in at /",
    )
}

/// An endpoint's failure as the page's JSON: the message names the transport's code, never a
/// credential.
fn endpoint_error(error: OperatorError) -> Response {
    let (status, kind) = crate::http::routes::error_status(&error);
    json_error(status, kind, error)
}

async fn status(State(page): State<Page>, headers: HeaderMap) -> Response {
    if !page.signed_in(&headers) {
        return unauthenticated();
    }
    match page.endpoint.status().await {
        Ok(status) => axum::Json(StatusAnswer { status }).into_response(),
        Err(error) => endpoint_error(error),
    }
}

async fn keys(State(page): State<Page>, headers: HeaderMap) -> Response {
    if !page.signed_in(&headers) {
        return unauthenticated();
    }
    let to_ms = poolgate_core::now_ms() + 1;
    let (keys, usage) = tokio::join!(
        page.endpoint.keys(),
        page.endpoint.usage(to_ms - KEYS_WINDOW_MS, to_ms, None)
    );
    match (keys, usage) {
        (Ok(keys), Ok(usage)) => axum::Json(KeysAnswer {
            keys: keys.into_iter().map(without_prefix).collect(),
            usage,
        })
        .into_response(),
        (Err(error), _) | (_, Err(error)) => endpoint_error(error),
    }
}

/// A key's leading characters are part of the key: the page shows its name and id instead.
fn without_prefix(key: KeyRow) -> KeyRow {
    KeyRow {
        prefix: String::new(),
        ..key
    }
}
