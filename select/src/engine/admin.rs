//! Outside selection: client keys checked against the snapshot, and the operator's reads and
//! actions (blocks, restore, reload, live load).

use std::sync::Arc;

use crate::crypto::api_key_hash;
use crate::health::BlockInfo;
use poolgate_core::AccountId;
use poolgate_core::account::{Account, AccountStatus, ApiKeyRecord};

use super::{Selector, SelectorError};

impl Selector {
    /// Checks a client key against the snapshot (a revoked key is refused once the snapshot has
    /// reloaded, within a second of the change).
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

    /// Live lease counts of accounts (`None`: unknown), fresh.
    pub async fn load(&self, ids: &[AccountId]) -> Vec<Option<u32>> {
        let reading = self.load_cache.read(ids, true).await;
        ids.iter()
            .map(|id| reading.get(*id).and_then(|h| h.inflight))
            .collect()
    }
}
