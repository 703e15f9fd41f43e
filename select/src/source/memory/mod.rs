//! The in-memory account source of the relay's standalone mode: a snapshot built from its config
//! file, changed in place by the engine's writes (retirements, restores, refreshed tokens, usage),
//! so the next `load_snapshot` shows them.
//!
//! What must survive a restart goes to an optional state file, loaded over the config at
//! start: refreshed OAuth tokens (refresh tokens are single-use: a relay that refreshed and then
//! restarted with the config's old token has lost the account), status changes, an operator's
//! disable or enable of a client key ([`MemorySource::set_key_disabled`]), the usage ledger, and
//! the usage windows' readings of the in-process health store (with
//! [`MemorySource::keep_windows`]: a restart does not forget which account's week is nearly
//! used). Tokens, statuses and key disables are written at once; usage and readings, which change with every
//! request, at most every [`WRITE_EVERY`] (by [`MemorySource::write_periodically`]) and at
//! shutdown ([`MemorySource::flush`]), never on a request's path. The file is JSON, mode 0600
//! (it holds credentials in clear, as the config does), written atomically (a fresh temporary
//! file created exclusively in the same directory, fsync, rename, fsync of the directory), so a
//! crash leaves the old state or the new one, never half of one.
//!
//! This file is the source and its ledger; `state_file.rs` is the file: its format and its
//! atomic write; `sign_in.rs` the accounts signed in at run time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::{hex, short_hash};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{AccountSource, AdminStore, ModelUsage, StoreError, UsageInput, UsageTotals};
use crate::health::InProcessHealth;
use crate::snapshot::{Snapshot, SnapshotCell};
use poolgate_core::account::{
    Account, AccountStatus, ApiKeyRecord, OAuthState, Price, Secret, SignIn, SignedIn,
};
use poolgate_core::keys::{KeyUpdate, PeriodUsage};
use poolgate_core::price::PriceSource;
use poolgate_core::windows::WindowReading;
use poolgate_core::{AccountId, Clock};
use state_file::{
    FORMAT, FORMAT_WITH_ACCOUNTS, ModelUsageBucket, Persisted, StoredKey, StoredPrice,
    StoredStatus, StoredTokens, UsageBucket,
};

mod sign_in;
mod state_file;

pub use state_file::StateFile;

/// Usage and window readings are written at most this often (tokens and status changes at
/// once): a crash loses at most this much of them, and a busy relay does not fsync per request.
const WRITE_EVERY: Duration = Duration::from_secs(5);

/// The ledger keeps totals per client key and hour; a range counts the hours that start in it.
const USAGE_BUCKET_MS: i64 = 3_600_000;

/// How long usage is kept by the hour (docs/DESIGN.md §6, "Usage retention"): older buckets are
/// folded into each key's all-time totals, the bucket at hour 0 (the beginning of time), which
/// only a range from the beginning (the `total` period) reads. The selector's default.
pub const USAGE_RETENTION_MS: i64 = 90 * 24 * USAGE_BUCKET_MS;
/// The all-time totals' bucket.
const FOLDED_HOUR: i64 = 0;

/// What the config itself says of an account, to tell the state file's changes from it (for an
/// account signed in at run time: what its sign-in stored).
#[derive(Clone)]
struct Configured {
    name: String,
    status: AccountStatus,
    credential: String,
    /// Signed in at run time: kept in the state file's `accounts`, not in the config.
    runtime: bool,
}

struct Current {
    snapshot: Snapshot,
    configured: HashMap<AccountId, Configured>,
    /// Account name -> id; a name the config gives twice maps to nothing (no entry is applied
    /// to either account).
    names: HashMap<String, Option<AccountId>>,
    /// Client key id <-> the key's hash (hex).
    key_hashes: HashMap<i64, String>,
    key_ids: HashMap<String, i64>,
    /// Client key id -> whether the config disables it, to tell an operator's change from it.
    configured_key_disabled: HashMap<i64, bool>,
    /// The config's prices by model, to tell an operator's change from them.
    configured_prices: HashMap<String, Price>,
    persisted: Persisted,
    usage: BTreeMap<(i64, i64), UsageTotals>,
    /// Usage by (client key, hour, model, price source name; empty: not said).
    model_usage: BTreeMap<(i64, i64, String, String), UsageTotals>,
    /// Model buckets of keys the config no longer lists: kept in the file, counted for no one.
    retained_model_usage: Vec<ModelUsageBucket>,
    /// Buckets of keys the config no longer lists: kept in the file, counted for no one.
    retained_usage: Vec<UsageBucket>,
    usage_dirty: bool,
    /// When usage past the retention was last folded (ms since the epoch); 0: never.
    folded_at_ms: i64,
    /// The file's window readings of configured accounts, until [`MemorySource::keep_windows`]
    /// hands them to the health store.
    restored_windows: Vec<(AccountId, Vec<WindowReading>)>,
    /// The health store's windows version the file holds.
    windows_written: u64,
}

