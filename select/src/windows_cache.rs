//! The usage-window readings a select orders by (docs/DESIGN.md §5), cached per account for one
//! load-cache period and, like the load readings, served stale for up to `stale_periods` periods
//! while one background read replaces them: a select finds its readings in memory and never
//! waits for Redis unless an account has no usable reading at all (never read, or older than
//! the stale bound, or dropped after this replica's own write). Readings are shared, not copied,
//! per select (`Arc<[WindowReading]>`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};

use poolgate_core::windows::WindowReading;
use poolgate_core::{AccountId, Clock};

use crate::health::HealthStore;
use crate::load_cache::LoadCacheSettings;

/// Above this many entries, an insert first drops those past the stale bound.
const PRUNE_AT: usize = 4096;

/// One account's readings, newest per window as the store keeps them.
pub type Readings = Arc<[WindowReading]>;

#[derive(Clone)]
pub struct WindowsCache {
    shared: Arc<Shared>,
}

struct Shared {
    health: Arc<dyn HealthStore>,
    clock: Clock,
    /// Younger than this: fresh.
    ttl: Duration,
    /// Younger than this: served, and read again in the background.
    stale_bound: Duration,
    entries: Mutex<HashMap<AccountId, (Instant, Readings)>>,
    /// Held across a read: concurrent misses share one, and one background read at a time.
    fetch: Arc<tokio::sync::Mutex<()>>,
}

/// What the cache holds for a select's accounts.
struct Lookup {
    known: HashMap<AccountId, Readings>,
    /// Served, but past the period: read again in the background.
    stale: Vec<AccountId>,
    /// No usable reading: read before the select goes on.
    missing: Vec<AccountId>,
}

impl WindowsCache {
    /// A cache over `health`; entries age on `clock`.
    pub fn new(health: Arc<dyn HealthStore>, settings: &LoadCacheSettings, clock: Clock) -> Self {
        WindowsCache {
            shared: Arc::new(Shared {
                health,
                clock,
                ttl: settings.cache_ttl,
                stale_bound: settings.stale_bound(),
                entries: Mutex::new(HashMap::new()),
                fetch: Arc::new(tokio::sync::Mutex::new(())),
            }),
        }
    }

    /// The readings of `ids`, or `None` when they could not be read (the select then orders
    /// every candidate as unknown).
    pub async fn read(&self, ids: &[AccountId]) -> Option<HashMap<AccountId, Readings>> {
        let shared = &self.shared;
        let mut lookup = shared.lookup(ids);
        if !lookup.missing.is_empty() {
            // The cache is checked again under the fetch lock: a read that finished meanwhile
            // answers this select too.
            let _fetch = shared.fetch.lock().await;
            lookup = shared.lookup(ids);
            if !lookup.missing.is_empty() {
                let mut wanted = std::mem::take(&mut lookup.missing);
                wanted.append(&mut lookup.stale);
                let read = shared.read_into_cache(&wanted).await?;
                lookup.known.extend(read);
            }
        }
        if !lookup.stale.is_empty() {
            self.refresh_in_background(lookup.stale);
        }
        Some(lookup.known)
    }

    /// Drops `account_id`'s readings: the next select reads them again (this replica's own
    /// write is read at its next select).
    pub fn forget(&self, account_id: AccountId) {
        self.shared
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&account_id);
    }

    /// One background read of `stale` unless a read is already running (its results land
    /// within a period either way).
    fn refresh_in_background(&self, stale: Vec<AccountId>) {
        let Ok(guard) = self.shared.fetch.clone().try_lock_owned() else {
            return;
        };
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let _fetch = guard;
            let lookup = shared.lookup(&stale);
            let mut wanted = lookup.stale;
            wanted.extend(lookup.missing);
            if !wanted.is_empty() {
                // A failed read keeps the stale readings until the stale bound; the next select
                // past it reads inline and orders as unknown if that fails too.
                let _ = shared.read_into_cache(&wanted).await;
            }
        });
    }
}

impl Shared {
    fn lookup(&self, ids: &[AccountId]) -> Lookup {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.clock.now();
        let mut lookup = Lookup {
            known: HashMap::with_capacity(ids.len()),
            stale: Vec::new(),
            missing: Vec::new(),
        };
        for id in ids {
            match entries.get(id) {
                Some((at, readings)) if now.saturating_duration_since(*at) < self.stale_bound => {
                    if now.saturating_duration_since(*at) >= self.ttl {
                        lookup.stale.push(*id);
                    }
                    lookup.known.insert(*id, readings.clone());
                }
                _ => lookup.missing.push(*id),
            }
        }
        lookup
    }

    /// Reads `ids` from the health store and caches what it answered.
    async fn read_into_cache(&self, ids: &[AccountId]) -> Option<HashMap<AccountId, Readings>> {
        match self.health.read_windows(ids).await {
            Ok(readings) if readings.len() == ids.len() => {
                let now = self.clock.now();
                let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
                if entries.len() > PRUNE_AT {
                    let bound = self.stale_bound;
                    entries.retain(|_, (at, _)| now.saturating_duration_since(*at) < bound);
                }
                let mut read = HashMap::with_capacity(ids.len());
                for (id, readings) in ids.iter().zip(readings) {
                    let readings: Readings = readings.into();
                    entries.insert(*id, (now, readings.clone()));
                    read.insert(*id, readings);
                }
                Some(read)
            }
            Ok(_) => {
                tracing::warn!(
                    "usage windows read answered for other accounts; ordered as unknown"
                );
                None
            }
            Err(error) => {
                tracing::debug!(%error, "usage windows not read; ordered as unknown");
                None
            }
        }
    }
}
