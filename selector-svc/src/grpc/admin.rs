//! The selector's admin service over gRPC: the admin bearer-token check (`AdminAuth`, a delay on
//! a wrong token), and the operator's verbs — accounts, client keys, blocks, windows, bindings,
//! load, status, usage — validated (`InvalidArgument` naming the field) and answered. The read and
//! repair verbs decode, call the engine's admin API (`poolgate_operator::engine::EngineAdmin`,
//! the one the status page and the standalone relay serve) and encode; the configuration verbs
//! write to Postgres and reload the engine.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use poolgate_operator::engine::EngineAdmin;
use poolgate_operator::grpc::{block_view, list_prices_answer, model_usage_views};
use poolgate_proto::convert::keys::{KeyUpdate, api_key_view};
use poolgate_proto::convert::{self, EnumField};
use poolgate_proto::selector::v1 as pb;
use poolgate_runtime::failed_auth::FailedAttempts;
use tonic::codegen::Service;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

use crate::error::status;
use crate::store::{AccountInput, PostgresSource};
use poolgate_core::account::{
    AccountStatus, CredentialKind, OAuthState, Platform, Secret, serves_problem,
};
use poolgate_core::{AccountId, MAX_NAME_BYTES, now_ms};
use poolgate_select::engine::{Selector, SelectorError};

use super::*;

/// Checks `authorization: Bearer <token>` on every admin call (constant-time comparison). A
/// missing or wrong token is refused after a fixed delay, with a cap on refusals delayed at once
/// (`poolgate_runtime::failed_auth`): guessing costs time, and a flood neither piles up timers
/// nor locks the operator out. It wraps the admin service (an interceptor cannot wait).
#[derive(Clone)]
pub struct AdminAuth {
    token: Option<Arc<str>>,
    failed: FailedAttempts,
}

impl AdminAuth {
    pub fn new(token: Option<String>) -> Self {
        AdminAuth {
            token: token.filter(|t| !t.is_empty()).map(Arc::from),
            failed: FailedAttempts::default(),
        }
    }

    /// The admin service behind this check.
    pub fn wrap<S>(self, inner: S) -> AdminAuthService<S> {
        AdminAuthService { inner, auth: self }
    }

    /// `None` when the request carries the admin token; else its refusal, and whether it is a
    /// failed attempt (with no token configured there is nothing to guess).
    fn refusal(&self, headers: &http::HeaderMap) -> Option<(Status, bool)> {
        let Some(token) = &self.token else {
            return Some((
                Status::unauthenticated("admin api disabled: no admin token configured"),
                false,
            ));
        };
        let given = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if poolgate_rpc::service_auth::constant_time_eq(given.as_bytes(), token.as_bytes()) {
            None
        } else {
            Some((
                Status::unauthenticated("missing or wrong admin bearer token"),
                true,
            ))
        }
    }
}

/// The admin service, answering only callers with the admin token.
#[derive(Clone)]
pub struct AdminAuthService<S> {
    inner: S,
    auth: AdminAuth,
}

impl<S: NamedService> NamedService for AdminAuthService<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for AdminAuthService<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match self.auth.refusal(request.headers()) {
            None => Box::pin(self.inner.call(request)),
            Some((status, attempt)) => {
                let failed = self.auth.failed.clone();
                Box::pin(async move {
                    if attempt {
                        failed.refused().await;
                    }
                    Ok(status.into_http())
                })
            }
        }
    }
}

pub struct AdminGrpc {
    /// The read and repair verbs, as every operator surface runs them.
    engine: Arc<EngineAdmin>,
    /// The configuration writes (accounts, keys, statuses) go to Postgres itself, not through the
    /// engine's account source.
    store: PostgresSource,
}

impl AdminGrpc {
    /// Over the engine's admin API (the status page serves the same value) and the store the
    /// configuration writes go to.
    pub fn new(engine: Arc<EngineAdmin>, store: PostgresSource) -> Self {
        AdminGrpc { engine, store }
    }

