//! The OAuth token endpoint (`/oauth/token`): refreshes tokens as the providers' do.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

use super::FakeState;

/// An OAuth token endpoint as the providers' answer refresh requests (JSON in): a refresh token
/// is good once; the new access token is `<refresh token>-access`, the new refresh token
/// `<refresh token>-next`.
pub(super) async fn oauth_token(
    State(state): State<Arc<FakeState>>,
    axum::Json(request): axum::Json<Value>,
) -> Response {
    let refresh = request
        .get("refresh_token")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let reused = {
        let mut seen = state.refreshed.lock().unwrap_or_else(|p| p.into_inner());
        let reused = seen
            .iter()
            .any(|r| r.get("refresh_token") == request.get("refresh_token"));
        seen.push(request.clone());
        reused
    };
    let pause = *state.token_delay.lock().unwrap_or_else(|p| p.into_inner());
    tokio::time::sleep(pause).await;
    if refresh.is_empty()
        || reused
        || request.get("grant_type").and_then(Value::as_str) != Some("refresh_token")
        || request
            .get("client_id")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "invalid_grant"})),
        )
            .into_response();
    }
    axum::Json(json!({
        "access_token": format!("{refresh}-access"),
        "refresh_token": format!("{refresh}-next"),
        "expires_in": 3600,
    }))
    .into_response()
}
