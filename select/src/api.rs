//! The selection API: what a relay (or any caller) asks of selection, in domain types. The
//! engine implements it ([`Selector`](crate::engine::Selector), `engine/api.rs`) and so does the
//! gRPC client (`poolgate-client`'s `SelectorClient`), so a caller holds an
//! `Arc<dyn SelectionApi>` and does not know which is behind it. Every decision is the engine's:
//! an unknown group's plan ([`Plan::for_unknown_group`]), a session's binding scope
//! ([`binding_key`](crate::engine::binding_key)), a key's verdict (`Selector::check_key`), what
//! an outcome applies (`Selector::report_outcome`); the client only carries them.

use async_trait::async_trait;
use poolgate_core::account::Platform;
use poolgate_core::api::ApiError;
use poolgate_core::caller::KeyCheck;
use poolgate_core::keys::KeyDescription;
use poolgate_core::outcome::Outcome;
use poolgate_core::windows::WindowReading;

pub use crate::engine::{Applied, Reported};
pub use poolgate_core::plan::{Plan, PlanRequest, UsageRecord};

#[async_trait]
pub trait SelectionApi: Send + Sync + 'static {
    /// Checks a client key: a caller, a key refused as a whole (disabled, expired: judged by
    /// the engine's clock), or unknown.
    async fn check_key(&self, api_key: &str) -> Result<KeyCheck, ApiError>;
    /// The key as its holder may see it (the self-service view): its record and its usage per
    /// period. A disabled or expired key is described too (its holder learns why it is
    /// refused); `Ok(None)`: unknown or revoked.
    async fn describe_key(&self, api_key: &str) -> Result<Option<KeyDescription>, ApiError>;
    /// The accounts to try for a request, in order. An unknown group is an empty plan
    /// ([`Plan::for_unknown_group`]), not an error.
    async fn plan(&self, request: &PlanRequest) -> Result<Plan, ApiError>;
    /// Applies an upstream outcome (never a local refusal; build it with
    /// [`Outcome::observed`]). `Reported::Refreshed(token)`: the refused OAuth token is not
    /// the stored one (any more): retry on the same account with this one. An implementation
    /// may send a success later, with others (it changes nothing the caller acts on).
    async fn report(&self, outcome: Outcome) -> Result<Reported, ApiError>;
    /// Binds the session `session` of client key `api_key_id` in `group` to the account that
    /// served it: sessions are the key's own.
    async fn bind_session(
        &self,
        api_key_id: i64,
        group: &str,
        session: &str,
        account_id: i64,
    ) -> Result<(), ApiError>;
    /// Binds a response id for the client key it was made for: only that key continues it.
    async fn bind_response(
        &self,
        api_key_id: i64,
        response_id: &str,
        account_id: i64,
    ) -> Result<(), ApiError>;
    /// Stores usage records. `ApiError::Invalid`: the batch is refused as it is (a retry would
    /// be refused again); any other error may be retried.
    async fn record_usage(&self, records: Vec<UsageRecord>) -> Result<(), ApiError>;
    /// Records where the account stands in its usage windows, as an upstream answer reported
    /// (docs/DESIGN.md §5). An implementation may send them later, merged with the next.
    async fn record_windows(
        &self,
        account_id: i64,
        readings: Vec<WindowReading>,
    ) -> Result<(), ApiError>;
    /// Models the group's accounts of `platform` name (allow-lists and mapping keys), for
    /// `/v1/models`. Empty when the group is unknown.
    async fn models(&self, group: &str, platform: Platform) -> Result<Vec<String>, ApiError>;
}
