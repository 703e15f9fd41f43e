//! Outside selection: client keys checked against the snapshot, and the operator's reads and
//! actions (blocks, usage windows, restore, reload, live load, and the status view: every
//! account's live status, load, windows and block, and admission's state).

use std::collections::HashMap;
use std::sync::Arc;

use crate::crypto::api_key_hash;
use crate::health::{AccountHealth, BlockInfo, Breaker};
use poolgate_core::AccountId;
use poolgate_core::account::{Account, AccountStatus, ApiKeyRecord, Service};
use poolgate_core::health::LiveStatus;
use poolgate_core::keys::KeyRefusal;
use poolgate_core::status::{AccountStanding, BlockKind, BlockNote, StatusReport};
use poolgate_core::windows::WindowReading;

use super::{Selector, SelectorError};

/// What the engine says of a client key ([`Selector::check_key`]).
#[derive(Debug, Clone, PartialEq)]
pub enum KeyVerdict {
    /// Active, enabled and not expired.
    Accepted(Box<ApiKeyRecord>),
    /// Disabled or expired: why, for its holder.
    Refused(KeyRefusal),
}

impl Selector {
    /// Checks a client key against the snapshot (a revoked key is refused once the snapshot has
    /// reloaded, within a second of the change). A disabled or expired key is answered with its
    /// record: the caller checks `record.access.check_key(now)` and refuses it with the reason
    /// (docs/DESIGN.md §6, "What a client key reaches": the selector's `Authenticate` answers
    /// `PERMISSION_DENIED`, the standalone relay refuses it itself), so both modes decide alike.
    pub fn authenticate(&self, api_key: &str) -> Result<ApiKeyRecord, SelectorError> {
        let snapshot = self.snapshot.get();
        match snapshot.api_key(&api_key_hash(api_key)) {
            Some(record) if record.active => Ok(record.clone()),
            Some(_) => Err(SelectorError::Unauthenticated("api key revoked".into())),
            None => Err(SelectorError::Unauthenticated("unknown api key".into())),
        }
    }

    /// A client key as every transport answers it (docs/DESIGN.md §6, "What a client key
    /// reaches"): unknown or revoked is `Unauthenticated`; a disabled or expired key is refused
    /// with its reason (the selector's `Authenticate` answers `PERMISSION_DENIED` naming it, the
    /// standalone relay refuses it itself); any other is accepted with its record. The one place
    /// a key's expiry is judged against the engine's clock.
    pub fn check_key(&self, api_key: &str) -> Result<KeyVerdict, SelectorError> {
        let record = self.authenticate(api_key)?;
        Ok(match record.access.check_key(self.clock.wall_ms()) {
            Ok(()) => KeyVerdict::Accepted(Box::new(record)),
            Err(refusal) => KeyVerdict::Refused(refusal),
        })
    }

    /// Clears an account's blocks and breaker (operator action), and this replica's cached
    /// readings so the change shows at once.
    pub async fn clear_blocks(&self, id: AccountId) -> Result<(), SelectorError> {
        self.health
            .clear(id)
            .await
            .map_err(|e| SelectorError::Unavailable(e.to_string()))?;
        self.load_cache.invalidate();
        self.view_changed();
        Ok(())
    }

    /// Reads the config anew and serves from it (after an operator's change, so the answer
    /// shows it).
    pub async fn reload(&self) -> Result<(), SelectorError> {
        let ticket = self.snapshot.ticket();
        let snapshot = self.source.load_snapshot().await?;
        self.snapshot.set(ticket, snapshot);
        Ok(())
    }

    /// Puts an account back to active (operator action): its status, its blocks and breaker.
    pub async fn restore(&self, id: AccountId) -> Result<Arc<Account>, SelectorError> {
        self.source
            .set_status(id, AccountStatus::Active, "restored by operator")
            .await?;
        self.clear_blocks(id).await?;
        self.reload().await?;
        self.snapshot
            .get()
            .account(id)
            .cloned()
            .ok_or_else(|| SelectorError::NotFound(format!("no account {id}")))
    }

