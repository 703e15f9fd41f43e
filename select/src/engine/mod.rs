//! The selector engine: plans (select), outcomes ("busy is not broken"), bindings, and
//! authentication, over a config snapshot from an account source (Postgres, or the standalone
//! relay's file) and a health store (Redis shared by every replica, or memory in one process).
//! Transport-free: `grpc.rs` calls it, and the standalone relay calls it directly.
//!
//! This file builds the engine from its parts and holds its error; the rest is by job:
//! `select.rs` (plans: candidates, load reads, ordering, half-open checks), `report.rs`
//! (outcomes, and the bounded wait of an OAuth refusal), `bindings.rs` (sticky sessions and
//! response bindings), `admin.rs` (client-key checks and the operator's reads and actions),
//! `windows.rs` (the usage windows' intake), `usage_reads.rs` (the OAuth accounts' usage
//! endpoints read at start and once per cadence), `status.rs` (the pool's status gauges, every few
//! seconds).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use poolgate_runtime::ports::ProbeLeases;

use crate::confirmations::Confirmations;
use crate::health::HealthStore;
use crate::load_cache::{LoadCache, LoadCacheSettings};
use crate::metrics::Metrics;
use crate::probe::ProbeSettings;
use crate::snapshot::SnapshotCell;
use crate::source::budgets::{BudgetCalendar, UtcCalendar};
use crate::source::{AccountSource, StoreError};
use crate::windows_cache::WindowsCache;
use poolgate_core::Clock;
use poolgate_core::outcome::RuntimeBlockSettings;
use poolgate_core::price::UnpricedPolicy;
use poolgate_core::windows::Thresholds;

mod admin;
mod api;
mod bindings;
mod keys;
mod report;
mod select;
mod status;
mod tasks;
mod usage;
mod usage_reads;
mod view;
mod windows;

pub use admin::KeyVerdict;
pub use bindings::{binding_key, scoped_response};
pub use poolgate_core::plan::{Plan, PlannedAccount};
pub(crate) use report::apply_broken;
pub use report::{Applied, Reported};
pub use select::SelectQuery;
pub use status::{GroupStatus, STATUS_GAUGES_EVERY};
pub use tasks::BudgetRebuild;
pub use usage::{MAX_MODEL_BYTES, MAX_USAGE_RECORDS};
pub use usage_reads::UsageReadSettings;
pub use view::{PoolState, ViewFilter};
pub use windows::MAX_WINDOW_READINGS;

