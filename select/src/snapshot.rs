//! The in-memory config snapshot the selector serves from: accounts by group, API keys by hash,
//! prices. Replaced whole on every reload (NOTIFY or the periodic safety net), never mutated.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use poolgate_core::AccountId;
use poolgate_core::account::{Account, ApiKeyRecord, GroupSettings, Platform, Price};
use poolgate_core::price::{ModelPrice, UnpricedPolicy};

#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    groups: HashSet<String>,
    accounts: HashMap<AccountId, Arc<Account>>,
    /// group -> account ids, ascending.
    by_group: HashMap<String, Vec<AccountId>>,
    api_keys: HashMap<Vec<u8>, ApiKeyRecord>,
    /// The operator's prices by model (over the shipped catalogue, `crate::prices`).
    prices: HashMap<String, Price>,
    /// Only groups that set something; the rest have the defaults.
    settings: HashMap<String, GroupSettings>,
    /// The selector's settings a relay's view carries (`None`: the engine's own).
    deployment: Option<poolgate_core::view::Deployment>,
}

impl Snapshot {
    pub fn new(
        groups: Vec<String>,
        accounts: Vec<Account>,
        api_keys: HashMap<Vec<u8>, ApiKeyRecord>,
        prices: HashMap<String, Price>,
    ) -> Self {
        let mut by_group: HashMap<String, Vec<AccountId>> = HashMap::new();
        let mut groups: HashSet<String> = groups.into_iter().collect();
        let mut map = HashMap::new();
        for account in accounts {
            groups.insert(account.group.clone());
            by_group
                .entry(account.group.clone())
                .or_default()
                .push(account.id);
            map.insert(account.id, Arc::new(account));
        }
        for ids in by_group.values_mut() {
            ids.sort_unstable();
        }
        Snapshot {
            groups,
            accounts: map,
            by_group,
            api_keys,
            prices,
            settings: HashMap::new(),
            deployment: None,
        }
    }

    /// This snapshot planned with the selector's settings (a relay's view).
    pub fn with_deployment(mut self, deployment: poolgate_core::view::Deployment) -> Self {
        self.deployment = Some(deployment);
        self
    }

    /// The selector's settings this snapshot came with, if any (a relay's view).
    pub fn deployment(&self) -> Option<&poolgate_core::view::Deployment> {
        self.deployment.as_ref()
    }

    /// This snapshot with these group settings (a group named here exists, accounts or not).
    pub fn with_group_settings(mut self, settings: HashMap<String, GroupSettings>) -> Self {
        self.groups.extend(settings.keys().cloned());
        self.settings = settings;
        self
    }

    /// The groups that set something, with their settings.
    pub fn group_settings_map(&self) -> &HashMap<String, GroupSettings> {
        &self.settings
    }

    /// A group's settings (the defaults for a group that set none).
    pub fn group_settings(&self, group: &str) -> GroupSettings {
        self.settings.get(group).cloned().unwrap_or_default()
    }

    /// Replaces an account by id, keeping its group (the in-memory source's writes: status and
    /// tokens). `false` when there is no such account.
    pub(crate) fn replace_account(&mut self, account: Account) -> bool {
        match self.accounts.get_mut(&account.id) {
            Some(current) if current.group == account.group => {
                *current = Arc::new(account);
                true
            }
            _ => false,
        }
    }

    /// Adds an account (the in-memory source's accounts signed in at run time); its group
    /// exists from now on. An account with the same id is replaced.
    pub(crate) fn add_account(&mut self, account: Account) {
        self.groups.insert(account.group.clone());
        let ids = self.by_group.entry(account.group.clone()).or_default();
        if !ids.contains(&account.id) {
            ids.push(account.id);
            ids.sort_unstable();
        }
        self.accounts.insert(account.id, Arc::new(account));
    }

    /// Removes an account (a run-time account whose sign-in was not kept).
    pub(crate) fn remove_account(&mut self, id: AccountId) {
        if let Some(account) = self.accounts.remove(&id)
            && let Some(ids) = self.by_group.get_mut(&account.group)
        {
            ids.retain(|other| *other != id);
        }
    }

