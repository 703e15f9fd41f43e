//! Accounts signed in or imported at run time (docs/DESIGN.md §5, "Signing accounts in"): how
//! the state file's entries become accounts next to the config's, how a sign-in finds its
//! account (by id or identity) or makes one, and how a sign-in whose write failed is undone.

use poolgate_core::AccountId;
use poolgate_core::account::{
    Account, AccountIdentity, AccountStatus, CredentialKind, DEFAULT_GROUP, OAuthState, Platform,
    SignIn, SignedIn, default_base_url, default_oauth_token_url,
};
use poolgate_core::short_hash;
use poolgate_core::windows::WindowReading;
use std::collections::BTreeMap;

use super::state_file::{StoredAccount, StoredIdentity, StoredStatus, StoredTokens};
use super::{Configured, Current};
use crate::source::StoreError;

impl StoredIdentity {
    pub(super) fn to_identity(&self) -> AccountIdentity {
        AccountIdentity {
            upstream_id: self.upstream_id.clone(),
            email: self.email.clone(),
            plan: self.plan.clone(),
        }
    }

    pub(super) fn of(identity: &AccountIdentity) -> Self {
        StoredIdentity {
            upstream_id: identity.upstream_id.clone(),
            email: identity.email.clone(),
            plan: identity.plan.clone(),
        }
    }
}

impl StoredAccount {
    fn to_account(&self, name: &str) -> Result<Account, String> {
        let platform = Platform::parse(&self.platform)
            .ok_or_else(|| format!("platform {:?}", self.platform))?;
        let kind =
            CredentialKind::parse(&self.kind).ok_or_else(|| format!("kind {:?}", self.kind))?;
        Ok(Account {
            serves: Vec::new(),
            id: self.id,
            name: name.to_owned(),
            group: self.group.clone(),
            platform,
            base_url: self.base_url.clone(),
            credential_kind: kind,
            credential: self.access_token.clone(),
            oauth: kind.is_oauth().then(|| OAuthState {
                refresh_token: self.refresh_token.clone(),
                expires_at_ms: self.expires_at_ms,
                token_url: if self.token_url.is_empty() {
                    default_oauth_token_url(platform).to_owned()
                } else {
                    self.token_url.clone()
                },
                client_id: self.client_id.clone(),
            }),
            // A status this build does not know reads as active, as the state file's statuses do.
            status: AccountStatus::parse(&self.status).unwrap_or(AccountStatus::Active),
            status_reason: self.status_reason.clone(),
            priority: self.priority,
            weight: 1,
            concurrency_limit: self.concurrency_limit,
            rpm_limit: self.rpm_limit,
            session_window_limit_usd: 0.0,
            allowed_models: Vec::new(),
            model_mapping: self.model_mapping.clone().into_iter().collect(),
            proxy_url: self.proxy_url.clone(),
            probe_model: None,
            stream_usage: true,
            identity: self.identity.to_identity(),
        })
    }
}

/// One sign-in's entries as they were before it ([`Current::undo_for`]).
pub(super) struct Undo {
    name: String,
    account: Option<Account>,
    configured: Option<Configured>,
    names: Option<Option<AccountId>>,
    stored: Option<StoredAccount>,
    tokens: Option<StoredTokens>,
    statuses: Option<StoredStatus>,
    windows: Option<Vec<WindowReading>>,
}

/// Who the config's or the file's account `other` is, for a refusal naming it.
fn describe(id: AccountId, configured: &Configured) -> String {
    let place = if configured.runtime {
        "signed in at run time"
    } else {
        "in the config file"
    };
    format!("account {id} {:?} ({place})", configured.name)
}

impl Current {
    /// Serves a run-time account of the state file: refused when the config now has its name
    /// or its identity (the config wins; the entry stays in the file). Its id is the stored one,
    /// or the next free one when the config took it.
    pub(super) fn add_runtime_account(
        &mut self,
        name: &str,
        stored: &StoredAccount,
    ) -> Result<(), String> {
        let mut account = stored.to_account(name)?;
        if let Some(Some(other)) = self.names.get(name) {
            return Err(format!(
                "its name is {}'s",
                describe(*other, &self.configured[other])
            ));
        }
        if let Some(other) = self.find_identity(account.platform, &account.identity.upstream_id) {
            return Err(format!(
                "its identity is {}'s",
                describe(other, &self.configured[&other])
            ));
        }
        if self.configured.contains_key(&account.id) || account.id <= 0 {
            account.id = self.next_id();
        }
        self.configured.insert(
            account.id,
            Configured {
                name: name.to_owned(),
                status: AccountStatus::Active,
                credential: short_hash(account.credential.expose()),
                runtime: true,
            },
        );
        self.names.insert(name.to_owned(), Some(account.id));
        self.snapshot.add_account(account);
        Ok(())
    }