    fn selector(&self) -> &Arc<Selector> {
        self.engine.selector()
    }

    fn view(&self, id: AccountId) -> Result<pb::AccountView, Status> {
        let snapshot = self.selector().snapshot().get();
        let account = snapshot
            .account(id)
            .ok_or_else(|| Status::not_found(format!("account {id}")))?;
        Ok(pb::AccountView::from(account.as_ref()))
    }

    /// Reloads the snapshot now, so the answer shows the change just made.
    async fn reload(&self) -> Result<(), Status> {
        self.selector().reload().await.map_err(status)
    }
}

fn http_url(field: &str, value: &str) -> Result<(), Status> {
    let ok = (value.starts_with("http://") || value.starts_with("https://"))
        && value.len() <= 2048
        && !value.contains(char::is_whitespace);
    ok.then_some(())
        .ok_or_else(|| invalid(field, "must be an http(s) URL"))
}

#[tonic::async_trait]
impl pb::selector_admin_server::SelectorAdmin for AdminGrpc {
    async fn upsert_account(
        &self,
        request: Request<pb::UpsertAccountRequest>,
    ) -> Result<Response<pb::AccountView>, Status> {
        let r = request.into_inner();
        name("name", &r.name)?;
        name("group", &r.group)?;
        let platform = Platform::decode("platform", r.platform)?;
        http_url("base_url", &r.base_url)?;
        // Older callers send only the deprecated string; `kind` wins when set.
        #[allow(deprecated)]
        let kind = convert::credential_kind(r.kind, &r.credential_kind)?;
        if r.credential.len() > 8192 || r.refresh_token.len() > 8192 {
            return Err(invalid("credential", "at most 8192 bytes"));
        }
        if !(r.session_window_limit_usd.is_finite()) {
            return Err(invalid("session_window_limit_usd", "must be finite"));
        }
        if r.weight < 0 {
            return Err(invalid("weight", "must be >= 0 (0: default 1)"));
        }
        if !r.token_url.is_empty() {
            http_url("token_url", &r.token_url)?;
        }
        if !r.proxy_url.is_empty() && r.proxy_url.len() > 2048 {
            return Err(invalid("proxy_url", "at most 2048 bytes"));
        }
        if r.probe_model.len() > MAX_NAME_BYTES || r.probe_model.chars().any(char::is_control) {
            return Err(invalid(
                "probe_model",
                "at most 128 bytes, no control characters",
            ));
        }
        if let Some(problem) =
            poolgate_select::probe::probe_model_refusal(platform, kind, &r.probe_model)
        {
            return Err(invalid("probe_model", &problem));
        }
        if r.oauth_client_id.len() > MAX_NAME_BYTES
            || r.oauth_client_id.chars().any(char::is_control)
        {
            return Err(invalid(
                "oauth_client_id",
                "at most 128 bytes, no control characters",
            ));
        }
        if kind == CredentialKind::ChatGptOAuth && platform != Platform::OpenAi {
            return Err(invalid(
                "kind",
                "chatgpt_oauth accounts are on platform openai",
            ));
        }
        if platform == Platform::Rerank && kind != CredentialKind::ApiKey {
            return Err(invalid("kind", "rerank accounts are API keys"));
        }
        let mut serves = Vec::with_capacity(r.serves.len());
        for value in &r.serves {
            let service = <poolgate_core::account::Service as EnumField>::decode("serves", *value)
                .map_err(|error| invalid("serves", &error.problem))?;
            if !serves.contains(&service) {
                serves.push(service);
            }
        }
        if let Some(problem) = serves_problem(platform, kind, &serves) {
            return Err(invalid("serves", &problem));
        }
        // An empty token_url is stored as NULL (an update keeps the stored URL); the store reads
        // NULL as the platform's default (`default_oauth_token_url`), so accounts that never
        // named an endpoint follow the default when it changes.
        let oauth = kind.is_oauth().then(|| OAuthState {
            refresh_token: Secret::new(r.refresh_token.clone()),
            expires_at_ms: r.expires_at_ms.min(i64::MAX as u64) as i64,
            token_url: r.token_url.clone(),
            client_id: r.oauth_client_id.clone(),
        });
        let input = AccountInput {
            name: r.name,
            group: r.group,
            platform,
            base_url: r.base_url,
            credential_kind: kind,
            credential: (!r.credential.is_empty()).then(|| Secret::new(r.credential)),
            oauth,
            priority: r.priority,
            weight: if r.weight == 0 { 1 } else { r.weight },
            concurrency_limit: r.concurrency_limit,
            rpm_limit: r.rpm_limit,
            session_window_limit_usd: r.session_window_limit_usd,
            allowed_models: r.allowed_models,
            model_mapping: r.model_mapping.into_iter().collect::<HashMap<_, _>>(),
            proxy_url: (!r.proxy_url.is_empty()).then_some(r.proxy_url),
            probe_model: (!r.probe_model.is_empty()).then_some(r.probe_model),
            stream_usage: !r.disable_stream_usage,
            serves,
        };
        let id = self
            .store
            .upsert_account(&input)
            .await
            .map_err(|e| status(e.into()))?;
        self.reload().await?;
        Ok(Response::new(self.view(id)?))
    }