#[derive(Debug, Clone, thiserror::Error)]
pub enum SelectorError {
    #[error("invalid {field}: {message}")]
    InvalidArgument { field: String, message: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Conflict(String),
    #[error("backend unavailable: {0}")]
    Unavailable(String),
}

impl SelectorError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        SelectorError::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<StoreError> for SelectorError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound(what) => SelectorError::NotFound(what),
            StoreError::Conflict(what) => SelectorError::Conflict(what),
            StoreError::Invalid { field, message } => {
                SelectorError::InvalidArgument { field, message }
            }
            other => SelectorError::Unavailable(other.to_string()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SelectorSettings {
    pub blocks: RuntimeBlockSettings,
    pub load_cache: LoadCacheSettings,
    /// Plan length when the request does not say.
    pub plan_size: usize,
    pub sticky_ttl: Duration,
    pub response_ttl: Duration,
    /// The confirmation probe (billing-class answers, half-open breakers).
    pub probe: ProbeSettings,
    /// Where an account's usage windows shed it (docs/DESIGN.md §5).
    pub windows: Thresholds,
    /// How often OAuth accounts' usage endpoints are read (`usage_reads.rs`).
    pub usage_reads: UsageReadSettings,
    /// The deployment's budget calendar (time zone, week start), which a key's usage per
    /// period is summed in (`describe_key`, `key_usage`), as admission counts its budgets.
    /// Default: UTC, weeks from Monday.
    pub budget_calendar: Arc<dyn BudgetCalendar>,
    /// What a model with neither an operator's nor a catalogue price costs (docs/DESIGN.md §6,
    /// "Prices"): its family's highest catalogue price (default), or none (refused to a key
    /// with a budget).
    pub unpriced: UnpricedPolicy,
}

impl Default for SelectorSettings {
    fn default() -> Self {
        SelectorSettings {
            blocks: RuntimeBlockSettings::default(),
            load_cache: LoadCacheSettings::default(),
            plan_size: 4,
            sticky_ttl: Duration::from_secs(3600),
            response_ttl: Duration::from_secs(3600),
            probe: ProbeSettings::default(),
            windows: Thresholds::default(),
            usage_reads: UsageReadSettings::default(),
            budget_calendar: Arc::new(UtcCalendar),
            unpriced: UnpricedPolicy::default(),
        }
    }
}

/// What an engine is built from.
pub struct SelectorParts {
    /// The snapshot served from; whoever builds the engine keeps it current (a reload loop).
    pub snapshot: Arc<SnapshotCell>,
    pub source: Arc<dyn AccountSource>,
    pub health: Arc<dyn HealthStore>,
    /// Where the confirmation probe takes its lease: the lease engine the relays' leases use
    /// (wired by the composition root), so the probe counts against the account like any
    /// request.
    pub leases: Arc<dyn ProbeLeases>,
    pub settings: SelectorSettings,
    pub metrics: Metrics,
    /// The process's clock (production: `Clock::system()`), shared with the memory health
    /// store and the lease engine where they run in the same process.
    pub clock: Clock,
}

pub struct Selector {
    snapshot: Arc<SnapshotCell>,
    source: Arc<dyn AccountSource>,
    health: Arc<dyn HealthStore>,
    load_cache: LoadCache,
    settings: SelectorSettings,
    sticky_cache: Mutex<HashMap<(String, String), bindings::StickyEntry>>,
    /// Usage-window readings per account, read at most once per load-cache period.
    windows_cache: WindowsCache,
    /// When each group's window gauges were last set.
    window_gauges_at: Mutex<HashMap<String, std::time::Instant>>,
    /// The groups the status gauges were last set for (`status.rs`): a group gone from the
    /// config loses its series.
    status_groups: Mutex<HashSet<String>>,
    metrics: Metrics,
    /// The confirmation probe holds a lease from it like any request.
    admission: Arc<dyn ProbeLeases>,
    probe_http: reqwest::Client,
    /// Suspicious outcomes become writes only through these (`confirmations.rs`).
    confirmations: Confirmations,
    /// Every time the engine reads: key expiries, upstream resets, cache and binding ages.
    clock: Clock,
    /// The background tasks `start_tasks` started (`tasks.rs`): the engine owns them, and
    /// stops them when it is dropped or `stop_tasks` is called.
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The relays' view publisher, started by the first relay that watches (`view.rs`).
    view_hub: std::sync::OnceLock<tokio::sync::watch::Receiver<Arc<view::PoolState>>>,
    /// Wakes the publisher after a write a plan must see at once.
    view_notify: Arc<tokio::sync::Notify>,
}

impl Selector {
    pub fn new(parts: SelectorParts) -> Self {
        let SelectorParts {
            snapshot,
            source,
            health,
            leases: admission,
            settings,
            metrics,
            clock,
        } = parts;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let probe_http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        let confirmations = Confirmations {
            admission: admission.clone(),
            http: probe_http.clone(),
            health: health.clone(),
            source: source.clone(),
            metrics: metrics.clone(),
            probe: settings.probe.clone(),
            blocks: settings.blocks.clone(),
            refresher: Arc::new(std::sync::OnceLock::new()),
            ended: Arc::new(tokio::sync::Notify::new()),
            clock: clock.clone(),
        };
        Selector {
            admission,
            probe_http,
            confirmations,
            windows_cache: WindowsCache::new(health.clone(), &settings.load_cache, clock.clone()),
            load_cache: LoadCache::new(health.clone(), settings.load_cache.clone(), clock.clone())
                .with_active_blocks_gauge(metrics.active_blocks.clone()),
            clock,
            snapshot,
            source,
            health,
            settings,
            sticky_cache: Mutex::new(HashMap::new()),
            window_gauges_at: Mutex::new(HashMap::new()),
            status_groups: Mutex::new(HashSet::new()),
            metrics,
            tasks: Mutex::new(Vec::new()),
            view_hub: std::sync::OnceLock::new(),
            view_notify: Arc::new(tokio::sync::Notify::new()),
        }
    }

    pub fn snapshot(&self) -> &Arc<SnapshotCell> {
        &self.snapshot
    }

    pub fn source(&self) -> &Arc<dyn AccountSource> {
        &self.source
    }

    pub fn health(&self) -> &Arc<dyn HealthStore> {
        &self.health
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The clock the engine runs on.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Hands the engine the token refresher (once).
    pub fn set_refresher(&self, refresher: crate::refresh::TokenRefresher) {
        let _ = self.confirmations.refresher.set(refresher);
    }
}