impl Current {
    /// Folds every hourly bucket that ends by `before_ms` into its key's all-time totals (the
    /// bucket at [`FOLDED_HOUR`], per model and price source in the model buckets); how many
    /// buckets it folded. Any total reads the same after; a range that starts later no longer
    /// sees what was folded.
    fn fold_usage(&mut self, before_ms: i64) -> usize {
        let due =
            |hour: i64| hour != FOLDED_HOUR && hour.saturating_add(USAGE_BUCKET_MS) <= before_ms;
        let old: Vec<(i64, i64)> = self
            .usage
            .keys()
            .filter(|(_, hour)| due(*hour))
            .copied()
            .collect();
        for key in &old {
            if let Some(totals) = self.usage.remove(key) {
                add(self.usage.entry((key.0, FOLDED_HOUR)).or_default(), &totals);
            }
        }
        let old_models: Vec<(i64, i64, String, String)> = self
            .model_usage
            .keys()
            .filter(|(_, hour, _, _)| due(*hour))
            .cloned()
            .collect();
        for key in old_models {
            if let Some(totals) = self.model_usage.remove(&key) {
                let (id, _, model, source) = key;
                add(
                    self.model_usage
                        .entry((id, FOLDED_HOUR, model, source))
                        .or_default(),
                    &totals,
                );
            }
        }
        if !old.is_empty() {
            self.usage_dirty = true;
        }
        old.len()
    }

    /// What the file holds at `now` (ms since the epoch); `windows`: the health store's
    /// readings, when it keeps them.
    fn to_persisted(
        &self,
        windows: Option<Vec<(AccountId, Vec<WindowReading>)>>,
        now: i64,
    ) -> Persisted {
        let format = if self.persisted.accounts.is_empty() {
            FORMAT
        } else {
            FORMAT_WITH_ACCOUNTS
        };
        let mut persisted = Persisted {
            format,
            usage: self
                .usage
                .iter()
                .map(|(&(api_key_id, hour_start_ms), totals)| UsageBucket {
                    key: self
                        .key_hashes
                        .get(&api_key_id)
                        .cloned()
                        .unwrap_or_default(),
                    api_key_id,
                    hour_start_ms,
                    requests: totals.requests,
                    input_tokens: totals.input_tokens,
                    output_tokens: totals.output_tokens,
                    cost_usd: totals.cost_usd,
                })
                .chain(self.retained_usage.iter().cloned())
                .collect(),
            model_usage: self
                .model_usage
                .iter()
                .map(
                    |((api_key_id, hour_start_ms, model, price_source), totals)| ModelUsageBucket {
                        key: self.key_hashes.get(api_key_id).cloned().unwrap_or_default(),
                        api_key_id: *api_key_id,
                        hour_start_ms: *hour_start_ms,
                        model: model.clone(),
                        price_source: price_source.clone(),
                        requests: totals.requests,
                        input_tokens: totals.input_tokens,
                        output_tokens: totals.output_tokens,
                        cost_usd: totals.cost_usd,
                    },
                )
                .chain(self.retained_model_usage.iter().cloned())
                .collect(),
            ..self.persisted.clone()
        };
        if let Some(stored) = windows {
            // The store holds the configured accounts' readings (the file's among them, restored
            // at start); the file keeps other accounts' as it found them.
            persisted
                .windows
                .retain(|name, _| !self.names.contains_key(name));
            for (id, readings) in stored {
                if let Some(configured) = self.configured.get(&id) {
                    persisted.windows.insert(configured.name.clone(), readings);
                }
            }
        }
        // A window whose reset passed reads as empty (docs/DESIGN.md §5): nothing to keep.
        for readings in persisted.windows.values_mut() {
            readings.retain(|reading| reading.reset_at_ms > now);
        }
        persisted.windows.retain(|_, readings| !readings.is_empty());
        persisted
    }

