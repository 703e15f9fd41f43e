//! The load cache (docs/DESIGN.md §5, seed 001): live lease counts, blocks and breakers of a
//! candidate set, read from the health store (Redis) at most once per candidate set per cache
//! period, however many selects ask.
//!
//! - pipelined reads in batches of 50 accounts, one round trip per batch;
//! - results cached 200 ms per candidate-set fingerprint;
//! - concurrent misses for one set coalesced into one fetch (singleflight);
//! - at most 2 fetches in flight per replica (semaphore), each detached from its callers (a
//!   caller that goes away does not cancel it) and bounded by a timeout;
//! - a failed batch falls back to per-account reads, and an unreadable account is *unknown*
//!   (`None`), never 0;
//! - a fresh read (bypassing the cache) for confirming "nothing eligible" coalesces the same way.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OnceCell, Semaphore};
use tokio::time::Instant;

use crate::health::{AccountHealth, Health};
use poolgate_core::AccountId;

#[derive(Debug, Clone)]
pub struct LoadCacheSettings {
    pub cache_ttl: Duration,
    pub batch_size: usize,
    pub max_fetches: usize,
    pub fetch_timeout: Duration,
}

impl Default for LoadCacheSettings {
    fn default() -> Self {
        LoadCacheSettings {
            cache_ttl: Duration::from_millis(200),
            batch_size: 50,
            max_fetches: 2,
            fetch_timeout: Duration::from_millis(500),
        }
    }
}

/// One read of a candidate set: health per account, `None` when unreadable.
#[derive(Debug)]
pub struct Reading {
    ids: Vec<AccountId>,
    health: Vec<Option<AccountHealth>>,
}

impl Reading {
    pub fn get(&self, id: AccountId) -> Option<AccountHealth> {
        self.ids
            .binary_search(&id)
            .ok()
            .and_then(|index| self.health[index])
    }
}

type Flight = Arc<OnceCell<Arc<Reading>>>;

pub struct LoadCache {
    health: Arc<dyn Health>,
    settings: LoadCacheSettings,
    cache: Mutex<HashMap<u64, (Instant, Arc<Reading>)>>,
    flights: Mutex<HashMap<u64, Flight>>,
    permits: Arc<Semaphore>,
    /// The latest reading of each account, whatever set it was read with.
    latest: Mutex<HashMap<AccountId, (Instant, AccountHealth)>>,
    /// selector_active_blocks{kind}: accounts blocked in the latest readings.
    active_blocks: Option<prometheus::IntGaugeVec>,
}

fn fingerprint(ids: &[AccountId]) -> u64 {
    let mut hasher = DefaultHasher::new();
    ids.hash(&mut hasher);
    hasher.finish()
}

impl LoadCache {
    pub fn new(health: Arc<dyn Health>, settings: LoadCacheSettings) -> Self {
        LoadCache {
            health,
            permits: Arc::new(Semaphore::new(settings.max_fetches.max(1))),
            settings,
            cache: Mutex::new(HashMap::new()),
            flights: Mutex::new(HashMap::new()),
            latest: Mutex::new(HashMap::new()),
            active_blocks: None,
        }
    }

    /// Keeps `selector_active_blocks{kind}` (hard, soft, breaker) up to date from the readings.
    pub fn with_active_blocks_gauge(mut self, gauge: prometheus::IntGaugeVec) -> Self {
        self.active_blocks = Some(gauge);
        self
    }

