//! The operator endpoint of a relay that runs the selector in process (standalone): the read and
//! repair verbs of `poolgate-operator` (accounts, blocks, windows, restore, clear-block, usage,
//! keys, disable-key, enable-key, status),
//! the ones the selector's gRPC admin API offers in distributed mode, answered in the operator
//! crate's JSON envelopes (`poolgate_operator::view`), so one CLI prints the same for both. It
//! listens on its own address (`--admin-listen`), never the client port, and answers only with the
//! admin token (`Authorization: Bearer …`, compared in constant time). A wrong token is refused
//! after a fixed delay, with a cap on refusals delayed at once (`poolgate_runtime::failed_auth`;
//! never a lockout). Without a token it does not run at all. The status page
//! (`poolgate_operator::page`, over `admin_page.rs`) shares the listener behind its own login.

use std::sync::Arc;

use async_trait::async_trait;
use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::StatusCode;
use poolgate_operator::view::{
    AccountList, BlockList, Cleared, ErrorBody, KeyChanged, KeyList, KeyRow, Restored,
    StatusAnswer, StatusView, UsageReport, WindowList,
};
use poolgate_rpc::service_auth::constant_time_eq;
use poolgate_runtime::failed_auth::FailedAttempts;
use serde::Deserialize;

/// The `relay-svc admin` verbs: the operator CLI's, the same as `selector-svc admin`'s.
pub use poolgate_operator::Verb;
/// The rows the endpoint answers with, under the names the engine side has always used.
pub use poolgate_operator::view::{
    AccountRow as AccountView, BlockRow as BlockView, UsageRow as KeyUsage, WindowRow,
};

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("no account {0}")]
    UnknownAccount(i64),
    #[error("no client key {0}")]
    UnknownKey(i64),
    #[error("invalid {field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("backend unavailable: {0}")]
    Unavailable(String),
}

/// What the endpoint asks of the engine behind it.
#[async_trait]
pub trait Operator: Send + Sync + 'static {
    /// Every account, sorted by id.
    async fn accounts(&self) -> Vec<AccountView>;
    async fn blocks(&self) -> Result<Vec<BlockView>, AdminError>;
    /// The usage windows the engine keeps, as `poolgate_operator::view::window_rows` builds
    /// them: only `account_id`'s, only `group`'s accounts, when given.
    async fn windows(
        &self,
        account_id: Option<i64>,
        group: Option<&str>,
    ) -> Result<Vec<WindowRow>, AdminError>;
    /// Back to `active` (from retired, error or disabled), blocks cleared.
    async fn restore(&self, account_id: i64) -> Result<AccountView, AdminError>;
    async fn clear_block(&self, account_id: i64) -> Result<(), AdminError>;
    /// Usage per client key between two instants (ms since the epoch).
    async fn usage(&self, from_ms: i64, to_ms: i64) -> Result<Vec<KeyUsage>, AdminError>;
    /// Client keys ascending by id. (Default: an engine that serves none says so.)
    async fn keys(&self) -> Result<Vec<KeyRow>, AdminError> {
        Err(AdminError::Unavailable(
            "client keys are not served here".into(),
        ))
    }
    /// Disables (`true`) or enables a client key, kept across restarts; the key after. An
    /// unknown key is `UnknownKey`.
    async fn set_key_disabled(
        &self,
        api_key_id: i64,
        disabled: bool,
    ) -> Result<KeyRow, AdminError> {
        let _ = (api_key_id, disabled);
        Err(AdminError::Unavailable(
            "client keys are not served here".into(),
        ))
    }
    /// The pool at a glance (`poolgate_operator::view::status_view` of the engine's report).
    /// (Default: an engine that cannot tell says so.)
    async fn status(&self) -> Result<StatusView, AdminError> {
        Err(AdminError::Unavailable(
            "the status is not served here".into(),
        ))
    }
}

#[derive(Clone)]
struct Admin {
    operator: Arc<dyn Operator>,
    token: Arc<str>,
    failed: FailedAttempts,
}

/// The admin router; every `/admin/` route needs `token` as a bearer, the status page
/// (`poolgate_operator::page`: `/`, `/login`, `/api/…`) its session cookie.
pub fn router(operator: Arc<dyn Operator>, token: &str) -> Router {
    let admin = Admin {
        operator,
        token: Arc::from(token),
        failed: FailedAttempts::default(),
    };
    Router::new()
        .route("/admin/accounts", get(accounts))
        .route("/admin/blocks", get(blocks))
        .route("/admin/windows", get(windows))
        .route("/admin/accounts/{id}/restore", post(restore))
        .route("/admin/accounts/{id}/clear-block", post(clear_block))
        .route("/admin/usage", get(usage))
        .route("/admin/keys", get(keys))
        .route("/admin/keys/{id}/disable", post(disable_key))
        .route("/admin/keys/{id}/enable", post(enable_key))
        .route("/admin/status", get(status))
        // Its own fallback, behind the token like every route: the merged page has none, so an
        // unknown path still answers 401 without the token.
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            admin.clone(),
            authorize,
        ))
        .with_state(admin.clone())
        // The status page on the same listener, over the same operator; its own login.
        .merge(poolgate_operator::page::router(
            Arc::new(crate::admin_page::InProcessAdmin::new(admin.operator)),
            token,
            poolgate_operator::page::Scheme::Http,
        ))
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not_found", "no such admin route")
}

