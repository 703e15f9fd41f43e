//! What operators see, the same in both modes: the rows the read and repair verbs show, and the
//! JSON envelopes the standalone relay's admin endpoint answers with (the CLI's `--output json`
//! prints the same envelopes, whichever endpoint answered).

use serde::{Deserialize, Serialize};

/// An account as operators see it: the credential masked, never whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccountRow {
    pub id: i64,
    pub name: String,
    pub group: String,
    /// `anthropic` or `openai`.
    pub platform: String,
    /// `api_key`, `oauth` or `chatgpt_oauth`.
    pub credential_kind: String,
    pub credential_masked: String,
    /// `active`, `disabled`, `error` or `retired`.
    pub status: String,
    pub status_reason: String,
    /// Lower is tried first.
    #[serde(default)]
    pub priority: i32,
    /// Its relative share within its priority tier.
    #[serde(default)]
    pub weight: i32,
    /// Requests in flight at once; 0: no limit.
    #[serde(default)]
    pub concurrency_limit: i32,
    /// Requests per minute; 0: no limit.
    #[serde(default)]
    pub rpm_limit: i32,
    /// Spend per session window, USD; 0: no limit.
    #[serde(default)]
    pub session_window_limit_usd: f64,
}

/// One block on one account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockRow {
    pub account_id: i64,
    pub account_name: String,
    /// `hard`, `soft` or `breaker`.
    pub kind: String,
    /// The outcome class that caused it.
    pub class: String,
    /// The upstream's HTTP status (0 when none caused it).
    pub status: u16,
    pub reason: String,
    pub remaining_ms: u64,
}

/// One client key's usage over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageRow {
    pub api_key_id: i64,
    pub user: String,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
}

/// `accounts`: `{"accounts": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccountList {
    pub accounts: Vec<AccountRow>,
}

/// `blocks`: `{"blocks": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockList {
    pub blocks: Vec<BlockRow>,
}

/// `restore`: the account as it is now, `{"account": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Restored {
    pub account: AccountRow,
}

/// `clear-block`: `{"cleared": <account id>}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cleared {
    pub cleared: i64,
}

/// `usage`: every client key's usage (or one key's) between two instants, ms since the epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageReport {
    pub from_ms: i64,
    pub to_ms: i64,
    pub keys: Vec<UsageRow>,
}

/// An error answer: `{"error": {"type": ..., "message": ...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// `authentication_error`, `not_found`, `invalid_request` or `unavailable`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

impl ErrorBody {
    pub fn new(kind: &str, message: impl std::fmt::Display) -> Self {
        ErrorBody {
            error: ErrorDetail {
                kind: kind.to_owned(),
                message: message.to_string(),
            },
        }
    }
}