    /// Forgets every cached reading (an operator just cleared blocks on this replica; the others
    /// see it when their readings age out, within the cache period).
    pub fn invalidate(&self) {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// The latest health read of one account, if it is at most `max_age` old.
    pub fn latest(&self, id: AccountId, max_age: Duration) -> Option<AccountHealth> {
        let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        latest
            .get(&id)
            .filter(|(at, _)| at.elapsed() <= max_age)
            .map(|(_, health)| *health)
    }

    /// Notes a change this replica made (so its own next decision sees it without a read).
    pub fn note(&self, id: AccountId, change: impl FnOnce(&mut AccountHealth)) {
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, health)) = latest.get_mut(&id) {
            change(health);
        }
    }

    /// Health of `ids` (any order, duplicates allowed), from the cache unless `fresh`.
    pub async fn read(&self, ids: &[AccountId], fresh: bool) -> Arc<Reading> {
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let key = fingerprint(&sorted);
        if !fresh {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, reading)) = cache.get(&key)
                && at.elapsed() < self.settings.cache_ttl
            {
                return reading.clone();
            }
        }
        let flight = {
            let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            flights.entry(key).or_default().clone()
        };
        let previous = {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.get(&key).map(|(_, reading)| reading.clone())
        };
        let reading = flight
            .get_or_init(|| async {
                let fetch = tokio::spawn(fetch(
                    self.health.clone(),
                    sorted.clone(),
                    self.settings.clone(),
                    self.permits.clone(),
                ));
                let mut health =
                    match tokio::time::timeout(self.settings.fetch_timeout, fetch).await {
                        Ok(Ok(health)) => health,
                        // Timed out (the fetch goes on, detached, and is dropped) or failed: unknown.
                        _ => vec![None; sorted.len()],
                    };
                // Redis unreadable as a whole (an outage, not one bad account): keep the last known
                // blocks and breakers rather than forgetting them; the load is unknown, never 0.
                if health.iter().all(Option::is_none)
                    && let Some(previous) = &previous
                {
                    for (value, id) in health.iter_mut().zip(&sorted) {
                        *value = previous.get(*id).map(|known| AccountHealth {
                            inflight: None,
                            ..known
                        });
                    }
                }
                Arc::new(Reading {
                    ids: sorted.clone(),
                    health,
                })
            })
            .await
            .clone();
        {
            let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            if flights.get(&key).is_some_and(|f| Arc::ptr_eq(f, &flight)) {
                flights.remove(&key);
            }
        }
        {
            let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            for (id, health) in reading.ids.iter().zip(&reading.health) {
                if let Some(health) = health.filter(|h| h.inflight.is_some()) {
                    latest.insert(*id, (now, health));
                }
            }
            if let Some(gauge) = &self.active_blocks {
                let (mut hard, mut soft, mut breaker) = (0, 0, 0);
                for (_, health) in latest.values() {
                    hard += i64::from(health.hard_block_ms > 0);
                    soft += i64::from(health.soft_block_ms > 0);
                    breaker += i64::from(matches!(health.breaker, crate::health::Breaker::Open(_)));
                }
                gauge.with_label_values(&["hard"]).set(hard);
                gauge.with_label_values(&["soft"]).set(soft);
                gauge.with_label_values(&["breaker"]).set(breaker);
            }
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() > 10_000 {
            let ttl = self.settings.cache_ttl;
            cache.retain(|_, (at, _)| at.elapsed() < ttl);
        }
        cache.insert(key, (Instant::now(), reading.clone()));
        reading
    }
}

/// One fetch: batches of `batch_size` accounts, one pipeline each, run concurrently; a failed
/// batch is retried account by account.
async fn fetch(
    health: Arc<dyn Health>,
    ids: Vec<AccountId>,
    settings: LoadCacheSettings,
    permits: Arc<Semaphore>,
) -> Vec<Option<AccountHealth>> {
    let Ok(_permit) = permits.acquire_owned().await else {
        return vec![None; ids.len()];
    };
    let batches = ids.chunks(settings.batch_size.max(1)).map(|batch| {
        let health = health.clone();
        async move {
            match health.read_batch(batch).await {
                Ok(values) => values.into_iter().map(Some).collect::<Vec<_>>(),
                Err(error) => {
                    tracing::debug!(%error, accounts = batch.len(), "load batch failed; reading accounts one by one");
                    let singles = batch.iter().map(|&id| {
                        let health = health.clone();
                        async move { health.read_one(id).await.ok() }
                    });
                    futures_util::future::join_all(singles).await
                }
            }
        }
    });
    futures_util::future::join_all(batches)
        .await
        .into_iter()
        .flatten()
        .collect()
}
