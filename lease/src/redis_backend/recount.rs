//! When Redis loses an account's state (a wipe, a node restarted without persistence): the
//! account's `kept` marker (`redis_keys::AccountKeys::kept`) is gone with its leases, and the
//! first replica to notice sets it to "recount until now + the recount", during which no acquire
//! is granted and every holder's lease is put back whatever the limit (docs/DESIGN.md §3, "When
//! Redis is wiped"). This file holds what a replica knows for that: which accounts it saw the
//! marker of (only there does a missing marker mean a loss, not a first use), whether it
//! noticed a loss since its holders last restored, and the restore pass's one renewal.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use poolgate_core::AccountId;
use poolgate_core::lease::{LeaseId, Renewal};
use poolgate_runtime::error::StateError;

use super::RedisBackend;

/// How long a marker lives after it is set (`KEPT_MS` in `scripts/prelude.lua`).
pub(super) const KEPT_MS: u64 = 86_400_000;

/// How long a replica takes a marker it saw to still be there: well inside the marker's own
/// life after its last touch (at least half a day, `KEPT_MS` in `scripts/prelude.lua`), so an
/// account idle for longer is a first use again, not a loss.
const KNOWN_FOR: Duration = Duration::from_secs(6 * 3600);

/// A replica's knowledge of the accounts' markers.
pub(super) struct Recount {
    /// How long an account recounts after a loss: enough for every replica to notice (its
    /// registry heartbeat finds its own entry gone) and put its holders' leases back.
    pub(super) window: Duration,
    seen: Mutex<Seen>,
    /// A loss noticed and not yet answered by a restore pass.
    pending: AtomicBool,
}

#[derive(Default)]
struct Seen {
    /// Accounts whose marker this replica saw, and when last.
    accounts: HashMap<AccountId, Instant>,
    /// When this replica last noticed a loss: for a recount after it, every account counts as
    /// seen (another replica may hold leases on one this replica never touched).
    loss: Option<Instant>,
}

impl Recount {
    pub(super) fn new(window: Duration) -> Self {
        Recount {
            window,
            seen: Mutex::new(Seen::default()),
            pending: AtomicBool::new(false),
        }
    }

    /// The recount an acquire or renewal of `account` sends: the window where this replica saw
    /// the account's marker (or noticed a loss within two windows), else 0 (a first use).
    pub(super) fn for_account(&self, account: AccountId) -> u64 {
        let now = Instant::now();
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let known = seen
            .accounts
            .get(&account)
            .is_some_and(|at| now.duration_since(*at) < KNOWN_FOR)
            || seen
                .loss
                .is_some_and(|at| now.duration_since(at) < 2 * self.window);
        if known {
            u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX)
        } else {
            0
        }
    }

    /// The account's marker is there now (every answered acquire and renewal leaves it there).
    pub(super) fn saw(&self, account: AccountId) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if seen.accounts.len() > 100_000 {
            seen.accounts
                .retain(|_, at| now.duration_since(*at) < KNOWN_FOR);
        }
        seen.accounts.insert(account, now);
    }

    /// Redis lost state this replica had seen.
    pub(super) fn notice(&self) {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).loss = Some(Instant::now());
        self.pending.store(true, Ordering::SeqCst);
    }
}

impl RedisBackend {
    /// Whether this replica noticed a loss of Redis state since the last call: its holders'
    /// leases are then to be put back (`PolicyBackend::restore_held`).
    pub fn take_noticed_loss(&self) -> bool {
        self.recount.pending.swap(false, Ordering::SeqCst)
    }

    /// Notes a loss found outside the lease scripts (the registry heartbeat found this
    /// replica's own entry gone).
    pub fn notice_loss(&self) {
        self.recount.notice();
    }

    /// The restore pass's renewal of a lease this replica holds: renewed where live, put back
    /// where its account recounts (or its marker is gone with it, which starts the recount) and
    /// its key has room, left alone otherwise (its holder's next heartbeat restores it where
    /// there is room). Answers whether the lease is in Redis now.
    pub async fn restore_held(
        &self,
        lease_id: &LeaseId,
        ttl_ms: u64,
        key_limit: i32,
    ) -> Result<bool, StateError> {
        let state = self
            .renew_state(lease_id, ttl_ms, "2", 0, key_limit)
            .await?;
        if matches!(state, 6 | 7)
            && self.redis.is_cluster()
            && let Some(api_key_id) = lease_id.api_key_id()
        {
            let key_keys = poolgate_runtime::redis_keys::ClientKeyKeys::slot_only(api_key_id);
            // The key's part too, with the key's room (its other leases run on accounts that do
            // not recount); without it the account's part is taken back.
            if let Renewal::Lost(_) = self
                .renew_key_slot(&key_keys, lease_id, ttl_ms, key_limit)
                .await?
            {
                self.drop_account_part(lease_id).await?;
                return Ok(false);
            }
        }
        Ok(matches!(state, 1 | 6 | 7))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_and_the_restore_give_the_marker_one_life() {
        let prelude = include_str!("scripts/prelude.lua");
        assert!(
            prelude.contains(&format!("local KEPT_MS = {KEPT_MS}\n")),
            "scripts/prelude.lua and recount.rs disagree on the marker's life"
        );
        assert!(KNOWN_FOR.as_millis() < u128::from(KEPT_MS / 2));
    }

    #[test]
    fn a_missing_marker_is_a_loss_only_where_this_replica_saw_it() {
        let recount = Recount::new(Duration::from_millis(1_500));
        assert_eq!(recount.for_account(7), 0, "a first use");
        recount.saw(7);
        assert_eq!(recount.for_account(7), 1_500);
        assert_eq!(recount.for_account(8), 0);
        assert!(!recount.pending.load(Ordering::SeqCst));
        // After a loss this replica noticed, every account recounts for a while.
        recount.notice();
        assert_eq!(recount.for_account(8), 1_500);
        assert!(recount.pending.swap(false, Ordering::SeqCst));
    }
}
