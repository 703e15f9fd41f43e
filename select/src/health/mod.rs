//! Account health as the engine sees it, behind four small traits by kind of state: `Health`
//! (blocks, breakers, unauthorized counts, the reads selection makes), `Windows` (the usage
//! windows the upstreams report, docs/DESIGN.md §5), `Bindings` (sticky sessions, response ids)
//! and `Locks` (the confirmation lock, the token-refresh lock), joined as `HealthStore`. Two stores implement all three: Redis (`redis/`, shared by every selector
//! replica) and memory (`memory/`, one process: the relay's standalone mode). Both keep the same
//! semantics and run the same test suite (`selector-svc/tests/health_suite.rs`).
//!
//! In both, a hard block is admission's cooldown, so admission refuses the account in the same
//! step that takes a slot, and the live lease count is admission's.

use async_trait::async_trait;

use poolgate_core::AccountId;
use poolgate_core::windows::WindowReading;

pub use poolgate_core::health::{AccountHealth, Breaker};
pub use poolgate_runtime::error::StateError;

mod memory;
mod redis;

pub use memory::InProcessHealth;
pub use redis::RedisHealth;

/// What the breaker did with a broken outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerChange {
    /// Counted; still closed.
    Counted(u32),
    /// Opened (threshold reached) for this many ms.
    Opened(u64),
    /// The half-open probe failed: re-opened for this many ms (doubled, capped).
    Reopened(u64),
    /// Already open.
    StillOpen,
}

/// A block as operators see it.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockInfo {
    pub account_id: AccountId,
    pub kind: &'static str,
    pub class: String,
    pub status: u16,
    pub reason: String,
    pub remaining_ms: u64,
}

impl BlockInfo {
    /// Whether this is the "confirming" hard block a running confirmation set
    /// (`confirmations.rs`): the `confirming` input of [`poolgate_core::health::LiveStatus::of`].
    pub fn is_confirming(&self) -> bool {
        self.kind == "hard" && poolgate_core::health::is_confirming_reason(&self.reason)
    }
}

/// An account's hard block as it stands now ([`Health::hard_blocks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HardBlock {
    /// None (lifted, or never set).
    None,
    /// The "confirming" block of a running confirmation (`confirmations.rs`).
    Confirming,
    /// Any other hard block.
    Other,
}

/// What selection, outcomes and the admin API keep per account outside the config: blocks,
/// breakers and unauthorized counts. Times are the store's clock (Redis `TIME`, or the
/// process's).
#[async_trait]
pub trait Health: Send + Sync + 'static {
    /// The store's clock, ms since the epoch.
    async fn now(&self) -> Result<i64, StateError>;

    /// Load, blocks and breakers of `ids`, in the order asked (one round trip on Redis).
    async fn read_batch(&self, ids: &[AccountId]) -> Result<Vec<AccountHealth>, StateError>;

    /// One account (the fallback when a batch read fails).
    async fn read_one(&self, id: AccountId) -> Result<AccountHealth, StateError>;

    /// Hard block (admission's cooldown), keeping a later deadline. Returns the block left.
    async fn hard_block(
        &self,
        id: AccountId,
        ttl_ms: u64,
        class: &str,
        status: u16,
        reason: &str,
    ) -> Result<u64, StateError>;

    /// Soft block (reorders only), keeping a later deadline. Returns the block left.
    async fn soft_block(
        &self,
        id: AccountId,
        ttl_ms: u64,
        class: &str,
        status: u16,
        reason: &str,
    ) -> Result<u64, StateError>;

    /// Counts a broken outcome toward the breaker: opens it at `threshold` for `open_ms`; a
    /// failure once the open period ended (half-open) reopens it for twice as long, capped at
    /// `max_open_ms`.
    async fn breaker_failure(
        &self,
        id: AccountId,
        threshold: u32,
        open_ms: u64,
        max_open_ms: u64,
    ) -> Result<BreakerChange, StateError>;

    /// A success closes the breaker and resets its count. Returns whether it was open/half-open.
    async fn breaker_success(&self, id: AccountId) -> Result<bool, StateError>;

    /// Counts an unauthorized outcome; returns how many fell in the window.
    async fn count_unauthorized(&self, id: AccountId, window_ms: u64) -> Result<u32, StateError>;

    /// Clears hard and soft blocks, the breaker and the unauthorized count.
    async fn clear(&self, id: AccountId) -> Result<(), StateError>;

    /// Every hard, soft and breaker block among `ids`.
    async fn list_blocks(&self, ids: &[AccountId]) -> Result<Vec<BlockInfo>, StateError>;

    /// The hard block each of `ids` holds now, in the order asked: what an empty plan asks, to
    /// tell a confirmation (or a block lifted since the reading) from a block (one round trip
    /// on Redis).
    async fn hard_blocks(&self, ids: &[AccountId]) -> Result<Vec<HardBlock>, StateError> {
        let blocks = self.list_blocks(ids).await?;
        Ok(ids
            .iter()
            .map(|id| {
                match blocks
                    .iter()
                    .find(|block| block.account_id == *id && block.kind == "hard")
                {
                    None => HardBlock::None,
                    Some(block) if block.is_confirming() => HardBlock::Confirming,
                    Some(_) => HardBlock::Other,
                }
            })
            .collect())
    }

    /// Hard-blocks an account while its confirmation runs; returns the value to lift it with.
    async fn block_confirming(
        &self,
        id: AccountId,
        ttl_ms: u64,
        class: &str,
        status: u16,
        owner: &str,
    ) -> Result<String, StateError>;

    /// Lifts the "confirming" hard block, unless another block replaced it meanwhile.
    async fn unblock_confirming(&self, id: AccountId, value: &str) -> Result<(), StateError>;
}