    /// Replaces a client key's record by id, keeping its hash (the in-memory source's key
    /// disable). `false` when there is no such key.
    pub(crate) fn replace_api_key(&mut self, record: ApiKeyRecord) -> bool {
        match self
            .api_keys
            .values_mut()
            .find(|current| current.id == record.id)
        {
            Some(current) => {
                *current = record;
                true
            }
            None => false,
        }
    }

    /// Every configured group (with accounts, or named by its settings).
    pub fn groups(&self) -> impl Iterator<Item = &str> {
        self.groups.iter().map(String::as_str)
    }

    pub fn has_group(&self, group: &str) -> bool {
        self.groups.contains(group)
    }

    pub fn account(&self, id: AccountId) -> Option<&Arc<Account>> {
        self.accounts.get(&id)
    }

    pub fn accounts(&self) -> impl Iterator<Item = &Arc<Account>> {
        self.accounts.values()
    }

    pub fn group_accounts(&self, group: &str) -> impl Iterator<Item = &Arc<Account>> {
        self.by_group
            .get(group)
            .into_iter()
            .flatten()
            .filter_map(|id| self.accounts.get(id))
    }

    pub fn api_key(&self, hash: &[u8]) -> Option<&ApiKeyRecord> {
        self.api_keys.get(hash)
    }

    pub fn api_keys(&self) -> impl Iterator<Item = &ApiKeyRecord> {
        self.api_keys.values()
    }

    /// The client keys with their hashes (what names a key whatever its id).
    pub fn api_key_hashes(&self) -> impl Iterator<Item = (&[u8], &ApiKeyRecord)> {
        self.api_keys
            .iter()
            .map(|(hash, record)| (hash.as_slice(), record))
    }

    /// A model's price: the operator's, else the shipped catalogue's, else as `policy` says
    /// (`crate::prices::price_of`, docs/DESIGN.md §6 "Prices").
    pub fn price(&self, model: &str, platform: Platform, policy: UnpricedPolicy) -> ModelPrice {
        crate::prices::price_of(&self.prices, model, platform, policy)
    }

    /// The operator's prices by model (not the catalogue's).
    pub fn operator_prices(&self) -> &HashMap<String, Price> {
        &self.prices
    }

    /// Sets (`Some`) or removes the operator's price of a model (the in-memory source's
    /// writes).
    pub(crate) fn set_operator_price(&mut self, model: &str, price: Option<Price>) {
        match price {
            Some(price) => {
                self.prices.insert(model.to_owned(), price);
            }
            None => {
                self.prices.remove(model);
            }
        }
    }
}

/// The current snapshot, swapped atomically on reload. Loads overlap (NOTIFY, the periodic
/// safety net, an admin change): each takes a ticket before it reads Postgres, and a load only
/// replaces a snapshot read before it, so a slow older load never overwrites a newer one.
#[derive(Debug, Default)]
pub struct SnapshotCell {
    current: RwLock<(u64, Arc<Snapshot>)>,
    tickets: std::sync::atomic::AtomicU64,
    /// Notified when a snapshot is installed (the relays' view publisher waits on it).
    installed: Arc<tokio::sync::Notify>,
}

impl SnapshotCell {
    pub fn new(snapshot: Snapshot) -> Self {
        SnapshotCell {
            current: RwLock::new((0, Arc::new(snapshot))),
            tickets: std::sync::atomic::AtomicU64::new(1),
            installed: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Notified (one waiter, or the next) each time a snapshot is installed.
    pub fn installed(&self) -> Arc<tokio::sync::Notify> {
        self.installed.clone()
    }

    pub fn get(&self) -> Arc<Snapshot> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }

    /// Call before reading Postgres for a new snapshot.
    pub fn ticket(&self) -> u64 {
        self.tickets
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }

    /// Installs a snapshot read under `ticket`, unless a later-started load already did.
    pub fn set(&self, ticket: u64, snapshot: Snapshot) {
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        if ticket > current.0 {
            *current = (ticket, Arc::new(snapshot));
            self.installed.notify_one();
        }
    }
}
