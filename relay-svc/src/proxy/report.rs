//! What the relay tells selection about a request, in one place: the upstream's outcome (the
//! selection API applies it; only a refused OAuth token answers something to act on), the
//! answer's usage-window readings, and the session and response bindings of a success. None of
//! it is on a request's critical path to the client: a failure is logged and the request goes on.

use poolgate_core::account::Secret;
use poolgate_core::classify::Classified;
use poolgate_core::outcome::Outcome;
use poolgate_core::windows::WindowReading;
use poolgate_select::api::Reported;

use super::Relay;

impl Relay {
    /// Reports an upstream's answer to account `account_id`, as classified (never a local
    /// refusal): `status` 0 when there was no answer; `refused` is the credential an
    /// unauthorized answer refused (only its fingerprint leaves the relay). `Some(token)`: the
    /// account's stored OAuth token is another one now (refreshed for this refusal or before
    /// it): retry on the same account with it.
    pub(super) async fn report(
        &self,
        account_id: i64,
        classified: &Classified,
        status: u16,
        reason: &str,
        refused: Option<&Secret>,
    ) -> Option<Secret> {
        let outcome = Outcome::observed(account_id, classified, status, reason, refused);
        match self.selection.report(outcome).await {
            Ok(Reported::Refreshed(fresh)) => Some(fresh),
            Ok(Reported::Applied(_)) => None,
            Err(error) => {
                tracing::debug!(account_id, %error, "outcome not applied");
                None
            }
        }
    }

    /// Records where the account stands in its usage windows, on a task of its own: the
    /// request never waits for it, and a reading lost on the way is reported again by the
    /// account's next answer.
    pub(super) fn record_windows(&self, account_id: i64, readings: Vec<WindowReading>) {
        let selection = self.selection.clone();
        tokio::spawn(async move {
            if let Err(error) = selection.record_windows(account_id, readings).await {
                tracing::debug!(account_id, %error, "usage windows not recorded");
            }
        });
    }

    /// Binds the session of client key `api_key_id` to the account that served it.
    pub(super) async fn bind_session(
        &self,
        api_key_id: i64,
        group: &str,
        session: &str,
        account_id: i64,
    ) {
        if let Err(error) = self
            .selection
            .bind_session(api_key_id, group, session, account_id)
            .await
        {
            tracing::debug!(%error, "session binding not written");
        }
    }

    /// Binds a response id for the client key it was made for.
    pub(super) async fn bind_response(&self, api_key_id: i64, response_id: &str, account_id: i64) {
        if let Err(error) = self
            .selection
            .bind_response(api_key_id, response_id, account_id)
            .await
        {
            tracing::debug!(%error, "response binding not written");
        }
    }
}