    async fn list_accounts(
        &self,
        request: Request<pb::ListAccountsRequest>,
    ) -> Result<Response<pb::ListAccountsResponse>, Status> {
        let group = request.into_inner().group;
        let accounts = self
            .engine
            .account_list(Some(group.as_str()).filter(|group| !group.is_empty()))
            .iter()
            .map(|account| pb::AccountView::from(account.as_ref()))
            .collect();
        Ok(Response::new(pb::ListAccountsResponse { accounts }))
    }

    async fn set_account_status(
        &self,
        request: Request<pb::SetAccountStatusRequest>,
    ) -> Result<Response<pb::AccountView>, Status> {
        let r = request.into_inner();
        let id = account_id("account_id", r.account_id)?;
        let new_status = match AccountStatus::parse(&r.status) {
            Some(AccountStatus::Retired) => {
                return Err(invalid("status", "retired is set by quota outcomes only"));
            }
            Some(new_status) => new_status,
            None => return Err(invalid("status", "must be active, disabled or error")),
        };
        if r.reason.len() > MAX_REASON_BYTES {
            return Err(invalid(
                "reason",
                format!("at most {MAX_REASON_BYTES} bytes"),
            ));
        }
        self.store
            .set_status(id, new_status, &r.reason)
            .await
            .map_err(|e| status(e.into()))?;
        self.reload().await?;
        Ok(Response::new(self.view(id)?))
    }

    async fn restore_account(
        &self,
        request: Request<pb::RestoreAccountRequest>,
    ) -> Result<Response<pb::AccountView>, Status> {
        let id = account_id("account_id", request.into_inner().account_id)?;
        let account = self.engine.restore_account(id).await.map_err(status)?;
        Ok(Response::new(pb::AccountView::from(account.as_ref())))
    }

    async fn create_api_key(
        &self,
        request: Request<pb::CreateApiKeyRequest>,
    ) -> Result<Response<pb::CreateApiKeyResponse>, Status> {
        let r = request.into_inner();
        name("user", &r.user)?;
        name("group", &r.group)?;
        if r.name.len() > MAX_NAME_BYTES {
            return Err(invalid("name", format!("at most {MAX_NAME_BYTES} bytes")));
        }
        let access = convert::keys::new_key_access(&r)?;
        let limits = convert::keys::new_key_limits(&r)?;
        self.engine
            .check_new_expiry(access.expires_at_ms)
            .map_err(status)?;
        // A key's group must exist (an account's, or one the operator made): a typo would leave
        // every request of the key without an account.
        if !self
            .store
            .group_exists(&r.group)
            .await
            .map_err(|e| status(e.into()))?
        {
            return Err(invalid(
                "group",
                format!(
                    "no group {:?}: a group is made by its first account (upsert-account --group)",
                    r.group
                ),
            ));
        }
        let (id, key) = self
            .store
            .create_api_key_with_limits(
                &r.name,
                &r.user,
                &r.group,
                r.user_rpm_limit,
                &access,
                &limits,
            )
            .await
            .map_err(|e| status(e.into()))?;
        self.reload().await?;
        Ok(Response::new(pb::CreateApiKeyResponse {
            id,
            api_key: key.expose().to_owned(),
        }))
    }

