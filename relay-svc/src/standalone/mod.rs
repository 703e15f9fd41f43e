//! `relay-svc --standalone`: the whole pool in one process, no Redis, no Postgres. The selector
//! engine and the admission engine run here, each on its memory store, wired as the services
//! wire them: the same selection, outcomes, confirmation probe, breaker, bindings and token
//! refresh as a distributed deployment. Accounts and client keys come from a YAML file; what
//! must survive a restart (refreshed OAuth tokens, retirements, the usage ledger, the usage
//! windows' readings) goes to a state file. Client keys' budget counters live in the memory
//! admission engine and are rebuilt from the state file's usage ledger at start (docs/DESIGN.md
//! §4, "Client key limits"), so a restart does not reset a budget.

mod config;

#[cfg(test)]
mod admin_tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use poolgate_core::lease::Settings;
use poolgate_lease::LeaseEngine;
use poolgate_lease::api::EngineLeases;
use poolgate_lease::calendar::Calendar;
use poolgate_operator::engine::EngineAdmin;
use poolgate_select::engine::BudgetRebuild;
use poolgate_select::engine::{Selector, SelectorParts, SelectorSettings};
use poolgate_select::health::InProcessHealth;
use poolgate_select::refresh::{RefreshSettings, TokenRefresher};
use poolgate_select::snapshot::SnapshotCell;
use poolgate_select::source::{MemorySource, StateFile};

pub use config::{AccountEntry, KeyEntry, OAuthEntry, PriceEntry, Prices, StandaloneFile};

use crate::metrics::Metrics;

/// How often due OAuth tokens are refreshed ahead of their expiry.
const REFRESH_EVERY: Duration = Duration::from_secs(60);

