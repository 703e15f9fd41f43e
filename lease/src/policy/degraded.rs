//! Entering the degraded state, and routing each operation to Redis or to the fallback: a
//! connection failure switches the replica, a timeout answers for that one call only.

use std::sync::atomic::Ordering;

use poolgate_runtime::error::StateError;

use super::PolicyBackend;

impl PolicyBackend {
    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::SeqCst)
    }

    pub(super) async fn enter_degraded(&self, operation: &'static str, error: &StateError) {
        if self.is_degraded() {
            return;
        }
        let _adopting = self.adoption.write().await;
        if !self.degraded.swap(true, Ordering::SeqCst) {
            tracing::warn!(%error, operation, policy = self.settings.policy.as_str(), "redis unavailable; failure policy in force");
            self.metrics.degraded.set(1);
            self.adopt_held().await;
        }
    }

    fn count_fallback(&self, operation: &'static str, reason: &'static str) {
        self.metrics
            .fallbacks
            .with_label_values(&[operation, reason])
            .inc();
    }

    /// Runs `on_redis` unless degraded; on failure (or when degraded) runs `on_fallback`.
    pub(super) async fn guarded<T>(
        &self,
        operation: &'static str,
        on_redis: impl Future<Output = Result<T, StateError>>,
        on_fallback: impl Future<Output = Result<T, StateError>>,
    ) -> Result<T, StateError> {
        self.guarded_or(operation, on_redis, on_fallback, None)
            .await
    }

    /// Like `guarded`, but a *timeout* (Redis slow, not gone: the operation may even have been
    /// applied) never switches to the fallback: it answers `on_timeout` when given, the timeout
    /// otherwise. Admitting from the fallback while Redis is merely slow would over-admit exactly
    /// when it is overloaded; connection failures (Redis gone) still switch, and the registry
    /// probe decides about an outage that only shows as timeouts, and when Redis is back.
    pub(super) async fn guarded_or<T>(
        &self,
        operation: &'static str,
        on_redis: impl Future<Output = Result<T, StateError>>,
        on_fallback: impl Future<Output = Result<T, StateError>>,
        on_timeout: Option<T>,
    ) -> Result<T, StateError> {
        if self.is_degraded() {
            let _gate = self.adoption.read().await;
            // Still degraded under the gate (recovery may have finished while this waited).
            if self.is_degraded() {
                self.count_fallback(operation, "degraded");
                return on_fallback.await;
            }
        }
        match on_redis.await {
            Ok(value) => Ok(value),
            Err(StateError::Timeout) => {
                self.metrics
                    .redis_timeouts
                    .with_label_values(&[operation])
                    .inc();
                match on_timeout {
                    Some(answer) => {
                        self.count_fallback(operation, "timeout");
                        Ok(answer)
                    }
                    None => Err(StateError::Timeout),
                }
            }
            Err(error) => {
                self.enter_degraded(operation, &error).await;
                self.count_fallback(operation, "error");
                let _adopted = self.adoption.read().await;
                on_fallback.await
            }
        }
    }
}
