//! The one constructor of the lease engine: the backend from config, and the background tasks
//! every embedder needs (release retries; on Redis, the replica registry heartbeat that also
//! probes Redis while degraded, and the subscription that wakes waiters when another replica
//! frees a slot). admission-svc, the selector's probe and the relay's standalone
//! mode all build their engine here, so none runs without its release retries.

use std::sync::{Arc, Weak};
use std::time::Duration;

use poolgate_core::Clock;
use poolgate_core::lease::Settings;
use poolgate_runtime::error::StateError;
use poolgate_runtime::redis::{RedisHandle, RedisOptions, RedisTarget};

use crate::backend::LeaseBackend;
use crate::engine::LeaseEngine;
use crate::memory::MemoryBackend;
use crate::metrics::Metrics;
use crate::policy::{PolicyBackend, PolicySettings};
use crate::redis_backend::{RedisBackend, wake};

/// How often releases the backend did not take are tried again.
pub const RELEASE_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Where lease state lives.
#[derive(Clone)]
pub enum LeaseStore {
    /// One process, no Redis: the embedded default.
    Memory,
    /// An admission replica on Redis, behind the failure policy, registered in the replica
    /// registry.
    Redis {
        target: RedisTarget,
        options: RedisOptions,
        policy: PolicySettings,
    },
    /// A process that takes leases on the admission replicas' Redis without being one of them
    /// (the selector's probe): the same scripts, no failure policy and no registry entry, so it
    /// never changes `divided`'s shares. While Redis is away its acquires fail and its releases
    /// are retried.
    SharedRedis(RedisHandle),
}

impl std::fmt::Debug for LeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseStore::Memory => f.write_str("Memory"),
            LeaseStore::Redis { target, policy, .. } => f
                .debug_struct("Redis")
                .field("target", target)
                .field("policy", policy)
                .finish_non_exhaustive(),
            LeaseStore::SharedRedis(_) => f.write_str("SharedRedis"),
        }
    }
}

/// Builds the engine on `store`, running on `clock` (production: `Clock::system()`), and starts
/// its background tasks. They end when the engine is dropped. Call inside a Tokio runtime.
pub async fn start(
    store: &LeaseStore,
    settings: Settings,
    metrics: Metrics,
    clock: Clock,
) -> Result<Arc<LeaseEngine>, StateError> {
    let engine = match store {
        LeaseStore::Memory => {
            let backend: Arc<dyn LeaseBackend> = Arc::new(MemoryBackend::new(clock.clone()));
            LeaseEngine::new(backend, settings, metrics, clock)
        }
        LeaseStore::SharedRedis(handle) => {
            let backend: Arc<dyn LeaseBackend> = Arc::new(RedisBackend::new(handle.clone()));
            LeaseEngine::new(backend, settings, metrics, clock)
        }
        LeaseStore::Redis {
            target,
            options,
            policy,
        } => {
            let handle =
                RedisHandle::connect(target, options, metrics.redis_round_trips.clone()).await?;
            // After Redis lost state, every replica notices within a registry interval (its own
            // entry is gone) and puts its holders' leases back: three intervals cover both. At
            // least 2 s: the selector notices a wipe within a second and rebuilds the budget
            // counters before any new acquire is admitted against them.
            let recount = (3 * policy.registry_interval).max(std::time::Duration::from_secs(2));
            let redis = RedisBackend::new(handle).with_recount(recount);
            let wake_tag = redis.wake_tag().to_owned();
            let backend = PolicyBackend::new(
                redis,
                policy.clone(),
                settings.rpm_window,
                metrics.clone(),
                clock.clone(),
            );
            // The first heartbeat registers this replica before it serves.
            backend.tick().await;
            tokio::spawn(registry_loop(
                Arc::downgrade(&backend),
                policy.registry_interval,
            ));
            let engine = LeaseEngine::with_policy(backend, settings, metrics, clock);
            tokio::spawn(wake::listen(
                Arc::downgrade(&engine),
                target.clone(),
                wake_tag,
                options.timeout,
            ));
            engine
        }
    };
    tokio::spawn(retry_releases(Arc::downgrade(&engine)));
    Ok(engine)
}

/// An engine on the memory backend (one process, nothing shared) running on `clock`, with its
/// release-retry task. Call inside a Tokio runtime.
pub fn in_memory(settings: Settings, metrics: Metrics, clock: Clock) -> Arc<LeaseEngine> {
    let backend: Arc<dyn LeaseBackend> = Arc::new(MemoryBackend::new(clock.clone()));
    let engine = LeaseEngine::new(backend, settings, metrics, clock);
    tokio::spawn(retry_releases(Arc::downgrade(&engine)));
    engine
}

/// Heartbeats into the replica registry (and probes Redis while degraded) until the backend is
/// dropped.
async fn registry_loop(backend: Weak<PolicyBackend>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(backend) = backend.upgrade() else {
            return;
        };
        backend.tick().await;
    }
}

/// Retries releases the backend did not take (Redis blipped) until they land, for as long as
/// the engine lives.
async fn retry_releases(engine: Weak<LeaseEngine>) {
    let mut tick = tokio::time::interval(RELEASE_RETRY_INTERVAL);
    loop {
        tick.tick().await;
        let Some(engine) = engine.upgrade() else {
            return;
        };
        engine.retry_pending_releases().await;
    }
}