/// The in-process engines of a standalone relay: the selection engine (its background tasks
/// its own, stopped when it is dropped) and the lease engine, each the implementation of its
/// API the relay takes.
pub struct Standalone {
    pub selection: Arc<Selector>,
    pub leases: Arc<EngineLeases>,
    /// The admin API over the engine: the admin endpoint and the status page serve it.
    pub operator: Arc<EngineAdmin>,
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
    let budgets = Calendar::new(&admission.budget_time_zone, admission.budget_week_start)
        .map_err(|e| format!("budget calendar: {e}"))?;
    // One clock for every engine and store of the process (core/src/clock.rs): admission's
    // cooldowns and the health store's blocks end at the same instant.
    let clock = poolgate_core::Clock::system();
    let admission = poolgate_lease::in_memory(
        admission,
        poolgate_lease::metrics::Metrics::registered_in(metrics.registry.clone()),
        clock.clone(),
    );
    let source = Arc::new(
        MemorySource::new(
            file.snapshot()?,
            state_file.map(StateFile::new),
            clock.clone(),
        )
        .map_err(|e| e.to_string())?,
    );
    let snapshot = Arc::new(SnapshotCell::new(source.snapshot()));
    let in_process = Arc::new(InProcessHealth::new(admission.clone(), clock.clone()));
    // The readings saved before a restart are back before the first select; new ones reach the
    // file every few seconds and at shutdown, never on a request's path.
    source.keep_windows(in_process.clone());
    tokio::spawn(source.clone().write_periodically());
    let health: Arc<dyn poolgate_select::health::HealthStore> = in_process;
    let selector_metrics =
        poolgate_select::metrics::Metrics::registered_in(metrics.registry.clone());
    let mut usage_reads = settings.usage_reads.clone();
    if let Some(secs) = file.usage_read_every_secs {
        usage_reads.every = std::time::Duration::from_secs(secs);
    }
    let selector = Arc::new(Selector::new(SelectorParts {
        snapshot: snapshot.clone(),
        source: source.clone(),
        health: health.clone(),
        leases: admission.clone(),
        // Keys' usage per period in the calendar admission counts their budgets in.
        settings: SelectorSettings {
            budget_calendar: Arc::new(budgets),
            usage_reads,
            unpriced: file.unpriced_policy()?,
            ..settings
        },
        metrics: selector_metrics.clone(),
        clock: clock.clone(),
    }));
    let refresher = TokenRefresher::new(
        source.clone(),
        health,
        RefreshSettings::default(),
        selector_metrics,
        clock,
    )?;
    selector.set_refresher(refresher.clone());
    tokio::spawn(source.clone().reload_on_change(snapshot.clone()));
    // The engine's own tasks: refreshes, the status gauges, every OAuth account's usage
    // endpoint read at start (an account no request has touched is read, not guessed) and then
    // once per cadence, and the budget counters, which the memory engine starts without: each
    // is set from the ledger before any request can have finished (a request is charged when it
    // ends), and never again (memory is not flushed under a running relay).
    selector.start_tasks(
        refresher,
        REFRESH_EVERY,
        BudgetRebuild::Once(admission.clone()),
    );
    Ok(Standalone {
        selection: selector.clone(),
        leases: Arc::new(EngineLeases::new(admission.clone())),
        operator: Arc::new(EngineAdmin::new(selector, source.clone())),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use poolgate_core::lease::{DenyReason, KeyLimits, LeaseTerms};
    use poolgate_lease::AcquireOutcome;
    use poolgate_select::source::{AccountSource, UsageInput};
    use poolgate_testkit::{Scratch, eventually};
    use tokio_util::sync::CancellationToken;

    use super::*;

    const FILE: &str = "api_keys:\n  - {key: k1, budget_usd: {day: 1}}\naccounts:\n  - {name: a, \
                        platform: anthropic, base_url: \"http://127.0.0.1:9\", api_key: sk-x}\n";

    fn terms() -> LeaseTerms {
        LeaseTerms {
            account_id: 1,
            concurrency_limit: 5,
            rpm_limit: 0,
            user: None,
            session_hash: None,
            session_window_limit_micros: 0,
            session_bound: false,
            ignore_cooldown: false,
            key: Some(KeyLimits {
                api_key_id: 1,
                budget_day_micros: 1_000_000,
                ..KeyLimits::default()
            }),
        }
    }

    async fn acquire(standalone: &Standalone) -> AcquireOutcome {
        standalone
            .admission
            .acquire(&terms(), Duration::ZERO, &CancellationToken::new(), |_| {})
            .await
            .expect("memory answers")
    }

    #[tokio::test]
    async fn a_budget_spent_before_a_restart_is_still_spent_after_it() {
        let scratch = Scratch::new("budget-restart").expect("scratch");
        let state = scratch.path().join("state.json");
        let file = StandaloneFile::parse(FILE).expect("file");
        let start = || {
            build(
                &file,
                Some(&state),
                SelectorSettings::default(),
                Settings::default(),
                &Metrics::new(),
            )
            .expect("built")
        };
        let first = start();
        let AcquireOutcome::Granted(lease) = acquire(&first).await else {
            panic!("nothing spent yet: granted");
        };
        first.admission.release(&lease, Some(&terms()), 0).await;
        // The ledger holds 1.5 USD of today's spend (the budget is 1 USD a day), in the file.
        first
            .source
            .insert_usage(&[UsageInput {
                api_key_id: Some(1),
                user: "default".into(),
                account_id: Some(1),
                model: "claude-sonnet-4-5".into(),
                input_tokens: 1,
                output_tokens: 1,
                cache_write_tokens: 0,
                cache_read_tokens: 0,
                cost_usd: 1.5,
                price_source: None,
                status: 200,
                latency_ms: 1,
                at_ms: Some(poolgate_core::now_ms()),
            }])
            .await
            .expect("recorded");
        first.source.flush().await.expect("written");
        drop(first);

        // A new process: a fresh memory engine, the same state file.
        let second = start();
        eventually(Duration::from_secs(5), || async {
            match acquire(&second).await {
                AcquireOutcome::Denied(denial) if denial.reason == DenyReason::KeyBudget => {
                    Some(())
                }
                // Freed at no cost, so only the ledger's spend can refuse the key.
                AcquireOutcome::Granted(lease) => {
                    second.admission.release(&lease, Some(&terms()), 0).await;
                    None
                }
                _ => None,
            }
        })
        .await
        .expect("the day's budget is still spent after the restart");
    }
}