/// Which account a session or a response id is bound to.
#[async_trait]
pub trait Bindings: Send + Sync + 'static {
    async fn sticky_get(&self, group: &str, session: &str)
    -> Result<Option<AccountId>, StateError>;

    /// Binds and returns the previous binding.
    async fn sticky_set(
        &self,
        group: &str,
        session: &str,
        id: AccountId,
        ttl_ms: u64,
    ) -> Result<Option<AccountId>, StateError>;

    /// Refreshes a binding's TTL (nothing when there is no binding).
    async fn sticky_touch(&self, group: &str, session: &str, ttl_ms: u64)
    -> Result<(), StateError>;

    /// Drops a binding; returns whether there was one.
    async fn sticky_drop(&self, group: &str, session: &str) -> Result<bool, StateError>;

    async fn response_get(&self, response_id: &str) -> Result<Option<AccountId>, StateError>;

    async fn response_set(
        &self,
        response_id: &str,
        id: AccountId,
        ttl_ms: u64,
    ) -> Result<(), StateError>;

    /// Since when (ms since the epoch) this store has held every binding it was given: a store
    /// that lost its bindings (Redis wiped, the in-process store restarted) starts anew at
    /// `now_ms`. A binding older than that may be gone, so a response id bound to no one is
    /// unverifiable until the bindings' ttl has passed since (docs/DESIGN.md §3, "When Redis is
    /// wiped"). `i64::MIN`: never lost (a view that asks the selector for what it lacks).
    async fn kept_since_ms(&self, _now_ms: i64) -> Result<i64, StateError> {
        Ok(i64::MIN)
    }
}

