//! OAuth access-token refresh: before expiry and after an `unauthorized` outcome, under the
//! health store's lock so one replica refreshes once cluster-wide (refresh tokens rotate: a
//! second use of the same refresh token would be refused upstream), and written back to the
//! account source (Postgres, from where every replica's snapshot picks it up on NOTIFY; or the
//! standalone relay's state file).

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::health::Locks;
use crate::metrics::Metrics;
use crate::source::AccountSource;
use poolgate_core::account::{Platform, Secret};
use poolgate_core::{AccountId, Clock};

#[derive(Debug, Clone)]
pub struct RefreshSettings {
    /// Refresh tokens expiring within this much time.
    pub ahead: Duration,
    /// How long one replica may hold the refresh lock.
    pub lock_ttl: Duration,
    /// Bound on the token endpoint call.
    pub timeout: Duration,
}

impl Default for RefreshSettings {
    fn default() -> Self {
        RefreshSettings {
            ahead: Duration::from_secs(300),
            lock_ttl: Duration::from_secs(30),
            timeout: Duration::from_secs(15),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum RefreshResult {
    /// This replica refreshed the token.
    Refreshed,
    /// Another replica held the lock; the new token is in the source now.
    Waited,
    /// Not an OAuth account, or its token is not due.
    NotNeeded,
}

#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error("token endpoint refused the refresh: status {0}")]
    Refused(u16),
    #[error("token endpoint unreachable: {0}")]
    Unreachable(String),
    #[error("token endpoint answer unreadable")]
    BadAnswer,
    #[error("store: {0}")]
    Store(String),
    #[error("another replica's refresh did not finish in time")]
    LockTimeout,
}

/// Why a refresh is asked for.
enum Due {
    /// The token expires within `ahead`.
    Expiring,
    /// The upstream refused this token.
    Refused(Secret),
    /// An operator or a test asked.
    Forced,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    refresh_token: Option<String>,
    #[serde(default)]
    expires_in: Option<i64>,
}

#[derive(Clone)]
pub struct TokenRefresher {
    source: Arc<dyn AccountSource>,
    locks: Arc<dyn Locks>,
    http: reqwest::Client,
    settings: RefreshSettings,
    owner: String,
    metrics: Metrics,
    /// Token expiries are judged and written on it.
    clock: Clock,
}

impl TokenRefresher {
    pub fn new(
        source: Arc<dyn AccountSource>,
        locks: Arc<dyn Locks>,
        settings: RefreshSettings,
        metrics: Metrics,
        clock: Clock,
    ) -> Result<Self, String> {
        // reqwest is built without a bundled TLS provider; ring is the one in the tree already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(settings.timeout)
            .build()
            .map_err(|e| format!("http client: {e}"))?;
        Ok(TokenRefresher {
            source,
            locks,
            http,
            settings,
            owner: format!("{:016x}", fastrand::u64(..)),
            metrics,
            clock,
        })
    }

    /// Refreshes `id`'s token if it expires within `ahead` (or `force`).
    pub async fn refresh(&self, id: AccountId, force: bool) -> Result<RefreshResult, RefreshError> {
        let due = if force { Due::Forced } else { Due::Expiring };
        self.refresh_when(id, due).await
    }

    /// Refreshes `id`'s token after the upstream refused `refused` (a 401), whatever its expiry,
    /// unless the stored token is already another one (refreshed meanwhile, here or elsewhere).
    pub async fn refresh_refused(
        &self,
        id: AccountId,
        refused: &Secret,
    ) -> Result<RefreshResult, RefreshError> {
        self.refresh_when(id, Due::Refused(refused.clone())).await
    }

    async fn refresh_when(&self, id: AccountId, due: Due) -> Result<RefreshResult, RefreshError> {
        let force = !matches!(due, Due::Expiring);
        let account = self
            .source
            .load_account(id)
            .await
            .map_err(|e| RefreshError::Store(e.to_string()))?;
        let Some(oauth) = account
            .oauth
            .as_ref()
            .filter(|_| account.credential_kind.is_oauth())
        else {
            return Ok(RefreshResult::NotNeeded);
        };
        let expiring =
            oauth.expires_at_ms <= self.clock.wall_ms() + self.settings.ahead.as_millis() as i64;
        // Without a refresh token (Claude Code's `setup-token`: a year-long inference-only
        // token) there is nothing to refresh with: the operator signs the account in again
        // before its expiry (`accounts` shows it), and a refusal is counted as it stands.
        if !(force || expiring) || oauth.token_url.is_empty() || oauth.refresh_token.is_empty() {
            return Ok(RefreshResult::NotNeeded);
        }
        let lock_ms = self.settings.lock_ttl.as_millis() as u64;
        let locked = self
            .locks
            .lock_refresh(id, &self.owner, lock_ms)
            .await
            .map_err(|e| RefreshError::Store(e.to_string()))?;
        if !locked {
            return self.wait_for_other(id, &account.credential).await;
        }
        let result = self.refresh_locked(id, &due).await;
        let _ = self.locks.unlock_refresh(id, &self.owner).await;
        let label = match &result {
            Ok(RefreshResult::Refreshed) => Some("refreshed"),
            Ok(RefreshResult::Waited) => Some("waited"),
            Ok(RefreshResult::NotNeeded) => None,
            Err(_) => Some("failed"),
        };
        if let Some(label) = label {
            self.metrics
                .token_refreshes
                .with_label_values(&[label])
                .inc();
        }
        result
    }

    async fn refresh_locked(
        &self,
        id: AccountId,
        due: &Due,
    ) -> Result<RefreshResult, RefreshError> {
        // Re-read under the lock: another replica may have rotated the refresh token just now.
        let account = self
            .source
            .load_account(id)
            .await
            .map_err(|e| RefreshError::Store(e.to_string()))?;
        let Some(oauth) = account.oauth else {
            return Ok(RefreshResult::NotNeeded);
        };
        let refreshed_meanwhile = match due {
            Due::Expiring => {
                oauth.expires_at_ms > self.clock.wall_ms() + self.settings.ahead.as_millis() as i64
            }
            Due::Refused(refused) => account.credential != *refused,
            Due::Forced => false,
        };
        if refreshed_meanwhile {
            // Refreshed by someone else between our check and our lock.
            return Ok(RefreshResult::Waited);
        }
        // As the official CLIs ask: JSON, with their public client id (per account if set).
        let client_id = oauth.client_id_for(account.platform);
        let body = match account.platform {
            Platform::Anthropic => serde_json::json!({
                "grant_type": "refresh_token",
                "refresh_token": oauth.refresh_token.expose(),
                "client_id": client_id,
            }),
            Platform::OpenAi => serde_json::json!({
                "client_id": client_id,
                "grant_type": "refresh_token",
                "refresh_token": oauth.refresh_token.expose(),
                "scope": "openid profile email",
            }),
            // Rerank accounts are API keys: nothing to refresh.
            Platform::Rerank => return Ok(RefreshResult::NotNeeded),
        };
        let response = self
            .http
            .post(&oauth.token_url)
            .json(&body)
            .send()
            .await
            // reqwest errors name the URL, never the form body.
            .map_err(|e| RefreshError::Unreachable(e.without_url().to_string()))?;
        if !response.status().is_success() {
            return Err(RefreshError::Refused(response.status().as_u16()));
        }
        let answer: TokenAnswer = response.json().await.map_err(|_| RefreshError::BadAnswer)?;
        let access = Secret::new(answer.access_token);
        let refresh = answer
            .refresh_token
            .map(Secret::new)
            .unwrap_or(oauth.refresh_token);
        let expires_at = self.clock.wall_ms() + answer.expires_in.unwrap_or(3600).max(0) * 1000;
        self.source
            .store_tokens(id, &access, &refresh, expires_at)
            .await
            .map_err(|e| RefreshError::Store(e.to_string()))?;
        tracing::info!(account_id = id, "oauth token refreshed");
        Ok(RefreshResult::Refreshed)
    }

    /// Another replica holds the lock: wait until the source shows a new credential.
    async fn wait_for_other(
        &self,
        id: AccountId,
        old: &Secret,
    ) -> Result<RefreshResult, RefreshError> {
        // A wait, on Tokio's timer (core/src/clock.rs: the clock does not sleep).
        let deadline = tokio::time::Instant::now() + self.settings.lock_ttl;
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let account = self
                .source
                .load_account(id)
                .await
                .map_err(|e| RefreshError::Store(e.to_string()))?;
            if account.credential != *old {
                self.metrics
                    .token_refreshes
                    .with_label_values(&["waited"])
                    .inc();
                return Ok(RefreshResult::Waited);
            }
        }
        Err(RefreshError::LockTimeout)
    }

    /// Refreshes every OAuth account of `ids` that is due.
    pub async fn refresh_due(&self, ids: &[AccountId]) {
        for &id in ids {
            if let Err(error) = self.refresh(id, false).await {
                tracing::warn!(account_id = id, %error, "oauth token refresh failed");
            }
        }
    }
}

/// Refreshes OAuth tokens that are due, every `interval`, until the engine is gone. (Refused
/// tokens are refreshed by the engine's confirmations, on the probe's evidence.)
pub async fn refresh_loop(
    refresher: TokenRefresher,
    engine: std::sync::Weak<crate::engine::Selector>,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(engine) = engine.upgrade() else {
            return;
        };
        let due: Vec<AccountId> = engine
            .snapshot()
            .get()
            .accounts()
            .filter(|a| a.credential_kind.is_oauth())
            .map(|a| a.id)
            .collect();
        drop(engine);
        refresher.refresh_due(&due).await;
    }
}