    /// Every block of every account, ascending by account.
    pub async fn blocks(&self) -> Result<Vec<BlockInfo>, SelectorError> {
        let mut ids: Vec<AccountId> = self.snapshot.get().accounts().map(|a| a.id).collect();
        ids.sort_unstable();
        self.health
            .list_blocks(&ids)
            .await
            .map_err(|e| SelectorError::Unavailable(e.to_string()))
    }

    /// The usage-window readings the health store keeps for the configured accounts (only
    /// `account`'s, only `group`'s accounts, when given), read fresh (not through selection's
    /// cache), ascending by account; accounts without a reading are left out. The readings are
    /// as stored: one whose reset has passed reads as empty in selection (docs/DESIGN.md §5) and
    /// is kept a day longer, for operators. An account not configured is `NotFound`.
    pub async fn windows(
        &self,
        account: Option<AccountId>,
        group: Option<&str>,
    ) -> Result<Vec<(Arc<Account>, Vec<WindowReading>)>, SelectorError> {
        let snapshot = self.snapshot.get();
        if let Some(id) = account
            && snapshot.account(id).is_none()
        {
            return Err(SelectorError::NotFound(format!("no account {id}")));
        }
        let mut accounts: Vec<Arc<Account>> = snapshot
            .accounts()
            .filter(|a| account.is_none_or(|id| a.id == id))
            .filter(|a| group.is_none_or(|group| a.group == group))
            .cloned()
            .collect();
        accounts.sort_unstable_by_key(|a| a.id);
        let ids: Vec<AccountId> = accounts.iter().map(|a| a.id).collect();
        let readings = self
            .health
            .read_windows(&ids)
            .await
            .map_err(|e| SelectorError::Unavailable(e.to_string()))?;
        if readings.len() != ids.len() {
            return Err(SelectorError::Unavailable(
                "usage windows read answered for other accounts".into(),
            ));
        }
        Ok(accounts
            .into_iter()
            .zip(readings)
            .filter(|(_, readings)| !readings.is_empty())
            .collect())
    }

    /// Live lease counts of accounts (`None`: unknown), fresh.
    pub async fn load(&self, ids: &[AccountId]) -> Vec<Option<u32>> {
        let reading = self.load_cache.read(ids, true).await;
        ids.iter()
            .map(|id| reading.get(*id).and_then(|h| h.inflight))
            .collect()
    }

    /// The pool at a glance (the operator's `status`, the status page): every configured
    /// account, ascending by id, with its live status (`LiveStatus::of`), live leases, what it
    /// used of its RPM and session-window limits (admission's counts, only where a limit makes
    /// admission count), its usage windows and the block that decides its status; and
    /// admission's state. Batched reads, fresh (not selection's cache): one health read through
    /// the load cache, the usage windows, admission's counts and registry, each one round trip
    /// on a Redis node; then the block details of the blocked accounts only. What cannot be read
    /// is unknown (`None`, no windows, admission `unknown`); only a health read that fails for
    /// every account is an error (every account would show as active).
    pub async fn status(&self) -> Result<StatusReport, SelectorError> {
        let snapshot = self.snapshot.get();
        let mut accounts: Vec<Arc<Account>> = snapshot.accounts().cloned().collect();
        accounts.sort_unstable_by_key(|a| a.id);
        let ids: Vec<AccountId> = accounts.iter().map(|a| a.id).collect();
        let (reading, windows, usage, admission) = tokio::join!(
            self.load_cache.read(&ids, true),
            self.health.read_windows(&ids),
            self.admission.account_usage(&ids),
            self.admission.admission_status(),
        );
        let health: Vec<Option<AccountHealth>> = ids.iter().map(|id| reading.get(*id)).collect();
        if !ids.is_empty() && health.iter().all(Option::is_none) {
            return Err(SelectorError::Unavailable(
                "account health could not be read".into(),
            ));
        }
        let windows = fitted("usage windows", windows, ids.len()).unwrap_or_default();
        let usage = fitted("account usage", usage, ids.len()).unwrap_or_default();
        let blocks = self.blocks_of(&ids, &health).await;
        let now_ms = self.clock.wall_ms();
        let accounts = accounts
            .iter()
            .enumerate()
            .map(|(i, account)| {
                standing(
                    account,
                    health[i],
                    blocks
                        .get(&account.id)
                        .map(Vec::as_slice)
                        .unwrap_or_default(),
                    usage.get(i).copied(),
                    windows.get(i).cloned().unwrap_or_default(),
                )
            })
            .collect();
        Ok(StatusReport {
            now_ms,
            admission,
            accounts,
        })
    }