    async fn list_api_keys(
        &self,
        _request: Request<pb::ListApiKeysRequest>,
    ) -> Result<Response<pb::ListApiKeysResponse>, Status> {
        // Each key with its usage against its limits, revoked ones too.
        let keys = self.engine.key_list().await.map_err(status)?;
        Ok(Response::new(pb::ListApiKeysResponse {
            keys: keys
                .iter()
                .map(|(key, usage)| api_key_view(key, usage))
                .collect(),
        }))
    }

    async fn update_api_key(
        &self,
        request: Request<pb::UpdateApiKeyRequest>,
    ) -> Result<Response<pb::ApiKeyView>, Status> {
        let (id, update) = <(i64, KeyUpdate)>::try_from(request.into_inner())?;
        let (record, usage) = self.engine.update_key(id, &update).await.map_err(status)?;
        Ok(Response::new(api_key_view(&record, &usage)))
    }

    async fn revoke_api_key(
        &self,
        request: Request<pb::RevokeApiKeyRequest>,
    ) -> Result<Response<pb::RevokeApiKeyResponse>, Status> {
        let id = request.into_inner().id;
        if id <= 0 {
            return Err(invalid("id", "must be a positive key id"));
        }
        self.store
            .revoke_api_key(id)
            .await
            .map_err(|e| status(e.into()))?;
        self.reload().await?;
        Ok(Response::new(pb::RevokeApiKeyResponse {}))
    }

    async fn list_blocks(
        &self,
        _request: Request<pb::ListBlocksRequest>,
    ) -> Result<Response<pb::ListBlocksResponse>, Status> {
        let blocks = self.engine.block_list().await.map_err(status)?;
        Ok(Response::new(pb::ListBlocksResponse {
            blocks: blocks.into_iter().map(block_view).collect(),
        }))
    }

    async fn list_windows(
        &self,
        request: Request<pb::ListWindowsRequest>,
    ) -> Result<Response<pb::ListWindowsResponse>, Status> {
        let (account, group) = convert::read_windows_query(request.into_inner())?;
        let answer = self
            .engine
            .window_list(account, group.as_deref())
            .await
            .map_err(status)?;
        Ok(Response::new(convert::windows_answer(answer)))
    }

    async fn clear_block(
        &self,
        request: Request<pb::ClearBlockRequest>,
    ) -> Result<Response<pb::ClearBlockResponse>, Status> {
        let id = account_id("account_id", request.into_inner().account_id)?;
        self.engine.clear_account_blocks(id).await.map_err(status)?;
        Ok(Response::new(pb::ClearBlockResponse {}))
    }

    async fn drop_binding(
        &self,
        request: Request<pb::DropBindingRequest>,
    ) -> Result<Response<pb::DropBindingResponse>, Status> {
        let r = request.into_inner();
        name("group", &r.group)?;
        name("session_hash", &r.session_hash)?;
        let dropped = self
            .selector()
            .health()
            .sticky_drop(&r.group, &r.session_hash)
            .await
            .map_err(|e| SelectorError::Unavailable(e.to_string()))
            .map_err(status)?;
        Ok(Response::new(pb::DropBindingResponse { dropped }))
    }