    /// The account a state file entry is for: by name (format 1) or by id (format 0).
    fn resolve(&self, key: &str, format: u32) -> Option<AccountId> {
        if format == 0 {
            return key
                .parse::<AccountId>()
                .ok()
                .filter(|id| self.configured.contains_key(id));
        }
        self.names.get(key).copied().flatten()
    }

    /// The name an account's entries are kept under.
    fn entry_name(&self, id: AccountId) -> Result<String, StoreError> {
        self.configured
            .get(&id)
            .map(|configured| configured.name.clone())
            .ok_or_else(|| StoreError::NotFound(format!("account {id}")))
    }

    fn account(&self, id: AccountId) -> Result<Account, StoreError> {
        self.snapshot
            .account(id)
            .map(|account| Account::clone(account))
            .ok_or_else(|| StoreError::NotFound(format!("account {id}")))
    }

    fn api_key(&self, id: i64) -> Result<ApiKeyRecord, StoreError> {
        self.snapshot
            .api_keys()
            .find(|record| record.id == id)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(format!("api key {id}")))
    }

    /// Serves client key `id` disabled or not; the record after.
    fn set_key_disabled(&mut self, id: i64, disabled: bool) -> Result<ApiKeyRecord, StoreError> {
        let mut record = self.api_key(id)?;
        record.access.disabled = disabled;
        self.snapshot.replace_api_key(record.clone());
        Ok(record)
    }
}

fn with_tokens(mut account: Account, tokens: &StoredTokens) -> Account {
    account.credential = tokens.access_token.clone();
    if let Some(identity) = &tokens.identity {
        account.identity = identity.to_identity();
    }
    let oauth = account.oauth.get_or_insert_with(|| OAuthState {
        refresh_token: Secret::default(),
        expires_at_ms: 0,
        token_url: String::new(),
        client_id: String::new(),
    });
    oauth.refresh_token = tokens.refresh_token.clone();
    oauth.expires_at_ms = tokens.expires_at_ms;
    account
}

/// The config in memory, with the engine's changes and an optional state file.
pub struct MemorySource {
    current: Mutex<Current>,
    state_file: Option<StateFile>,
    /// Held across taking a copy of the state and writing it, so writes land in the order of
    /// the changes they carry (each write carries every change made before it). Holds when
    /// usage was last written.
    writes: tokio::sync::Mutex<Instant>,
    /// Bumped on every change the snapshot shows (see [`MemorySource::reload_on_change`]).
    changes: watch::Sender<u64>,
    /// The health store whose window readings the file keeps ([`MemorySource::keep_windows`]).
    windows: OnceLock<Arc<InProcessHealth>>,
    /// Usage records' default time, and which window readings are still worth keeping.
    clock: Clock,
}

impl MemorySource {
    /// The source of `snapshot` (the config), with `state_file`'s tokens, statuses and usage
    /// over it when given. Entries for accounts the config does not have are ignored (and kept
    /// in the file); tokens refreshed from a credential the config no longer names are dropped.
    pub fn new(
        snapshot: Snapshot,
        state_file: Option<StateFile>,
        clock: Clock,
    ) -> Result<Self, StoreError> {
        let configured: HashMap<AccountId, Configured> = snapshot
            .accounts()
            .map(|account| {
                (
                    account.id,
                    Configured {
                        name: account.name.clone(),
                        status: account.status,
                        credential: short_hash(account.credential.expose()),
                        runtime: false,
                    },
                )
            })
            .collect();
        let mut names: HashMap<String, Option<AccountId>> = HashMap::new();
        for (&id, account) in &configured {
            names
                .entry(account.name.clone())
                .and_modify(|taken| *taken = None)
                .or_insert(Some(id));
        }
        let key_hashes: HashMap<i64, String> = snapshot
            .api_key_hashes()
            .map(|(hash, record)| (record.id, hex(hash)))
            .collect();
        let key_ids = key_hashes
            .iter()
            .map(|(&id, hash)| (hash.clone(), id))
            .collect();
        let configured_key_disabled = snapshot
            .api_keys()
            .map(|record| (record.id, record.access.disabled))
            .collect();
        let configured_prices = snapshot.operator_prices().clone();
        let persisted = match &state_file {
            Some(file) => file.read()?.unwrap_or_default(),
            None => Persisted::default(),
        };
        if persisted.format > FORMAT_WITH_ACCOUNTS {
            return Err(StoreError::StateFile(format!(
                "{} is in format {}, newer than this build reads ({FORMAT_WITH_ACCOUNTS}); start the newer \
                 build, or move the file away to start without it",
                state_file
                    .as_ref()
                    .map_or_else(String::new, |file| file.path().display().to_string()),
                persisted.format
            )));
        }
        let mut current = Current {
            snapshot,
            configured,
            names,
            key_hashes,
            key_ids,
            configured_key_disabled,
            configured_prices,
            usage: BTreeMap::new(),
            model_usage: BTreeMap::new(),
            retained_model_usage: Vec::new(),
            retained_usage: Vec::new(),
            usage_dirty: false,
            folded_at_ms: 0,
            restored_windows: Vec::new(),
            windows_written: 0,
            persisted: Persisted {
                format: FORMAT,
                ..Persisted::default()
            },
        };
        current.load(persisted);
        Ok(MemorySource {
            current: Mutex::new(current),
            state_file,
            writes: tokio::sync::Mutex::new(Instant::now()),
            changes: watch::channel(0).0,
            windows: OnceLock::new(),
            clock,
        })
    }

