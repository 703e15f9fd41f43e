//! `relay-svc --standalone`: the whole pool in one process, no Redis, no Postgres. The selector
//! engine and the admission engine run here, each on its memory store, wired as the services
//! wire them: the same selection, outcomes, confirmation probe, breaker, bindings and token
//! refresh as a distributed deployment. Accounts and client keys come from a YAML file; what
//! must survive a restart (refreshed OAuth tokens, retirements, the usage ledger, the usage
//! windows' readings) goes to a state file.

mod config;
mod leases;
mod operator;
mod selection;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::lease::Settings;
use poolgate_lease::LeaseEngine;
use poolgate_select::engine::{Selector, SelectorError, SelectorParts, SelectorSettings};
use poolgate_select::health::InProcessHealth;
use poolgate_select::refresh::{RefreshSettings, TokenRefresher, refresh_loop};
use poolgate_select::snapshot::SnapshotCell;
use poolgate_select::source::{MemorySource, StateFile};

pub use config::{AccountEntry, KeyEntry, OAuthEntry, PriceEntry, Prices, StandaloneFile};
pub use leases::LocalLeases;
pub use selection::InProcessSelection;

use crate::admin::Operator;
use crate::metrics::Metrics;
use crate::ports::UsageRecord;
use crate::usage_sink::{SinkSettings, UsageSink, UsageWriter, WriteError};

/// How often due OAuth tokens are refreshed ahead of their expiry.
const REFRESH_EVERY: Duration = Duration::from_secs(60);

/// The in-process engines of a standalone relay.
pub struct Standalone {
    pub selection: Arc<InProcessSelection>,
    pub leases: Arc<LocalLeases>,
    pub operator: Arc<dyn Operator>,
    pub source: Arc<MemorySource>,
    pub admission: Arc<LeaseEngine>,
}

/// Builds the engines over `file` (and `state_file`'s saved state). Call inside a Tokio
/// runtime: the reload, refresh and usage tasks start here.
pub fn build(
    file: &StandaloneFile,
    state_file: Option<&Path>,
    settings: SelectorSettings,
    admission: Settings,
    metrics: &Metrics,
) -> Result<Standalone, String> {
    let admission = LocalLeases::engine(admission, &metrics.registry);
    let source = Arc::new(
        MemorySource::new(file.snapshot()?, state_file.map(StateFile::new))
            .map_err(|e| e.to_string())?,
    );
    let snapshot = Arc::new(SnapshotCell::new(source.snapshot()));
    let in_process = Arc::new(InProcessHealth::new(admission.clone()));
    // The readings saved before a restart are back before the first select; new ones reach the
    // file every few seconds and at shutdown, never on a request's path.
    source.keep_windows(in_process.clone());
    tokio::spawn(source.clone().write_periodically());
    let health: Arc<dyn poolgate_select::health::HealthStore> = in_process;
    let selector_metrics =
        poolgate_select::metrics::Metrics::registered_in(metrics.registry.clone());
    let selector = Arc::new(Selector::new(SelectorParts {
        snapshot: snapshot.clone(),
        source: source.clone(),
        health: health.clone(),
        leases: admission.clone(),
        settings,
        metrics: selector_metrics.clone(),
    }));
    let refresher = TokenRefresher::new(
        source.clone(),
        health,
        RefreshSettings::default(),
        selector_metrics,
    )?;
    selector.set_refresher(refresher.clone());
    tokio::spawn(source.clone().reload_on_change(snapshot.clone()));
    tokio::spawn(refresh_loop(
        refresher,
        Arc::downgrade(&selector),
        REFRESH_EVERY,
    ));
    let usage = UsageSink::start(
        EngineUsage(selector.clone()),
        metrics.usage_lost.clone(),
        SinkSettings::default(),
    );
    Ok(Standalone {
        selection: Arc::new(InProcessSelection::new(selector.clone(), usage)),
        leases: Arc::new(LocalLeases::new(admission.clone())),
        operator: Arc::new(operator::EngineOperator::new(selector, source.clone())),
        source,
        admission,
    })
}

/// Where the state file goes when `--state-file` is not given: beside the config
/// (`<name>.state.json`), when that directory is writable. `None`: nothing survives a restart.
pub fn default_state_file(config: &Path) -> Option<PathBuf> {
    let directory = match config.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let stem = config.file_stem()?.to_string_lossy().into_owned();
    let writable = std::fs::metadata(&directory)
        .map(|m| m.is_dir() && !m.permissions().readonly())
        .unwrap_or(false)
        && tempfile_probe(&directory);
    writable.then(|| directory.join(format!("{stem}.state.json")))
}

/// Whether a file can be created in `directory` (permission bits do not tell for root or
/// read-only mounts).
fn tempfile_probe(directory: &Path) -> bool {
    let probe = directory.join(format!(".poolgate-write-test-{}", std::process::id()));
    let created = std::fs::File::create(&probe).is_ok();
    let _ = std::fs::remove_file(&probe);
    created
}

/// The selection engine's usage intake (over the memory source's ledger), as the usage sink's
/// writer.
struct EngineUsage(Arc<Selector>);

#[async_trait]
impl UsageWriter for EngineUsage {
    async fn write(&self, records: Vec<UsageRecord>) -> Result<(), WriteError> {
        match self.0.record_usage(records).await {
            Ok(_) => Ok(()),
            Err(error @ SelectorError::InvalidArgument { .. }) => {
                tracing::warn!(%error, "the engine refused a usage batch");
                Err(WriteError::Refused)
            }
            // Kept in memory; the next write carries it to the file again.
            Err(error) => {
                tracing::warn!(%error, "usage kept in memory only");
                Ok(())
            }
        }
    }
}
