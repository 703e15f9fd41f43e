//! The admin HTTP endpoint's routes over an [`AdminEndpoint`]: the read and repair verbs (accounts,
//! blocks, windows, restore, clear-block, usage, keys, disable-key, enable-key, status) and the
//! prices (`prices`, `set-price`, `remove-price`: the model and price in the query) in the
//! JSON envelopes of [`crate::view`], the routes [`super::HttpAdmin`] calls. The standalone relay
//! serves them over the engine's admin API (`crate::engine::EngineAdmin`) on its own address
//! (`--admin-listen`), never the client port, and only with the admin token (`Authorization:
//! Bearer …`, compared in constant time). A wrong token is refused after a fixed delay, with a cap
//! on refusals delayed at once (`poolgate_runtime::failed_auth`; never a lockout). The status page
//! ([`crate::page`]) shares the router behind its own login.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::StatusCode;
use poolgate_rpc::service_auth::constant_time_eq;
use poolgate_runtime::failed_auth::FailedAttempts;
use serde::Deserialize;

use crate::view::{
    AccountList, BlockList, Cleared, ErrorBody, KeyChanged, KeyList, PriceChanged, Restored,
    SignInBody, StatusAnswer, WindowList,
};
use crate::{AdminEndpoint, OperatorError};

#[derive(Clone)]
struct Admin {
    endpoint: Arc<dyn AdminEndpoint>,
    token: Arc<str>,
    failed: FailedAttempts,
}

/// The admin router; every `/admin/` route needs `token` as a bearer, the status page
/// (`crate::page`: `/`, `/login`, `/api/…`) its session cookie.
pub fn router(endpoint: Arc<dyn AdminEndpoint>, token: &str) -> Router {
    let admin = Admin {
        endpoint,
        token: Arc::from(token),
        failed: FailedAttempts::default(),
    };
    Router::new()
        .route("/admin/accounts", get(accounts))
        .route("/admin/blocks", get(blocks))
        .route("/admin/windows", get(windows))
        .route("/admin/accounts/sign-in", post(sign_in))
        .route("/admin/accounts/{id}/restore", post(restore))
        .route("/admin/accounts/{id}/clear-block", post(clear_block))
        .route("/admin/usage", get(usage))
        .route("/admin/keys", get(keys))
        .route("/admin/keys/{id}/disable", post(disable_key))
        .route("/admin/keys/{id}/enable", post(enable_key))
        .route("/admin/status", get(status))
        .route("/admin/prices", get(prices))
        .route("/admin/prices/set", post(set_price))
        .route("/admin/prices/remove", post(remove_price))
        // Its own fallback, behind the token like every route: the merged page has none, so an
        // unknown path still answers 401 without the token.
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            admin.clone(),
            authorize,
        ))
        .with_state(admin.clone())
        // The status page on the same listener, over the same endpoint; its own login.
        .merge(crate::page::router(
            admin.endpoint,
            token,
            crate::page::Scheme::Http,
        ))
}

/// The HTTP status and error type an operator error is answered with (the admin routes and the
/// status page alike): what is missing is 404, a refused argument 400, anything else 503.
pub fn error_status(error: &OperatorError) -> (StatusCode, &'static str) {
    match error {
        OperatorError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
        OperatorError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    }
}

/// An answer's `Err`: its status, and its detail as the message.
struct Refused(OperatorError);

impl From<OperatorError> for Refused {
    fn from(error: OperatorError) -> Self {
        Refused(error)
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let (status, kind) = error_status(&self.0);
        error(status, kind, self.0.detail())
    }
}

type Answer = Result<Response, Refused>;

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not_found", "no such admin route")
}

fn error(status: StatusCode, kind: &str, message: impl std::fmt::Display) -> Response {
    (status, axum::Json(ErrorBody::new(kind, message))).into_response()
}

async fn authorize(State(admin): State<Admin>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if given.is_empty() || !constant_time_eq(given.as_bytes(), admin.token.as_bytes()) {
        admin.failed.refused().await;
        return error(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "send the admin token as Authorization: Bearer <token>",
        );
    }
    next.run(request).await
}

/// A positive id from a path segment or a query, refused naming `field`.
fn positive_id(field: &str, text: &str) -> Result<i64, Refused> {
    text.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| {
            Refused(OperatorError::Invalid(format!(
                "invalid {field}: must be a positive integer"
            )))
        })
}

#[derive(Debug, Deserialize)]
struct Group {
    group: Option<String>,
}

async fn accounts(State(admin): State<Admin>, Query(only): Query<Group>) -> Answer {
    let accounts = admin.endpoint.accounts(only.group.as_deref()).await?;
    Ok(axum::Json(AccountList { accounts }).into_response())
}

async fn blocks(State(admin): State<Admin>) -> Answer {
    let blocks = admin.endpoint.blocks().await?;
    Ok(axum::Json(BlockList { blocks }).into_response())
}

#[derive(Debug, Deserialize)]
struct WindowsQuery {
    account_id: Option<String>,
    group: Option<String>,
}