    fn with_current<T>(&self, f: impl FnOnce(&mut Current) -> T) -> T {
        // Changes below are whole-value replacements: a poisoned lock holds nothing half-made.
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut current)
    }

    /// The snapshot as it is now (what `load_snapshot` answers).
    pub fn snapshot(&self) -> Snapshot {
        self.with_current(|current| current.snapshot.clone())
    }

    /// Changes as they happen: the value is bumped on every status or token change.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Reloads `cell` from this source on every change, so a retirement or a refreshed token is
    /// served at once (the Postgres source's NOTIFY). Runs until its task is dropped.
    pub async fn reload_on_change(self: Arc<Self>, cell: Arc<SnapshotCell>) {
        // Subscribed before the first reload: a change made before this task first ran is in
        // that reload, one made after wakes the loop.
        let mut changes = self.changes();
        loop {
            let ticket = cell.ticket();
            cell.set(ticket, self.snapshot());
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Keeps `health`'s usage-window readings in the state file from now on: the file's readings
    /// go into it first (once; a second store is ignored). Call before serving, then run
    /// [`MemorySource::write_periodically`].
    /// How many hourly usage buckets are held (per key, and per key and model): bounded by the
    /// retention, whatever the traffic's age (docs/DESIGN.md §6, "Usage retention").
    pub fn usage_buckets(&self) -> (usize, usize) {
        self.with_current(|current| (current.usage.len(), current.model_usage.len()))
    }

    pub fn keep_windows(&self, health: Arc<InProcessHealth>) {
        let saved = self.with_current(|current| std::mem::take(&mut current.restored_windows));
        health.restore_windows(saved);
        if self.windows.set(health).is_err() {
            tracing::warn!("the state file keeps the window readings of one health store only");
        }
    }

    /// Writes the state file every [`WRITE_EVERY`] when usage or window readings wait to be
    /// written (so a crash loses at most that much of them). Runs until its task is dropped.
    pub async fn write_periodically(self: Arc<Self>) {
        if self.state_file.is_none() {
            return;
        }
        let mut every = tokio::time::interval_at(Instant::now() + WRITE_EVERY, WRITE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            // A failed write is logged, and what it carried is written again next time.
            let _ = self.flush().await;
        }
    }

    /// Writes the state file now if usage or window readings are waiting to be written (at
    /// shutdown, and periodically).
    pub async fn flush(&self) -> Result<(), StoreError> {
        let windows_waiting = self.windows.get().is_some_and(|health| {
            health.windows_version() != self.with_current(|current| current.windows_written)
        });
        if windows_waiting || self.with_current(|current| current.usage_dirty) {
            self.persist().await?;
        }
        Ok(())
    }

    /// Writes the whole state (when there is a state file).
    async fn persist(&self) -> Result<(), StoreError> {
        let Some(file) = &self.state_file else {
            return Ok(());
        };
        let mut last_write = self.writes.lock().await;
        let windows = self.windows.get().map(|health| health.all_windows());
        let version = windows.as_ref().map(|(version, _)| *version);
        let state = self.with_current(|current| {
            current.usage_dirty = false;
            current.to_persisted(windows.map(|(_, readings)| readings), self.clock.wall_ms())
        });
        let file = file.clone();
        let written = tokio::task::spawn_blocking(move || file.write(&state))
            .await
            .map_err(|e| StoreError::StateFile(format!("the write did not finish: {e}")))
            .and_then(|result| result);
        match &written {
            Ok(()) => {
                *last_write = Instant::now();
                if let Some(version) = version {
                    self.with_current(|current| current.windows_written = version);
                }
            }
            Err(error) => {
                // The change is served from memory; the next write carries it again.
                self.with_current(|current| current.usage_dirty = true);
                tracing::error!(%error, "state file not written");
            }
        }
        written
    }

    fn changed(&self) {
        self.changes.send_modify(|version| *version += 1);
    }

    /// Disables (`true`) or enables client key `api_key_id` (the standalone operator's
    /// `disable-key`/`enable-key`); the record after. Written to the state file at once, by the
    /// key's hash, when it differs from the config: a restart keeps it over the YAML, and a
    /// change back to what the YAML says leaves the YAML in charge again. An unknown key is
    /// `NotFound`.
    pub async fn set_key_disabled(
        &self,
        api_key_id: i64,
        disabled: bool,
    ) -> Result<ApiKeyRecord, StoreError> {
        let record = self.with_current(|current| {
            let record = current.set_key_disabled(api_key_id, disabled)?;
            let hash = current
                .key_hashes
                .get(&api_key_id)
                .cloned()
                .ok_or_else(|| StoreError::NotFound(format!("api key {api_key_id}")))?;
            if current.configured_key_disabled.get(&api_key_id) == Some(&disabled) {
                current.persisted.keys.remove(&hash);
            } else {
                current.persisted.keys.insert(hash, StoredKey { disabled });
            }
            Ok::<_, StoreError>(record)
        })?;
        self.changed();
        self.persist().await?;
        Ok(record)
    }

    /// Sets (`Some`) or removes (`None`) the operator's price of `model` (the standalone
    /// operator's `set-price`/`remove-price`), served at once. Written to the state file at once
    /// when it differs from the config's `prices`: a restart keeps it over the YAML, and a
    /// change back to what the YAML says leaves the YAML in charge again. Removing a price
    /// neither the config nor the operator set is `NotFound`.
    pub async fn set_price(&self, model: &str, price: Option<Price>) -> Result<(), StoreError> {
        self.with_current(|current| {
            if price.is_none() && !current.snapshot.operator_prices().contains_key(model) {
                return Err(StoreError::NotFound(format!(
                    "no operator price for {model}"
                )));
            }
            current.snapshot.set_operator_price(model, price);
            if current.configured_prices.get(model).copied() == price {
                current.persisted.prices.remove(model);
            } else {
                current
                    .persisted
                    .prices
                    .insert(model.to_owned(), price.map(stored_price));
            }
            Ok(())
        })?;
        self.changed();
        self.persist().await
    }
}

/// Adds `more` into `totals`.
fn add(totals: &mut UsageTotals, more: &UsageTotals) {
    totals.requests += more.requests;
    totals.input_tokens += more.input_tokens;
    totals.output_tokens += more.output_tokens;
    totals.cost_usd += more.cost_usd;
}

fn stored_price(price: Price) -> StoredPrice {
    StoredPrice {
        input: price.input_per_mtok,
        output: price.output_per_mtok,
        cache_write: price.cache_write_per_mtok,
        cache_read: price.cache_read_per_mtok,
        search_unit: price.per_search_unit,
    }
}

fn price_of_stored(stored: StoredPrice) -> Price {
    Price {
        per_search_unit: stored.search_unit,
        input_per_mtok: stored.input,
        output_per_mtok: stored.output,
        cache_write_per_mtok: stored.cache_write,
        cache_read_per_mtok: stored.cache_read,
    }
}

impl Current {
    /// Applies a saved state over the config. Entries for accounts or keys the config does not
    /// name are ignored and kept in the file (an account taken out of the config for a while
    /// finds its tokens again).
    fn load(&mut self, mut persisted: Persisted) {
        let format = persisted.format;
        for (name, stored) in std::mem::take(&mut persisted.accounts) {
            if let Err(why) = self.add_runtime_account(&name, &stored) {
                tracing::warn!(account = %name, %why, "a signed-in account of the state file is not served; kept in the file");
            }
            self.persisted.accounts.insert(name, stored);
        }
        for (key, tokens) in persisted.tokens {
            let Some(id) = self.resolve(&key, format) else {
                tracing::warn!(
                    account = %key,
                    "the state file has tokens of an account the config does not name; ignored"
                );
                self.persisted.tokens.insert(key, tokens);
                continue;
            };
            let configured = &self.configured[&id];
            if configured.credential != tokens.replaces {
                tracing::warn!(
                    account_id = id,
                    "the config names another credential than the one refreshed; using the config's"
                );
                continue;
            }
            let name = configured.name.clone();
            if let Ok(account) = self.account(id) {
                self.snapshot.replace_account(with_tokens(account, &tokens));
            }
            self.persisted.tokens.insert(name, tokens);
        }
        for (key, stored) in persisted.statuses {
            let Some(id) = self.resolve(&key, format) else {
                tracing::warn!(
                    account = %key,
                    "the state file has the status of an account the config does not name; ignored"
                );
                self.persisted.statuses.insert(key, stored);
                continue;
            };
            let status = AccountStatus::parse(&stored.status);
            let name = self.configured[&id].name.clone();
            self.persisted.statuses.insert(name, stored.clone());
            let Some(status) = status else {
                tracing::warn!(account_id = id, status = %stored.status, "unknown status in the state file; ignored");
                continue;
            };
            if let Ok(mut account) = self.account(id) {
                account.status = status;
                account.status_reason = stored.reason;
                self.snapshot.replace_account(account);
            }
        }
        for (hash, stored) in persisted.keys {
            match self.key_ids.get(&hash).copied() {
                // A key the config does not list keeps its entry, for when it is listed again.
                None => {}
                // The config says the same now: nothing left to keep.
                Some(id) if self.configured_key_disabled.get(&id) == Some(&stored.disabled) => {
                    continue;
                }
                Some(id) => {
                    // Cannot fail: the id is one of the config's keys.
                    let _ = self.set_key_disabled(id, stored.disabled);
                }
            }
            self.persisted.keys.insert(hash, stored);
        }
        for bucket in persisted.usage {
            let api_key_id = if bucket.key.is_empty() {
                Some(bucket.api_key_id)
            } else {
                self.key_ids.get(&bucket.key).copied()
            };
            let Some(api_key_id) = api_key_id else {
                self.retained_usage.push(bucket);
                continue;
            };
            let totals = self
                .usage
                .entry((api_key_id, bucket.hour_start_ms))
                .or_default();
            totals.requests += bucket.requests;
            totals.input_tokens += bucket.input_tokens;
            totals.output_tokens += bucket.output_tokens;
            totals.cost_usd += bucket.cost_usd;
        }
        for (model, stored) in persisted.prices {
            let price = stored.map(price_of_stored);
            // A price the file holds that no longer checks (edited by hand) is left out, logged:
            // the config's or the catalogue's applies.
            if let Some(price) = &price
                && let Err((field, problem)) = poolgate_core::price::check_price(&model, price)
            {
                tracing::warn!(%model, field, %problem, "a price in the state file is not a price; ignored");
                continue;
            }
            if self.configured_prices.get(&model).copied() == price {
                continue;
            }
            self.snapshot.set_operator_price(&model, price);
            self.persisted.prices.insert(model, stored);
        }
        for bucket in persisted.model_usage {
            let api_key_id = if bucket.key.is_empty() {
                Some(bucket.api_key_id)
            } else {
                self.key_ids.get(&bucket.key).copied()
            };
            let Some(api_key_id) = api_key_id else {
                self.retained_model_usage.push(bucket);
                continue;
            };
            let totals = self
                .model_usage
                .entry((
                    api_key_id,
                    bucket.hour_start_ms,
                    bucket.model,
                    bucket.price_source,
                ))
                .or_default();
            totals.requests += bucket.requests;
            totals.input_tokens += bucket.input_tokens;
            totals.output_tokens += bucket.output_tokens;
            totals.cost_usd += bucket.cost_usd;
        }
        for (key, readings) in persisted.windows {
            // Readings of an account the config does not name stay in the file, as its tokens do.
            if let Some(id) = self.resolve(&key, format) {
                self.restored_windows.push((id, readings.clone()));
                let name = self.configured[&id].name.clone();
                self.persisted.windows.insert(name, readings);
            } else {
                self.persisted.windows.insert(key, readings);
            }
        }
    }
}

#[async_trait]
impl AccountSource for MemorySource {
    async fn load_snapshot(&self) -> Result<Snapshot, StoreError> {
        Ok(self.snapshot())
    }

    async fn load_account(&self, id: AccountId) -> Result<Account, StoreError> {
        self.with_current(|current| current.account(id))
    }

    async fn set_status(
        &self,
        id: AccountId,
        status: AccountStatus,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.with_current(|current| {
            let mut account = current.account(id)?;
            let name = current.entry_name(id)?;
            account.status = status;
            account.status_reason = reason.to_owned();
            current.snapshot.replace_account(account);
            let runtime = current.configured.get(&id).is_some_and(|c| c.runtime);
            if runtime {
                // A run-time account keeps its status in its own entry.
                if let Some(stored) = current.persisted.accounts.get_mut(&name) {
                    stored.status = status.as_str().to_owned();
                    stored.status_reason = reason.to_owned();
                }
            // The file keeps only what differs from the config: a restore to the configured
            // status leaves the config in charge again.
            } else if current
                .configured
                .get(&id)
                .is_some_and(|configured| configured.status == status)
            {
                current.persisted.statuses.remove(&name);
            } else {
                current.persisted.statuses.insert(
                    name,
                    StoredStatus {
                        status: status.as_str().to_owned(),
                        reason: reason.to_owned(),
                    },
                );
            }
            Ok::<_, StoreError>(())
        })?;
        self.changed();
        self.persist().await
    }

    async fn store_tokens(
        &self,
        id: AccountId,
        access_token: &Secret,
        refresh_token: &Secret,
        expires_at_ms: i64,
    ) -> Result<(), StoreError> {
        self.with_current(|current| {
            let account = current.account(id)?;
            let name = current.entry_name(id)?;
            let replaces = current
                .configured
                .get(&id)
                .map(|configured| configured.credential.clone())
                .unwrap_or_default();
            let tokens = StoredTokens {
                access_token: access_token.clone(),
                refresh_token: refresh_token.clone(),
                expires_at_ms,
                replaces,
                identity: current
                    .persisted
                    .tokens
                    .get(&name)
                    .and_then(|tokens| tokens.identity.clone()),
            };
            current
                .snapshot
                .replace_account(with_tokens(account, &tokens));
            let runtime = current.configured.get(&id).is_some_and(|c| c.runtime);
            match current
                .persisted
                .accounts
                .get_mut(&name)
                .filter(|_| runtime)
            {
                // A run-time account keeps its tokens in its own entry, never under a name the
                // config could take later.
                Some(stored) => {
                    stored.access_token = tokens.access_token;
                    stored.refresh_token = tokens.refresh_token;
                    stored.expires_at_ms = tokens.expires_at_ms;
                    if let Some(configured) = current.configured.get_mut(&id) {
                        configured.credential = short_hash(access_token.expose());
                    }
                }
                None => {
                    current.persisted.tokens.insert(name, tokens);
                }
            }
            Ok::<_, StoreError>(())
        })?;
        self.changed();
        self.persist().await
    }

    async fn insert_usage(&self, records: &[UsageInput]) -> Result<u64, StoreError> {
        if records.is_empty() {
            return Ok(0);
        }
        let now = self.clock.wall_ms();
        self.with_current(|current| {
            // Past the retention, hourly buckets fold into the totals: at most once an hour.
            if now.saturating_sub(current.folded_at_ms) >= USAGE_BUCKET_MS {
                current.fold_usage(now.saturating_sub(USAGE_RETENTION_MS));
                current.folded_at_ms = now;
            }
            // Records without a client key count toward no key's totals, as in Postgres (where
            // they are stored but no read asks for them).
            for record in records {
                let Some(api_key_id) = record.api_key_id else {
                    continue;
                };
                let at = record.at_ms.unwrap_or(now);
                let hour = at - at.rem_euclid(USAGE_BUCKET_MS);
                let source = record
                    .price_source
                    .map(|source| source.as_str().to_owned())
                    .unwrap_or_default();
                for totals in [
                    current.usage.entry((api_key_id, hour)).or_default(),
                    current
                        .model_usage
                        .entry((api_key_id, hour, record.model.clone(), source))
                        .or_default(),
                ] {
                    totals.requests += 1;
                    totals.input_tokens += record.input_tokens;
                    totals.output_tokens += record.output_tokens;
                    totals.cost_usd += record.cost_usd;
                }
            }
            current.usage_dirty = true;
        });
        let due = self.writes.lock().await.elapsed() >= WRITE_EVERY;
        // The records are taken (in memory, marked dirty): a failed file write is retried by
        // the next write, never by the caller sending them again (that would count them twice).
        if due && let Err(error) = self.persist().await {
            tracing::warn!(%error, "usage kept in memory; written to the state file later");
        }
        Ok(records.len() as u64)
    }

    async fn read_usage(
        &self,
        api_key_id: i64,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<UsageTotals, StoreError> {
        if to_ms <= from_ms {
            return Ok(UsageTotals::default());
        }
        Ok(self.with_current(|current| {
            current
                .usage
                .range((api_key_id, from_ms)..(api_key_id, to_ms))
                .fold(UsageTotals::default(), |mut sum, (_, totals)| {
                    sum.requests += totals.requests;
                    sum.input_tokens += totals.input_tokens;
                    sum.output_tokens += totals.output_tokens;
                    sum.cost_usd += totals.cost_usd;
                    sum
                })
        }))
    }

    async fn read_model_usage(
        &self,
        api_key_id: i64,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<ModelUsage>, StoreError> {
        if to_ms <= from_ms {
            return Ok(Vec::new());
        }
        let sums = self.with_current(|current| {
            let mut sums: BTreeMap<(String, String), UsageTotals> = BTreeMap::new();
            let start = (api_key_id, from_ms, String::new(), String::new());
            let end = (api_key_id, to_ms, String::new(), String::new());
            for ((_, _, model, source), totals) in current.model_usage.range(start..end) {
                let sum = sums.entry((model.clone(), source.clone())).or_default();
                sum.requests += totals.requests;
                sum.input_tokens += totals.input_tokens;
                sum.output_tokens += totals.output_tokens;
                sum.cost_usd += totals.cost_usd;
            }
            sums
        });
        Ok(sums
            .into_iter()
            .map(|((model, source), totals)| ModelUsage {
                model,
                price_source: PriceSource::parse(&source),
                usage: PeriodUsage {
                    requests: totals.requests,
                    input_tokens: totals.input_tokens,
                    output_tokens: totals.output_tokens,
                    cost_usd: totals.cost_usd,
                },
            })
            .collect())
    }
}

/// The operator's key verbs over the config file's keys (no key is ever revoked here). Only a
/// key's disable changes at run time; its access and limits are the config file's.
#[async_trait]
impl AdminStore for MemorySource {
    async fn list_api_keys(&self) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let mut keys: Vec<ApiKeyRecord> =
            self.with_current(|current| current.snapshot.api_keys().cloned().collect());
        keys.sort_by_key(|key| key.id);
        Ok(keys)
    }

    async fn sign_in(&self, sign_in: &SignIn) -> Result<SignedIn, StoreError> {
        if let Some((field, message)) = sign_in.problem() {
            return Err(StoreError::Invalid {
                field: field.into(),
                message,
            });
        }
        if self.state_file.is_none() {
            return Err(StoreError::Invalid {
                field: "state_file".into(),
                message: "a standalone relay keeps signed-in accounts in its state file, and \
                          this one runs without (start it with --state-file)"
                    .into(),
            });
        }
        let (signed_in, undo) = self.with_current(|current| {
            let target = match sign_in.account_id {
                Some(id) => Some(id),
                None => current.find_identity(sign_in.platform, &sign_in.identity.upstream_id),
            };
            let name = sign_in
                .name
                .clone()
                .unwrap_or_else(|| sign_in.default_name());
            let undo = current.undo_for(target, &name);
            current.sign_in(sign_in).map(|signed_in| (signed_in, undo))
        })?;
        self.changed();
        if let Err(error) = self.persist().await {
            // Not kept, so not done: this account's entries go back as they were (other
            // accounts' changes meanwhile, a refreshed token among them, stay).
            self.with_current(|current| current.undo(undo, signed_in.account.id));
            self.changed();
            return Err(error);
        }
        Ok(signed_in)
    }

    async fn update_api_key(
        &self,
        api_key_id: i64,
        update: &KeyUpdate,
    ) -> Result<ApiKeyRecord, StoreError> {
        let only_disable = KeyUpdate {
            disabled: update.disabled,
            ..KeyUpdate::default()
        };
        if *update != only_disable {
            return Err(StoreError::Invalid {
                field: "update".into(),
                message: "a standalone relay changes only a key's disable at run time; its \
                          access and limits are the config file's"
                    .into(),
            });
        }
        match update.disabled {
            Some(disabled) => MemorySource::set_key_disabled(self, api_key_id, disabled).await,
            None => self
                .with_current(|current| {
                    current
                        .snapshot
                        .api_keys()
                        .find(|key| key.id == api_key_id)
                        .cloned()
                })
                .ok_or_else(|| StoreError::NotFound(format!("api key {api_key_id}"))),
        }
    }

    async fn set_price(&self, model: &str, price: Option<Price>) -> Result<(), StoreError> {
        MemorySource::set_price(self, model, price).await
    }
}