/// The per-account locks that make one replica act for all: the confirmation lock (its value
/// names the confirmation's state, `confirmations.rs`) and the token-refresh lock.
#[async_trait]
pub trait Locks: Send + Sync + 'static {
    /// Takes the account's confirmation lock (see `confirmations.rs`): whether this owner took it.
    async fn lock_confirm(
        &self,
        id: AccountId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, StateError>;

    /// Releases the confirmation lock, if this owner still holds it.
    async fn unlock_confirm(&self, id: AccountId, owner: &str) -> Result<(), StateError>;

    /// Keeps the confirmation lock `ms` longer (from now) and then lets it lapse, if this owner
    /// still holds it: readings cached on every replica still show the old breaker state for a
    /// moment, and must not start a second check.
    async fn linger_confirm(&self, id: AccountId, owner: &str, ms: u64) -> Result<(), StateError>;

    /// The confirmation lock's value while it is held (`confirmations.rs` names its states:
    /// running, quiet, freshly refreshed), for reports that arrive meanwhile.
    async fn confirm_state(&self, id: AccountId) -> Result<Option<String>, StateError>;

    /// Replaces the confirmation lock's value `from` with `to`, held `ttl_ms` from now, if it
    /// still holds `from`: whether it did.
    async fn swap_confirm(
        &self,
        id: AccountId,
        from: &str,
        to: &str,
        ttl_ms: u64,
    ) -> Result<bool, StateError>;

    /// Takes the account's token-refresh lock: whether this owner took it.
    async fn lock_refresh(
        &self,
        id: AccountId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, StateError>;

    /// Releases the token-refresh lock, if this owner still holds it.
    async fn unlock_refresh(&self, id: AccountId, owner: &str) -> Result<(), StateError>;

    /// Takes the account's usage-read lock for `ttl_ms` (never released: it lapses), so one
    /// replica reads an account's usage endpoint once per cadence for all
    /// (`engine/usage_reads.rs`): whether this owner took it.
    async fn lock_usage_read(
        &self,
        id: AccountId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, StateError>;
}

/// An account's usage windows are kept this long after their last write: past the longest
/// window (a week), so a reading is never lost while it can still say something.
pub const WINDOWS_TTL_MS: u64 = 8 * 24 * 3_600_000;

/// A reading whose reset passed more than this long ago is dropped when its account is next
/// written: it reads as empty anyway (docs/DESIGN.md §5), so it is kept only long enough for an
/// operator to see what the last window ended at.
pub const WINDOWS_KEPT_PAST_RESET_MS: i64 = 24 * 3_600_000;

/// The usage windows each account's answers reported (docs/DESIGN.md §5, "Spending what expires
/// first"): the latest standing per window (kind and scope), shared by every replica.
#[async_trait]
pub trait Windows: Send + Sync + 'static {
    /// Merges `readings` into the account's: per window (kind and scope) a reading replaces the
    /// kept one as `poolgate_core::windows::supersedes` says (a later period, or further along
    /// in the same one, so a late answer never rolls a window back; a per-minute limit: observed
    /// last, a tie to the one written last); readings whose reset passed more than
    /// [`WINDOWS_KEPT_PAST_RESET_MS`] ago are dropped. The account's readings lapse
    /// [`WINDOWS_TTL_MS`] after the last write.
    async fn store_windows(
        &self,
        id: AccountId,
        readings: &[WindowReading],
    ) -> Result<(), StateError>;

    /// The stored readings of `ids`, in the order asked (one round trip on Redis); an account
    /// never written has none.
    async fn read_windows(&self, ids: &[AccountId]) -> Result<Vec<Vec<WindowReading>>, StateError>;
}

/// The four kinds of state from one store: what the engine and its confirmations use (the load
/// cache needs only `Health`, the token refresher only `Locks`).
pub trait HealthStore: Health + Windows + Bindings + Locks {}

impl<T: Health + Windows + Bindings + Locks> HealthStore for T {}

/// Whether a reading is still worth keeping at `now_ms`.
fn window_kept(reading: &WindowReading, now_ms: i64) -> bool {
    reading
        .reset_at_ms
        .saturating_add(WINDOWS_KEPT_PAST_RESET_MS)
        > now_ms
}

/// `stored` with `incoming` merged in, as [`Windows::store_windows`] says (the memory store;
/// the Redis store's script does the same).
fn merge_windows(stored: &mut Vec<WindowReading>, incoming: &[WindowReading], now_ms: i64) {
    poolgate_core::windows::merge_readings(stored, incoming);
    stored.retain(|reading| window_kept(reading, now_ms));
}

/// How a block is recorded (the value of the cooldown / soft-block key): class, status, and
/// the reason cut to 200 characters.
pub(crate) fn block_value(class: &str, status: u16, reason: &str) -> String {
    let reason: String = reason.chars().take(200).collect();
    format!("{class}|{status}|{reason}")
}

fn parse_block_value(value: &str) -> (String, u16, String) {
    let mut parts = value.splitn(3, '|');
    let class = parts.next().unwrap_or_default().to_owned();
    let status = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let reason = parts.next().unwrap_or_default().to_owned();
    (class, status, reason)
}

/// The reason an open breaker is listed with.
fn breaker_reason(failures: u32) -> String {
    format!("{failures} consecutive broken outcomes")
}