    /// The block details of the accounts `health` shows blocked (or with a breaker counted
    /// open), by account; none when they cannot be read (the status still shows the block).
    async fn blocks_of(
        &self,
        ids: &[AccountId],
        health: &[Option<AccountHealth>],
    ) -> HashMap<AccountId, Vec<BlockInfo>> {
        let blocked: Vec<AccountId> = ids
            .iter()
            .zip(health)
            .filter(|(_, health)| {
                health.is_some_and(|h| {
                    h.hard_block_ms > 0 || h.soft_block_ms > 0 || h.breaker != Breaker::Closed
                })
            })
            .map(|(id, _)| *id)
            .collect();
        if blocked.is_empty() {
            return HashMap::new();
        }
        let mut by_account: HashMap<AccountId, Vec<BlockInfo>> = HashMap::new();
        match self.health.list_blocks(&blocked).await {
            Ok(blocks) => {
                for block in blocks {
                    by_account.entry(block.account_id).or_default().push(block);
                }
            }
            Err(error) => tracing::debug!(%error, "block details not read for the status view"),
        }
        by_account
    }
}

/// `read`'s answer when it is one per account asked (`expected`), else nothing (logged).
fn fitted<T, E: std::fmt::Display>(
    what: &str,
    read: Result<Vec<T>, E>,
    expected: usize,
) -> Option<Vec<T>> {
    match read {
        Ok(values) if values.len() == expected => Some(values),
        Ok(_) => {
            tracing::debug!(
                what,
                "answered for other accounts; left out of the status view"
            );
            None
        }
        Err(error) => {
            tracing::debug!(what, %error, "not read for the status view");
            None
        }
    }
}

/// One account's row of the status view. `usage`: admission's (RPM events, session spend in
/// micro-USD), shown only where a limit makes admission count it.
fn standing(
    account: &Account,
    health: Option<AccountHealth>,
    blocks: &[BlockInfo],
    usage: Option<(u32, i64)>,
    windows: Vec<WindowReading>,
) -> AccountStanding {
    let confirming = blocks.iter().any(BlockInfo::is_confirming);
    let status = LiveStatus::of(
        account.status,
        &health.unwrap_or(AccountHealth::HEALTHY),
        confirming,
    );
    // The block that decides the status: hard over an open breaker over soft.
    let block = [BlockKind::Hard, BlockKind::Breaker, BlockKind::Soft]
        .into_iter()
        .find_map(|kind| {
            blocks
                .iter()
                .find(|b| b.kind == kind.as_str())
                .map(|b| (kind, b))
        })
        .map(|(kind, b)| BlockNote {
            kind,
            class: b.class.clone(),
            status: b.status,
            reason: b.reason.clone(),
            remaining_ms: b.remaining_ms,
        });
    AccountStanding {
        id: account.id,
        name: account.name.clone(),
        group: account.group.clone(),
        platform: account.platform,
        credential_masked: account.credential.masked(),
        status,
        status_reason: match account.status {
            AccountStatus::Active => String::new(),
            _ => account.status_reason.clone(),
        },
        leases: health.and_then(|h| h.inflight),
        concurrency_limit: account.concurrency_limit,
        rpm_used: usage.filter(|_| account.rpm_limit > 0).map(|(rpm, _)| rpm),
        rpm_limit: account.rpm_limit,
        session_spend_usd: usage
            .filter(|_| account.session_window_limit_usd > 0.0)
            .map(|(_, micros)| poolgate_core::money::micros_to_usd(micros)),
        session_window_limit_usd: account.session_window_limit_usd,
        windows,
        block,
        kind: Some(account.credential_kind),
        email: account.identity.email.clone(),
        plan: account.identity.plan.clone(),
        token_expires_at_ms: account.oauth.as_ref().map_or(0, |o| o.expires_at_ms.max(0)),
        refreshable: account
            .oauth
            .as_ref()
            .is_some_and(|o| !o.refresh_token.is_empty()),
        serves: Service::ALL
            .into_iter()
            .filter(|service| account.serves(*service))
            .collect(),
    }
}
