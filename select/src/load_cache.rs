//! The load cache (docs/DESIGN.md §5): live lease counts, blocks and breakers of a
//! candidate set, read from the health store (Redis) at most once per candidate set per cache
//! period, however many selects ask.
//!
//! - pipelined reads in batches of 50 accounts, one round trip per batch;
//! - results cached 200 ms per candidate-set fingerprint;
//! - stale-while-revalidate: a reading past its period but younger than
//!   `stale_periods` periods (3: 600 ms) is served at once while one background fetch replaces
//!   it, so no select waits for Redis on a warm set; older, or invalidated, a select waits for
//!   the fetch as on a miss. A block or breaker this replica writes (`wrote`) keeps the readings
//!   of the accounts it touched from being served stale: this replica waits for the next read,
//!   as before; the others see it within the bound (600 ms plus one fetch, under the 1 s a block
//!   has to reach every relay);
//! - concurrent misses for one set coalesced into one fetch (singleflight), which a stale serve
//!   joins too: one fetch per set at a time;
//! - at most 2 fetches in flight per replica (semaphore), each detached from its callers (a
//!   caller that goes away does not cancel it) and bounded by a timeout;
//! - a failed batch falls back to per-account reads, and an unreadable account is *unknown*
//!   (`None`), never 0; Redis unreadable as a whole keeps the last known blocks and breakers;
//! - a fresh read (bypassing the cache) for confirming "nothing eligible" coalesces the same way.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use std::time::Instant;
use tokio::sync::{Semaphore, watch};

use crate::health::{AccountHealth, Health};
use poolgate_core::{AccountId, Clock};

/// Past this many cached sets, the ones too old to serve are dropped on the next insert.
const CACHE_PRUNE_AT: usize = 10_000;

#[derive(Debug, Clone)]
pub struct LoadCacheSettings {
    pub cache_ttl: Duration,
    /// A reading older than `cache_ttl` but younger than this many periods is served while one
    /// fetch replaces it; 0 or 1: never served stale. Keep `cache_ttl × stale_periods` well under
    /// the 1 s in which a block has to reach every relay.
    pub stale_periods: u32,
    pub batch_size: usize,
    pub max_fetches: usize,
    pub fetch_timeout: Duration,
}

impl Default for LoadCacheSettings {
    fn default() -> Self {
        LoadCacheSettings {
            cache_ttl: Duration::from_millis(200),
            stale_periods: 3,
            batch_size: 50,
            max_fetches: 2,
            fetch_timeout: Duration::from_millis(500),
        }
    }
}

impl LoadCacheSettings {
    /// The age past which a reading is never served: the select waits for the fetch.
    pub fn stale_bound(&self) -> Duration {
        self.cache_ttl.saturating_mul(self.stale_periods.max(1))
    }
}

/// One read of a candidate set: health per account, `None` when unreadable.
#[derive(Debug)]
pub struct Reading {
    ids: Vec<AccountId>,
    health: Vec<Option<AccountHealth>>,
    /// When the fetch that made it started: a write after this may be missing from it.
    started: Instant,
}

impl Reading {
    pub fn get(&self, id: AccountId) -> Option<AccountHealth> {
        self.index(id).and_then(|index| self.health[index])
    }

    fn index(&self, id: AccountId) -> Option<usize> {
        self.ids.binary_search(&id).ok()
    }
}

/// A cached reading of one set.
struct Cached {
    /// When the reading was stored (its age counts from here, as it always has).
    at: Instant,
    reading: Arc<Reading>,
    /// Forgotten by [`LoadCache::invalidate`]: never served again, kept only as the last known
    /// blocks through an outage.
    invalidated: bool,
}

/// What the cache holds for a set.
enum Lookup {
    Fresh(Arc<Reading>),
    /// Past its period, within the bound, nothing this replica wrote since: serve, refetch.
    Stale(Arc<Reading>),
    /// Nothing servable: wait for a fetch.
    Expired,
}

/// A fetch in flight: its reading once there (`None` until then).
type Flight = watch::Receiver<Option<Arc<Reading>>>;

struct Shared {
    health: Arc<dyn Health>,
    settings: LoadCacheSettings,
    /// Readings age on it (fetches are bounded by Tokio's timer: a wait, not an age).
    clock: Clock,
    cache: Mutex<HashMap<u64, Cached>>,
    flights: Mutex<HashMap<u64, Flight>>,
    permits: Arc<Semaphore>,
    /// The latest reading of each account, whatever set it was read with.
    latest: Mutex<HashMap<AccountId, (Instant, AccountHealth)>>,
    /// Accounts this replica blocked or broke, and when: not served from a stale reading older.
    written: Mutex<HashMap<AccountId, Instant>>,
    /// selector_active_blocks{kind}: accounts blocked in the latest readings.
    active_blocks: OnceLock<prometheus::IntGaugeVec>,
}