async fn windows(State(admin): State<Admin>, Query(only): Query<WindowsQuery>) -> Answer {
    let account = only
        .account_id
        .as_deref()
        .map(|id| positive_id("account_id", id))
        .transpose()?;
    let group = only.group.as_deref().filter(|group| !group.is_empty());
    let windows = admin.endpoint.windows(account, group).await?;
    Ok(axum::Json(WindowList { windows }).into_response())
}

async fn restore(State(admin): State<Admin>, Path(id): Path<String>) -> Answer {
    let account = admin
        .endpoint
        .restore(positive_id("account_id", &id)?)
        .await?;
    Ok(axum::Json(Restored { account }).into_response())
}

async fn clear_block(State(admin): State<Admin>, Path(id): Path<String>) -> Answer {
    let id = positive_id("account_id", &id)?;
    admin.endpoint.clear_block(id).await?;
    Ok(axum::Json(Cleared { cleared: id }).into_response())
}

/// A sign-in or an import ([`SignInBody`]); a body that is no sign-in is 400 naming the field.
async fn sign_in(State(admin): State<Admin>, body: axum::body::Bytes) -> Answer {
    let body: SignInBody = serde_json::from_slice(&body).map_err(|error| {
        // serde's message may quote a value (a token): the position is enough.
        OperatorError::Invalid(format!(
            "the body is not a sign-in ({:?} error at line {} column {})",
            error.classify(),
            error.line(),
            error.column()
        ))
    })?;
    let sign_in = body.to_sign_in().map_err(|(field, problem)| {
        OperatorError::Invalid(format!("invalid {field}: {problem}"))
    })?;
    let signed_in = admin.endpoint.sign_in(&sign_in).await?;
    Ok(axum::Json(signed_in).into_response())
}

async fn status(State(admin): State<Admin>) -> Answer {
    let status = admin.endpoint.status().await?;
    Ok(axum::Json(StatusAnswer { status }).into_response())
}

async fn keys(State(admin): State<Admin>) -> Answer {
    let keys = admin.endpoint.keys().await?;
    Ok(axum::Json(KeyList { keys }).into_response())
}

async fn set_key_disabled(admin: &Admin, id: &str, disabled: bool) -> Answer {
    let key = admin
        .endpoint
        .set_key_disabled(positive_id("api_key_id", id)?, disabled)
        .await?;
    Ok(axum::Json(KeyChanged { key }).into_response())
}

async fn disable_key(State(admin): State<Admin>, Path(id): Path<String>) -> Answer {
    set_key_disabled(&admin, &id, true).await
}

async fn enable_key(State(admin): State<Admin>, Path(id): Path<String>) -> Answer {
    set_key_disabled(&admin, &id, false).await
}

#[derive(Debug, Deserialize)]
struct Window {
    from_ms: Option<i64>,
    to_ms: Option<i64>,
    api_key_id: Option<i64>,
}

/// `from_ms`/`to_ms` default to the last 24 h.
async fn usage(State(admin): State<Admin>, Query(window): Query<Window>) -> Answer {
    let to = window.to_ms.unwrap_or(poolgate_core::now_ms() + 1);
    let from = window.from_ms.unwrap_or(to - 24 * 3600 * 1000);
    let report = admin.endpoint.usage(from, to, window.api_key_id).await?;
    Ok(axum::Json(report).into_response())
}

async fn prices(State(admin): State<Admin>) -> Answer {
    let list = admin.endpoint.prices().await?;
    Ok(axum::Json(list).into_response())
}

#[derive(Debug, Deserialize)]
struct PriceQuery {
    model: Option<String>,
    input: Option<f64>,
    output: Option<f64>,
    cache_write: Option<f64>,
    cache_read: Option<f64>,
    /// USD per search unit (rerank); absent: none.
    search_unit: Option<f64>,
}

/// A field the query must give, refused naming it.
fn required<T>(field: &str, value: Option<T>) -> Result<T, Refused> {
    value.ok_or_else(|| {
        Refused(OperatorError::Invalid(format!(
            "invalid {field}: is required"
        )))
    })
}

async fn set_price(State(admin): State<Admin>, Query(query): Query<PriceQuery>) -> Answer {
    let model = required("model", query.model)?;
    let price = poolgate_core::account::Price {
        input_per_mtok: required("input", query.input)?,
        output_per_mtok: required("output", query.output)?,
        cache_write_per_mtok: required("cache_write", query.cache_write)?,
        cache_read_per_mtok: required("cache_read", query.cache_read)?,
        per_search_unit: query.search_unit.unwrap_or(0.0),
    };
    let price = admin.endpoint.set_price(&model, price).await?;
    Ok(axum::Json(PriceChanged { price }).into_response())
}

async fn remove_price(State(admin): State<Admin>, Query(query): Query<PriceQuery>) -> Answer {
    let model = required("model", query.model)?;
    let price = admin.endpoint.remove_price(&model).await?;
    Ok(axum::Json(PriceChanged { price }).into_response())
}