    pub(super) fn next_id(&self) -> AccountId {
        self.configured.keys().max().copied().unwrap_or(0) + 1
    }

    /// The account of `platform` whose identity is `upstream_id`.
    pub(super) fn find_identity(&self, platform: Platform, upstream_id: &str) -> Option<AccountId> {
        if upstream_id.is_empty() {
            return None;
        }
        self.snapshot
            .accounts()
            .find(|a| a.platform == platform && a.identity.upstream_id == upstream_id)
            .map(|a| a.id)
    }

    /// Puts a sign-in's tokens into the pool (docs/DESIGN.md §5, "Signing accounts in"): into
    /// the account it names or whose identity it has, else into a new run-time account.
    pub(super) fn sign_in(&mut self, sign_in: &SignIn) -> Result<SignedIn, StoreError> {
        let target = match sign_in.account_id {
            Some(id) => Some(self.account(id)?.id),
            None => self.find_identity(sign_in.platform, &sign_in.identity.upstream_id),
        };
        match target {
            Some(id) => self.sign_in_again(id, sign_in),
            None => self.create_account(sign_in),
        }
    }

    fn sign_in_again(&mut self, id: AccountId, sign_in: &SignIn) -> Result<SignedIn, StoreError> {
        let mut account = self.account(id)?;
        if let Some(problem) = crate::source::sign_in_mismatch(&account, sign_in) {
            return Err(StoreError::Invalid {
                field: "account".into(),
                message: problem,
            });
        }
        if let Some(other) = self
            .find_identity(sign_in.platform, &sign_in.identity.upstream_id)
            .filter(|other| *other != id)
        {
            return Err(StoreError::Conflict(format!(
                "this sign-in is {}, not account {id}",
                describe(other, &self.configured[&other])
            )));
        }
        let name = self.entry_name(id)?;
        let reactivated = account.status == AccountStatus::Error;
        crate::source::apply_sign_in(&mut account, sign_in);
        let configured = self
            .configured
            .get(&id)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(format!("account {id}")))?;
        if reactivated {
            account.status = AccountStatus::Active;
            account.status_reason = String::new();
        }
        if configured.runtime {
            // A run-time account keeps its tokens and status in its own entry.
            let stored = self
                .persisted
                .accounts
                .get_mut(&name)
                .ok_or_else(|| StoreError::NotFound(format!("account {id}")))?;
            stored.access_token = sign_in.access_token.clone();
            stored.refresh_token = sign_in.refresh_token.clone();
            stored.expires_at_ms = sign_in.expires_at_ms;
            stored.token_url = sign_in.token_url.clone();
            stored.client_id = sign_in.client_id.clone();
            stored.identity = StoredIdentity::of(&sign_in.identity);
            if reactivated {
                stored.status = AccountStatus::Active.as_str().to_owned();
                stored.status_reason = String::new();
            }
            if let Some(configured) = self.configured.get_mut(&id) {
                configured.credential = short_hash(sign_in.access_token.expose());
            }
        } else {
            // A configured account keeps its settings (the config file's); its new tokens are
            // kept as a refresh's are, replacing the config's credential until it names another.
            self.persisted.tokens.insert(
                name.clone(),
                StoredTokens {
                    access_token: sign_in.access_token.clone(),
                    refresh_token: sign_in.refresh_token.clone(),
                    expires_at_ms: sign_in.expires_at_ms,
                    replaces: configured.credential.clone(),
                    identity: Some(StoredIdentity::of(&sign_in.identity)),
                },
            );
            if reactivated {
                if configured.status == AccountStatus::Active {
                    self.persisted.statuses.remove(&name);
                } else {
                    self.persisted.statuses.insert(
                        name,
                        StoredStatus {
                            status: AccountStatus::Active.as_str().to_owned(),
                            reason: String::new(),
                        },
                    );
                }
            }
        }
        self.snapshot.replace_account(account.clone());
        Ok(SignedIn {
            account,
            created: false,
            reactivated,
        })
    }

    fn create_account(&mut self, sign_in: &SignIn) -> Result<SignedIn, StoreError> {
        let name = sign_in
            .name
            .clone()
            .unwrap_or_else(|| sign_in.default_name());
        if let Some(taken) = self.names.get(&name) {
            let by = match taken {
                Some(other) => describe(*other, &self.configured[other]),
                None => "two accounts of the config file".to_owned(),
            };
            return Err(StoreError::Conflict(format!(
                "the name {name:?} is taken by {by}; give the new account another name"
            )));
        }
        let stored = StoredAccount {
            id: self.next_id(),
            group: sign_in
                .group
                .clone()
                .unwrap_or_else(|| DEFAULT_GROUP.to_owned()),
            platform: sign_in.platform.as_str().to_owned(),
            kind: sign_in.kind.as_str().to_owned(),
            base_url: sign_in
                .base_url
                .clone()
                .unwrap_or_else(|| default_base_url(sign_in.platform, sign_in.kind).to_owned())
                .trim_end_matches('/')
                .to_owned(),
            access_token: sign_in.access_token.clone(),
            refresh_token: sign_in.refresh_token.clone(),
            expires_at_ms: sign_in.expires_at_ms,
            token_url: sign_in.token_url.clone(),
            client_id: sign_in.client_id.clone(),
            identity: StoredIdentity::of(&sign_in.identity),
            status: AccountStatus::Active.as_str().to_owned(),
            status_reason: String::new(),
            priority: sign_in.settings.priority.unwrap_or(0),
            concurrency_limit: sign_in.settings.concurrency_limit.unwrap_or(0),
            rpm_limit: sign_in.settings.rpm_limit.unwrap_or(0),
            proxy_url: sign_in.settings.proxy_url.clone().filter(|p| !p.is_empty()),
            model_mapping: sign_in
                .settings
                .model_mapping
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
        };
        self.add_runtime_account(&name, &stored)
            .map_err(StoreError::Conflict)?;
        let id = self
            .names
            .get(&name)
            .copied()
            .flatten()
            .unwrap_or(stored.id);
        // Whatever the file kept under this name belonged to an account no longer configured:
        // not this one's.
        self.persisted.tokens.remove(&name);
        self.persisted.statuses.remove(&name);
        self.persisted.windows.remove(&name);
        self.persisted
            .accounts
            .insert(name, StoredAccount { id, ..stored });
        Ok(SignedIn {
            account: self.account(id)?,
            created: true,
            reactivated: false,
        })
    }

    /// What a sign-in of `target` (an account, or a new one named `name`) may change: its
    /// entries, to put back if the write fails, leaving every other account's changes made
    /// meanwhile as they are.
    pub(super) fn undo_for(&self, target: Option<AccountId>, name: &str) -> Undo {
        let id = target.or_else(|| self.names.get(name).copied().flatten());
        let name = id
            .and_then(|id| self.configured.get(&id))
            .map_or_else(|| name.to_owned(), |c| c.name.clone());
        Undo {
            account: id.and_then(|id| self.snapshot.account(id).map(|a| Account::clone(a))),
            configured: id.and_then(|id| self.configured.get(&id).cloned()),
            names: self.names.get(&name).copied(),
            stored: self.persisted.accounts.get(&name).cloned(),
            tokens: self.persisted.tokens.get(&name).cloned(),
            statuses: self.persisted.statuses.get(&name).cloned(),
            windows: self.persisted.windows.get(&name).cloned(),
            name,
        }
    }

    /// Puts back what [`Current::undo_for`] kept, for the account `signed_in` names.
    pub(super) fn undo(&mut self, undo: Undo, signed_in: AccountId) {
        match undo.account {
            Some(account) => {
                self.snapshot.replace_account(account);
            }
            None => self.snapshot.remove_account(signed_in),
        }
        match undo.configured {
            Some(configured) => {
                self.configured.insert(signed_in, configured);
            }
            None => {
                self.configured.remove(&signed_in);
            }
        }
        fn put<V>(map: &mut BTreeMap<String, V>, name: &str, value: Option<V>) {
            match value {
                Some(value) => {
                    map.insert(name.to_owned(), value);
                }
                None => {
                    map.remove(name);
                }
            }
        }
        match undo.names {
            Some(taken) => {
                self.names.insert(undo.name.clone(), taken);
            }
            None => {
                self.names.remove(&undo.name);
            }
        }
        put(&mut self.persisted.accounts, &undo.name, undo.stored);
        put(&mut self.persisted.tokens, &undo.name, undo.tokens);
        put(&mut self.persisted.statuses, &undo.name, undo.statuses);
        put(&mut self.persisted.windows, &undo.name, undo.windows);
    }
}