pub struct LoadCache {
    shared: Arc<Shared>,
}

fn fingerprint(ids: &[AccountId]) -> u64 {
    let mut hasher = DefaultHasher::new();
    ids.hash(&mut hasher);
    hasher.finish()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl LoadCache {
    /// A cache over `health`; readings age on `clock`.
    pub fn new(health: Arc<dyn Health>, settings: LoadCacheSettings, clock: Clock) -> Self {
        LoadCache {
            shared: Arc::new(Shared {
                health,
                clock,
                permits: Arc::new(Semaphore::new(settings.max_fetches.max(1))),
                settings,
                cache: Mutex::new(HashMap::new()),
                flights: Mutex::new(HashMap::new()),
                latest: Mutex::new(HashMap::new()),
                written: Mutex::new(HashMap::new()),
                active_blocks: OnceLock::new(),
            }),
        }
    }

    /// Keeps `selector_active_blocks{kind}` (hard, soft, breaker) up to date from the readings.
    pub fn with_active_blocks_gauge(self, gauge: prometheus::IntGaugeVec) -> Self {
        let _ = self.shared.active_blocks.set(gauge);
        self
    }

    /// Forgets every cached reading (an operator just cleared blocks on this replica; the others
    /// see it when their readings age out, within the stale bound): the next select of each set
    /// waits for a fetch. The readings stay as the last known blocks should Redis be down.
    pub fn invalidate(&self) {
        for cached in lock(&self.shared.cache).values_mut() {
            cached.invalidated = true;
        }
    }

    /// This replica just wrote a block or a breaker change of `id`: a reading read before it is
    /// not served stale (this replica waits for the next read once the reading's period ends,
    /// as it did before stale-while-revalidate).
    pub fn wrote(&self, id: AccountId) {
        let keep = self.shared.settings.stale_bound() + self.shared.settings.fetch_timeout;
        let now = self.shared.clock.now();
        let mut written = lock(&self.shared.written);
        written.retain(|_, at| now.saturating_duration_since(*at) <= keep);
        written.insert(id, now);
    }

    /// The latest health read of one account, if it is at most `max_age` old.
    pub fn latest(&self, id: AccountId, max_age: Duration) -> Option<AccountHealth> {
        let now = self.shared.clock.now();
        let latest = lock(&self.shared.latest);
        latest
            .get(&id)
            .filter(|(at, _)| now.saturating_duration_since(*at) <= max_age)
            .map(|(_, health)| *health)
    }

    /// Notes a change this replica made (so its own next decision sees it without a read).
    pub fn note(&self, id: AccountId, change: impl FnOnce(&mut AccountHealth)) {
        let mut latest = lock(&self.shared.latest);
        if let Some((_, health)) = latest.get_mut(&id) {
            change(health);
        }
    }

    /// Health of `ids` (any order, duplicates allowed), from the cache unless `fresh`; a stale
    /// reading within the bound is served while one fetch replaces it.
    pub async fn read(&self, ids: &[AccountId], fresh: bool) -> Arc<Reading> {
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let key = fingerprint(&sorted);
        if !fresh {
            match self.shared.lookup(key) {
                Lookup::Fresh(reading) => return reading,
                Lookup::Stale(reading) => {
                    // Served as it is; the fetch (this one's or one already running) replaces it.
                    let _ = Shared::flight(&self.shared, key, &sorted, false);
                    return reading;
                }
                Lookup::Expired => {}
            }
        }
        match Shared::flight(&self.shared, key, &sorted, fresh) {
            Ok(flight) => wait(flight, sorted, &self.shared.clock).await,
            Err(reading) => reading,
        }
    }
}

/// A flight's reading; every account unknown should its task be gone.
async fn wait(mut flight: Flight, ids: Vec<AccountId>, clock: &Clock) -> Arc<Reading> {
    if let Ok(reading) = flight.wait_for(Option::is_some).await
        && let Some(reading) = reading.as_ref()
    {
        return reading.clone();
    }
    Arc::new(Reading {
        health: vec![None; ids.len()],
        ids,
        started: clock.now(),
    })
}

impl Shared {
    fn lookup(&self, key: u64) -> Lookup {
        let cache = lock(&self.cache);
        let Some(cached) = cache.get(&key).filter(|cached| !cached.invalidated) else {
            return Lookup::Expired;
        };
        let age = self.clock.since(cached.at);
        if age < self.settings.cache_ttl {
            Lookup::Fresh(cached.reading.clone())
        } else if age < self.settings.stale_bound() && !self.written_since(&cached.reading) {
            Lookup::Stale(cached.reading.clone())
        } else {
            Lookup::Expired
        }
    }

    /// Whether this replica wrote a block or breaker of an account in `reading` after its fetch
    /// started.
    fn written_since(&self, reading: &Reading) -> bool {
        let written = lock(&self.written);
        written
            .iter()
            .any(|(id, at)| *at >= reading.started && reading.index(*id).is_some())
    }

    /// The fetch of `key` in flight, started when there is none. Unless `fresh`, `Err` with the
    /// cached reading when a fetch that ended in between left a fresh one (no second fetch for a
    /// set just read).
    fn flight(
        shared: &Arc<Shared>,
        key: u64,
        ids: &[AccountId],
        fresh: bool,
    ) -> Result<Flight, Arc<Reading>> {
        let mut flights = lock(&shared.flights);
        if let Some(flight) = flights.get(&key) {
            return Ok(flight.clone());
        }
        // A fetch stores its reading before it leaves `flights`: under this lock, a set with no
        // fetch in flight shows here whether one just ended.
        if !fresh && let Lookup::Fresh(reading) = shared.lookup(key) {
            return Err(reading);
        }
        let (sender, receiver) = watch::channel(None);
        flights.insert(key, receiver.clone());
        drop(flights);
        tokio::spawn(Shared::run_flight(
            shared.clone(),
            key,
            ids.to_vec(),
            sender,
        ));
        Ok(receiver)
    }

    /// One flight, detached from whoever started it: the fetch (bounded by the timeout), the
    /// outage rule, then the reading stored, the latest readings and the gauge updated, the
    /// flight ended and its waiters woken.
    async fn run_flight(
        shared: Arc<Shared>,
        key: u64,
        ids: Vec<AccountId>,
        sender: watch::Sender<Option<Arc<Reading>>>,
    ) {
        let started = shared.clock.now();
        let previous = lock(&shared.cache)
            .get(&key)
            .map(|cached| cached.reading.clone());
        let fetch = tokio::spawn(fetch(
            shared.health.clone(),
            ids.clone(),
            shared.settings.clone(),
            shared.permits.clone(),
        ));
        let mut health = match tokio::time::timeout(shared.settings.fetch_timeout, fetch).await {
            Ok(Ok(health)) if health.len() == ids.len() => health,
            // Timed out (the fetch goes on, detached, and is dropped) or failed: unknown.
            _ => vec![None; ids.len()],
        };
        // Redis unreadable as a whole (an outage, not one bad account): keep the last known
        // blocks and breakers rather than forgetting them; the load is unknown, never 0.
        if health.iter().all(Option::is_none)
            && let Some(previous) = &previous
        {
            for (value, id) in health.iter_mut().zip(&ids) {
                *value = previous.get(*id).map(|known| AccountHealth {
                    inflight: None,
                    ..known
                });
            }
        }
        let reading = Arc::new(Reading {
            ids,
            health,
            started,
        });
        shared.note_latest(&reading);
        shared.store(key, reading.clone());
        {
            let mut flights = lock(&shared.flights);
            if flights
                .get(&key)
                .is_some_and(|flight| flight.same_channel(&sender.subscribe()))
            {
                flights.remove(&key);
            }
        }
        let _ = sender.send(Some(reading));
    }

    fn store(&self, key: u64, reading: Arc<Reading>) {
        let now = self.clock.now();
        let mut cache = lock(&self.cache);
        if cache.len() > CACHE_PRUNE_AT {
            let bound = self.settings.stale_bound();
            cache.retain(|_, cached| now.saturating_duration_since(cached.at) < bound);
        }
        cache.insert(
            key,
            Cached {
                at: now,
                reading,
                invalidated: false,
            },
        );
    }

    /// Records each read account's health as its latest, and sets the blocks gauge from them.
    fn note_latest(&self, reading: &Reading) {
        let now = self.clock.now();
        let mut latest = lock(&self.latest);
        for (id, health) in reading.ids.iter().zip(&reading.health) {
            if let Some(health) = health.filter(|h| h.inflight.is_some()) {
                latest.insert(*id, (now, health));
            }
        }
        if let Some(gauge) = self.active_blocks.get() {
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