    async fn read_load(
        &self,
        request: Request<pb::ReadLoadRequest>,
    ) -> Result<Response<pb::ReadLoadResponse>, Status> {
        let mut ids = request.into_inner().account_ids;
        for &id in &ids {
            account_id("account_ids", id)?;
        }
        let snapshot = self.selector().snapshot().get();
        if ids.is_empty() {
            ids = snapshot.accounts().map(|a| a.id).collect();
            ids.sort_unstable();
        }
        let loads = self.selector().load(&ids).await;
        Ok(Response::new(pb::ReadLoadResponse {
            accounts: ids
                .into_iter()
                .zip(loads)
                .map(|(id, inflight)| pb::AccountLoad {
                    account_id: id,
                    inflight: inflight.map(|n| n as i32).unwrap_or(-1),
                    concurrency_limit: snapshot
                        .account(id)
                        .map(|a| a.concurrency_limit)
                        .unwrap_or(0),
                })
                .collect(),
        }))
    }

    async fn read_status(
        &self,
        _request: Request<pb::ReadStatusRequest>,
    ) -> Result<Response<pb::ReadStatusResponse>, Status> {
        let report = self.engine.status_report().await.map_err(status)?;
        Ok(Response::new(convert::status_answer(&report)))
    }

    async fn sign_in_account(
        &self,
        request: Request<pb::SignInAccountRequest>,
    ) -> Result<Response<pb::SignInAccountResponse>, Status> {
        let sign_in = poolgate_core::account::SignIn::try_from(request.into_inner())?;
        let signed_in = self
            .engine
            .sign_in_account(&sign_in)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::SignInAccountResponse {
            account: Some(pb::AccountView::from(&signed_in.account)),
            created: signed_in.created,
            reactivated: signed_in.reactivated,
        }))
    }

    async fn read_usage(
        &self,
        request: Request<pb::ReadUsageRequest>,
    ) -> Result<Response<pb::ReadUsageResponse>, Status> {
        let r = request.into_inner();
        if r.api_key_id <= 0 {
            return Err(invalid("api_key_id", "must be a positive key id"));
        }
        let (from, to) = if r.from_ms == 0 && r.to_ms == 0 {
            (now_ms() - 24 * 3600 * 1000, now_ms() + 1)
        } else {
            (
                r.from_ms.min(i64::MAX as u64) as i64,
                r.to_ms.min(i64::MAX as u64) as i64,
            )
        };
        let totals = self
            .engine
            .usage_totals(r.api_key_id, from, to)
            .await
            .map_err(status)?;
        let models = self
            .engine
            .model_usage(r.api_key_id, from, to)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ReadUsageResponse {
            requests: totals.requests.max(0) as u64,
            input_tokens: totals.input_tokens.max(0) as u64,
            output_tokens: totals.output_tokens.max(0) as u64,
            cost_usd: totals.cost_usd,
            models: model_usage_views(&models),
        }))
    }

    async fn list_prices(
        &self,
        _request: Request<pb::ListPricesRequest>,
    ) -> Result<Response<pb::ListPricesResponse>, Status> {
        let (prices, as_of) = self.engine.price_list();
        Ok(Response::new(list_prices_answer(&prices, as_of)))
    }

    async fn set_price(
        &self,
        request: Request<pb::SetPriceRequest>,
    ) -> Result<Response<pb::PriceView>, Status> {
        let r = request.into_inner();
        let price = r.price.ok_or_else(|| invalid("price", "is required"))?;
        let listed = self
            .engine
            .set_price(&r.model, price.into())
            .await
            .map_err(status)?;
        Ok(Response::new(pb::PriceView::from(&listed)))
    }

    async fn remove_price(
        &self,
        request: Request<pb::RemovePriceRequest>,
    ) -> Result<Response<pb::PriceView>, Status> {
        let listed = self
            .engine
            .remove_price(&request.into_inner().model)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::PriceView::from(&listed)))
    }
}
