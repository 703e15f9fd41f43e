//! Outside selection: client keys checked against the snapshot, and the operator's reads and
//! actions (blocks, usage windows, restore, reload, live load).

use std::sync::Arc;

use crate::crypto::api_key_hash;
use crate::health::BlockInfo;
use poolgate_core::AccountId;
use poolgate_core::account::{Account, AccountStatus, ApiKeyRecord};
use poolgate_core::windows::WindowReading;

use super::{Selector, SelectorError};

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

    /// Clears an account's blocks and breaker (operator action), and this replica's cached
    /// readings so the change shows at once.
    pub async fn clear_blocks(&self, id: AccountId) -> Result<(), SelectorError> {
        self.health
            .clear(id)
            .await
            .map_err(|e| SelectorError::Unavailable(e.to_string()))?;
        self.load_cache.invalidate();
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
}