fn error(status: StatusCode, kind: &str, message: impl std::fmt::Display) -> Response {
    (status, axum::Json(ErrorBody::new(kind, message))).into_response()
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let (status, kind) = match &self {
            AdminError::UnknownAccount(_) | AdminError::UnknownKey(_) => {
                (StatusCode::NOT_FOUND, "not_found")
            }
            AdminError::Invalid { .. } => (StatusCode::BAD_REQUEST, "invalid_request"),
            AdminError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        };
        error(status, kind, self)
    }
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

fn account_id(text: &str) -> Result<i64, AdminError> {
    text.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or(AdminError::Invalid {
            field: "account_id",
            message: "must be a positive integer".into(),
        })
}

fn api_key_id(text: &str) -> Result<i64, AdminError> {
    text.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or(AdminError::Invalid {
            field: "api_key_id",
            message: "must be a positive integer".into(),
        })
}

#[derive(Debug, Deserialize)]
struct Group {
    group: Option<String>,
}

async fn accounts(State(admin): State<Admin>, Query(only): Query<Group>) -> Response {
    let mut accounts = admin.operator.accounts().await;
    if let Some(group) = &only.group {
        accounts.retain(|account| &account.group == group);
    }
    axum::Json(AccountList { accounts }).into_response()
}

async fn blocks(State(admin): State<Admin>) -> Result<Response, AdminError> {
    let blocks = admin.operator.blocks().await?;
    Ok(axum::Json(BlockList { blocks }).into_response())
}

#[derive(Debug, Deserialize)]
struct WindowsQuery {
    account_id: Option<String>,
    group: Option<String>,
}

async fn windows(
    State(admin): State<Admin>,
    Query(only): Query<WindowsQuery>,
) -> Result<Response, AdminError> {
    let account = only.account_id.as_deref().map(account_id).transpose()?;
    let group = only.group.as_deref().filter(|group| !group.is_empty());
    let windows = admin.operator.windows(account, group).await?;
    Ok(axum::Json(WindowList { windows }).into_response())
}

async fn restore(
    State(admin): State<Admin>,
    Path(id): Path<String>,
) -> Result<Response, AdminError> {
    let account = admin.operator.restore(account_id(&id)?).await?;
    Ok(axum::Json(Restored { account }).into_response())
}

async fn clear_block(
    State(admin): State<Admin>,
    Path(id): Path<String>,
) -> Result<Response, AdminError> {
    let id = account_id(&id)?;
    admin.operator.clear_block(id).await?;
    Ok(axum::Json(Cleared { cleared: id }).into_response())
}

async fn status(State(admin): State<Admin>) -> Result<Response, AdminError> {
    let status = admin.operator.status().await?;
    Ok(axum::Json(StatusAnswer { status }).into_response())
}

async fn keys(State(admin): State<Admin>) -> Result<Response, AdminError> {
    let keys = admin.operator.keys().await?;
    Ok(axum::Json(KeyList { keys }).into_response())
}

async fn set_key_disabled(admin: &Admin, id: &str, disabled: bool) -> Result<Response, AdminError> {
    let key = admin
        .operator
        .set_key_disabled(api_key_id(id)?, disabled)
        .await?;
    Ok(axum::Json(KeyChanged { key }).into_response())
}

async fn disable_key(
    State(admin): State<Admin>,
    Path(id): Path<String>,
) -> Result<Response, AdminError> {
    set_key_disabled(&admin, &id, true).await
}

async fn enable_key(
    State(admin): State<Admin>,
    Path(id): Path<String>,
) -> Result<Response, AdminError> {
    set_key_disabled(&admin, &id, false).await
}

#[derive(Debug, Deserialize)]
struct Window {
    from_ms: Option<i64>,
    to_ms: Option<i64>,
    api_key_id: Option<i64>,
}

async fn usage(
    State(admin): State<Admin>,
    Query(window): Query<Window>,
) -> Result<Response, AdminError> {
    let now = poolgate_core::now_ms();
    let to = window.to_ms.unwrap_or(now + 1);
    let from = window.from_ms.unwrap_or(to - 24 * 3600 * 1000);
    if to <= from {
        return Err(AdminError::Invalid {
            field: "to_ms",
            message: "must be after from_ms".into(),
        });
    }
    let mut keys = admin.operator.usage(from, to).await?;
    if let Some(id) = window.api_key_id {
        keys.retain(|key| key.api_key_id == id);
        if keys.is_empty() {
            return Err(AdminError::UnknownKey(id));
        }
    }
    Ok(axum::Json(UsageReport {
        from_ms: from,
        to_ms: to,
        keys,
    })
    .into_response())
}

/// `relay-svc admin …`: one verb against a running relay's admin endpoint (at `url`, with the
/// admin token), rendered as the verb's `--output` asks; `Err` is the message for stderr.
pub async fn call(url: &str, token: &str, verb: &Verb) -> Result<String, String> {
    let endpoint =
        poolgate_operator::http::HttpAdmin::new(url, token).map_err(|e| e.to_string())?;
    poolgate_operator::execute(&endpoint, verb)
        .await
        .map_err(|e| e.to_string())
}
