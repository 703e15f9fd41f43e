//! What selection answers, as every transport carries it: a plan of accounts (each with what
//! the relay needs to call it), what an outcome report applied, and a usage record. The
//! selection engine builds them, `poolgate-proto` converts them to and from the wire, and the
//! relay reads them; one type each, written once.

use crate::AccountId;
use crate::account::{CredentialKind, Platform, Secret, Service};
use crate::price::{ModelPrice, PriceSource};
use crate::select::NoneReason;

/// One account of a plan, with everything needed to call it.
#[derive(Debug, Clone)]
pub struct PlannedAccount {
    pub id: AccountId,
    pub name: String,
    pub platform: Platform,
    pub base_url: String,
    pub credential: Secret,
    pub credential_kind: CredentialKind,
    /// The upstream model (after the account's model mapping).
    pub mapped_model: String,
    pub concurrency_limit: i32,
    pub rpm_limit: i32,
    pub session_window_limit_usd: f64,
    pub proxy_url: Option<String>,
    /// OpenAI chat streams: ask the upstream for usage when the client did not.
    pub stream_usage: bool,
    /// The mapped model's price and where it came from (docs/DESIGN.md §6, "Prices").
    pub price: ModelPrice,
    pub soft_blocked: bool,
    /// Live leases when known (`None`: unknown, never 0).
    pub inflight: Option<u32>,
    /// The account's group passes its usage-window headers on to clients.
    pub usage_headers_to_clients: bool,
}

/// What a request asks the selection API for: a plan of accounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanRequest {
    /// The caller's key: session and response bindings are the key's own.
    pub api_key_id: i64,
    pub group: String,
    pub platform: Platform,
    /// What the request is: only accounts that serve it are planned.
    pub service: Service,
    pub model: String,
    /// The request's session, as the client named it (the engine scopes it to the key).
    pub session_hash: Option<String>,
    pub previous_response_id: Option<String>,
    /// Accounts already tried.
    pub exclude: Vec<AccountId>,
    /// The request opens its conversation: its session is derived from its first turn (the
    /// client named none) and it has no later turn, so nothing is bound to it yet. A relay
    /// selecting at the edge asks the selector about no such session.
    pub opens_conversation: bool,
}

/// The accounts that may serve a request, in the order to try them.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub accounts: Vec<PlannedAccount>,
    /// The first account is the session's bound one.
    pub sticky: bool,
    /// Why the plan is empty.
    pub none_reason: Option<NoneReason>,
    /// When nothing is eligible because of blocks: ms until the earliest ends.
    pub retry_after_ms: u64,
    /// The request's `previous_response_id` is bound to another client key: refused (404), no
    /// account called.
    pub previous_response_other_key: bool,
    /// The group's subscription accounts serve only the platform's own CLI
    /// (`GroupSettings::subscriptions_cli_only`): the relay leaves them out of the plan for any
    /// other client's request.
    pub subscriptions_cli_only: bool,
    /// The group's rerank requests get the recall order when no account can rerank
    /// (`GroupSettings::rerank_passthrough`); set on every plan, empty ones included.
    pub rerank_passthrough: bool,
}

impl Plan {
    /// The plan for a group nobody configured: empty, nothing to serve it; not an outage. (The
    /// selector's gRPC API answers it as `NOT_FOUND`, as its proto documents; its client reads
    /// that back as this plan.)
    pub fn for_unknown_group() -> Plan {
        Plan {
            none_reason: Some(NoneReason::NoAccounts),
            ..Plan::default()
        }
    }
}

/// What an outcome report applied to the account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Effect {
    None,
    SoftBlock,
    HardBlock,
    BreakerOpen,
    BreakerClosed,
    /// The selector's probe decides; nothing counted yet.
    Confirming,
    Error,
    /// A refused OAuth token that is not the stored one (any more), or was refreshed for this
    /// refusal: retry on the same account with the fresh one; nothing counted.
    Refreshed,
}

impl Effect {
    /// Stable lowercase name: logs, metric labels, and the deprecated string field.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::None => "none",
            Effect::SoftBlock => "soft_block",
            Effect::HardBlock => "hard_block",
            Effect::BreakerOpen => "breaker_open",
            Effect::BreakerClosed => "breaker_closed",
            Effect::Confirming => "confirming",
            Effect::Error => "error",
            Effect::Refreshed => "refreshed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [
            Effect::None,
            Effect::SoftBlock,
            Effect::HardBlock,
            Effect::BreakerOpen,
            Effect::BreakerClosed,
            Effect::Confirming,
            Effect::Error,
            Effect::Refreshed,
        ]
        .into_iter()
        .find(|effect| effect.as_str() == text)
    }
}

/// One finished request, for the usage ledger.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageRecord {
    /// 0: no client key (an older caller).
    pub api_key_id: i64,
    pub user: String,
    /// 0: no account.
    pub account_id: AccountId,
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_write_tokens: u64,
    pub cache_read_tokens: u64,
    pub cost_usd: f64,
    /// Which price `cost_usd` was charged at; `None`: not said (an older relay).
    pub price_source: Option<PriceSource>,
    pub status: u16,
    pub latency_ms: u32,
    /// ms since the epoch; 0: now.
    pub at_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_effect_reads_back_from_its_name_and_nothing_else_does() {
        for effect in [
            Effect::None,
            Effect::SoftBlock,
            Effect::HardBlock,
            Effect::BreakerOpen,
            Effect::BreakerClosed,
            Effect::Confirming,
            Effect::Error,
            Effect::Refreshed,
        ] {
            assert_eq!(Effect::parse(effect.as_str()), Some(effect));
        }
        assert_eq!(Effect::parse("Refreshed"), None);
        assert_eq!(Effect::parse(""), None);
    }
}
