//! A relay's view of the pool (docs/DESIGN.md §2, "Selection at the edge"): what the selector
//! streams to a relay so it selects in its own process. The config of the groups the relay
//! serves, whole, when it changes; the accounts' states (health, usage windows) as they change.

use std::collections::HashMap;

use crate::AccountId;
use crate::account::{Account, ApiKeyRecord, GroupSettings, Price};
use crate::health::AccountHealth;
use crate::price::UnpricedPolicy;
use crate::windows::{Thresholds, WindowReading};

/// Most groups a relay may ask for.
pub const MAX_VIEW_GROUPS: usize = 1024;

/// The config of the groups a relay serves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ViewConfig {
    /// The groups asked for that exist.
    pub groups: Vec<String>,
    /// Their active accounts, with their access credentials (never a refresh token: `oauth`
    /// is `None`).
    pub accounts: Vec<Account>,
    /// The client keys of those groups by the SHA-256 of the key.
    pub keys: Vec<(Vec<u8>, ApiKeyRecord)>,
    /// The operator's prices by model.
    pub prices: HashMap<String, Price>,
    /// The groups that set something.
    pub settings: HashMap<String, GroupSettings>,
    /// The selector's deployment-wide settings a plan reads.
    pub deployment: Deployment,
}

/// The selector's own settings that decide a plan, so a relay plans as the selector would.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Deployment {
    /// What a model with no price costs (`--unpriced`).
    pub unpriced: UnpricedPolicy,
    /// The usage-window thresholds where a group sets none.
    pub windows: Thresholds,
    /// Accounts in a plan.
    pub plan_size: u32,
}

/// One account's state as the selector read it.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountState {
    pub account_id: AccountId,
    /// `None`: unreadable (plannable, as the selector plans it).
    pub health: Option<AccountHealth>,
    /// Its hard block is a running confirmation's.
    pub confirming: bool,
    pub windows: Vec<WindowReading>,
}

/// One update of the stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ViewUpdate {
    /// The whole config, when it changed (always in the first update).
    pub config: Option<ViewConfig>,
    /// The accounts whose state changed.
    pub states: Vec<AccountState>,
    /// How often the selector sends an update at least, ms.
    pub period_ms: u64,
}
