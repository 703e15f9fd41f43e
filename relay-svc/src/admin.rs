//! The operator endpoint of a relay that runs the selector in process (standalone): accounts,
//! blocks, restore, clear-block, usage — the verbs the selector's gRPC admin API offers in
//! distributed mode. It listens on its own address (`--admin-listen`), never the client port,
//! and answers only with the admin token (`Authorization: Bearer …`, compared in constant time).
//! A wrong token is refused after a fixed delay, with a cap on refusals delayed at once
//! (`poolgate_runtime::failed_auth`; never a lockout). Without a token it does not run at all.

use std::sync::Arc;

use async_trait::async_trait;
use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::StatusCode;
use poolgate_rpc::service_auth::constant_time_eq;
use poolgate_runtime::failed_auth::FailedAttempts;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// An account as operators see it: the credential masked, never whole.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AccountView {
    pub id: i64,
    pub name: String,
    pub group: String,
    pub platform: String,
    pub credential_kind: String,
    pub credential_masked: String,
    pub status: String,
    pub status_reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BlockView {
    pub account_id: i64,
    pub account_name: String,
    /// `hard`, `soft` or `breaker`.
    pub kind: String,
    pub class: String,
    pub status: u16,
    pub reason: String,
    pub remaining_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyUsage {
    pub api_key_id: i64,
    pub user: String,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("no account {0}")]
    UnknownAccount(i64),
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
    async fn accounts(&self) -> Vec<AccountView>;
    async fn blocks(&self) -> Result<Vec<BlockView>, AdminError>;
    /// Back to `active` (from retired, error or disabled), blocks cleared.
    async fn restore(&self, account_id: i64) -> Result<AccountView, AdminError>;
    async fn clear_block(&self, account_id: i64) -> Result<(), AdminError>;
    /// Usage per client key between two instants (ms since the epoch).
    async fn usage(&self, from_ms: i64, to_ms: i64) -> Result<Vec<KeyUsage>, AdminError>;
}

#[derive(Clone)]
struct Admin {
    operator: Arc<dyn Operator>,
    token: Arc<str>,
    failed: FailedAttempts,
}

/// The admin router; every route needs `token`.
pub fn router(operator: Arc<dyn Operator>, token: &str) -> Router {
    let admin = Admin {
        operator,
        token: Arc::from(token),
        failed: FailedAttempts::default(),
    };
    Router::new()
        .route("/admin/accounts", get(accounts))
        .route("/admin/blocks", get(blocks))
        .route("/admin/accounts/{id}/restore", post(restore))
        .route("/admin/accounts/{id}/clear-block", post(clear_block))
        .route("/admin/usage", get(usage))
        .layer(axum::middleware::from_fn_with_state(
            admin.clone(),
            authorize,
        ))
        .with_state(admin)
}

fn error(status: StatusCode, kind: &str, message: impl std::fmt::Display) -> Response {
    (
        status,
        axum::Json(json!({"error": {"type": kind, "message": message.to_string()}})),
    )
        .into_response()
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let status = match &self {
            AdminError::UnknownAccount(_) => StatusCode::NOT_FOUND,
            AdminError::Invalid { .. } => StatusCode::BAD_REQUEST,
            AdminError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        let kind = match &self {
            AdminError::UnknownAccount(_) => "not_found",
            AdminError::Invalid { .. } => "invalid_request",
            AdminError::Unavailable(_) => "unavailable",
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

async fn accounts(State(admin): State<Admin>) -> Response {
    axum::Json(json!({"accounts": admin.operator.accounts().await})).into_response()
}

async fn blocks(State(admin): State<Admin>) -> Result<Response, AdminError> {
    let blocks = admin.operator.blocks().await?;
    Ok(axum::Json(json!({"blocks": blocks})).into_response())
}

async fn restore(
    State(admin): State<Admin>,
    Path(id): Path<String>,
) -> Result<Response, AdminError> {
    let account = admin.operator.restore(account_id(&id)?).await?;
    Ok(axum::Json(json!({"account": account})).into_response())
}

async fn clear_block(
    State(admin): State<Admin>,
    Path(id): Path<String>,
) -> Result<Response, AdminError> {
    let id = account_id(&id)?;
    admin.operator.clear_block(id).await?;
    Ok(axum::Json(json!({"cleared": id})).into_response())
}

#[derive(Debug, Deserialize)]
struct Window {
    from_ms: Option<i64>,
    to_ms: Option<i64>,
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
    let keys = admin.operator.usage(from, to).await?;
    Ok(axum::Json(json!({"from_ms": from, "to_ms": to, "keys": keys})).into_response())
}

/// `relay-svc admin …`: one verb against a running relay's admin endpoint; prints its JSON.
pub async fn call(url: &str, token: &str, verb: &Verb) -> Result<String, String> {
    let base = url.trim_end_matches('/');
    // reqwest is built without a bundled TLS provider; ring is the one in the tree already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| format!("http client: {e}"))?;
    let request = match verb {
        Verb::Accounts => client.get(format!("{base}/admin/accounts")),
        Verb::Blocks => client.get(format!("{base}/admin/blocks")),
        Verb::Restore { account_id } => {
            client.post(format!("{base}/admin/accounts/{account_id}/restore"))
        }
        Verb::ClearBlock { account_id } => {
            client.post(format!("{base}/admin/accounts/{account_id}/clear-block"))
        }
        Verb::Usage { hours } => {
            let now = poolgate_core::now_ms();
            let from = now - i64::from(*hours) * 3600 * 1000;
            client.get(format!(
                "{base}/admin/usage?from_ms={from}&to_ms={}",
                now + 1
            ))
        }
    };
    let response = request
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| format!("{base}: {e}"))?;
    let status = response.status();
    let body = response.text().await.map_err(|e| format!("{base}: {e}"))?;
    let pretty = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or(body);
    if status.is_success() {
        Ok(pretty)
    } else {
        Err(format!("{status}: {pretty}"))
    }
}

/// The admin verbs.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Verb {
    /// Accounts with their status (credentials masked).
    Accounts,
    /// Blocked accounts: kind, class, status code, reason, time left.
    Blocks,
    /// Puts a retired, errored or disabled account back to active and clears its blocks.
    Restore { account_id: i64 },
    /// Clears an account's blocks and breaker.
    ClearBlock { account_id: i64 },
    /// Usage per client key over the last hours.
    Usage {
        #[arg(long, default_value_t = 24)]
        hours: u32,
    },
}
