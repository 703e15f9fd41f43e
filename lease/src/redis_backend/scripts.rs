//! The admission Lua scripts (`scripts/*.lua`), each with its KEYS/ARGV contract, joined to the
//! preludes and hashed once.
//!
//! Every script starts with the clock's `TIME_PRELUDE` (so `now` is Redis `TIME`) and returns
//! `now` as its reply's last element.

use poolgate_runtime::clock::TIME_PRELUDE;
use redis::Script;

/// Shared Lua prelude (after the clock's): a PEXPIRE that only ever lengthens, the RPM check,
/// the session-window spend.
const PRELUDE: &str = include_str!("scripts/prelude.lua");

/// Shared by the lease scripts: whether a lease is live, and whether its release fence is up.
/// The fence (KEYS `released`: member = lease id, score = fence expiry) is raised by every
/// release path, so no heartbeat or resume brings a released lease back.
const LEASE_PRELUDE: &str = include_str!("scripts/lease_prelude.lua");

/// KEYS: leases, rpm, cooldown, window, user rpm (on a Cluster, where the user's key is in
/// another slot, the account rpm key again with a user limit of 0).
/// ARGV: lease id, ttl ms, concurrency limit, rpm limit, window limit (micro-USD, 0 = none),
/// rpm window ms, session window ms, ignore cooldown (1/0), user rpm limit (0 = none).
/// Returns {reason, retry_ms, now}; reason 'granted' when the lease and the RPM events (account
/// and user, member = lease id) were added. A refusal at any gate writes nothing, so a refused
/// acquire is this one round trip.
const ACQUIRE: &str = include_str!("scripts/acquire.lua");

/// KEYS: an RPM ZSET (account or user). ARGV: event id, limit, window ms.
/// Returns {charged (1/0), retry_ms, now}. Idempotent by event id: an event already charged
/// answers charged and counts once.
const CHARGE_RPM: &str = include_str!("scripts/charge_rpm.lua");

/// KEYS: leases, released. ARGV: lease id, ttl ms, restore ('1': a missing lease may be re-added
/// with room, '0': never), concurrency limit (<= 0: unlimited).
/// Returns {state, now}: 1 = renewed, 2 = restored (was missing or expired, and the account had
/// room), 3 = lost: released (fence up), 4 = lost: no room, 5 = lost: expired (no restore). A
/// lost lease writes nothing.
const RENEW: &str = include_str!("scripts/renew.lua");

/// KEYS: leases, holders, released. ARGV: lease id, ttl ms.
/// Returns {holder epoch, now}; 0 = the lease is unknown or expired, -1 = it was released (fence
/// up). The caller becomes the lease's holder, so the stream it replaces can no longer orphan
/// it; a resume within the orphan grace lowers the fence the orphaning raised.
const RESUME: &str = include_str!("scripts/resume.lua");

/// KEYS: leases, window, holders, released. ARGV: lease id, spend micro-USD, session window ms,
/// fence ms. Returns {removed (1/0), now}. Raises the release fence whether or not the lease was
/// still there: a lease released after it expired must not come back either.
const RELEASE: &str = include_str!("scripts/release.lua");

/// KEYS: leases, holders, released. ARGV: lease id, grace ms, holder epoch, fence ms. Cuts the
/// expiry to now + grace (never lengthens it) if the caller is still the lease's holder, and
/// raises the release fence from that expiry.
const ORPHAN: &str = include_str!("scripts/orphan.lua");

/// KEYS: window. ARGV: spend micro-USD, session window ms. Returns {spend in window, now}.
const RECORD_SPEND: &str = include_str!("scripts/record_spend.lua");

/// KEYS: cooldown. ARGV: ttl ms. Keeps the later of the existing and the new deadline.
const SET_COOLDOWN: &str = include_str!("scripts/set_cooldown.lua");

/// KEYS: waiters. ARGV: waiter id, max waiting, ttl ms.
/// Returns {position, now}; position 0 = the queue is full. Registration is atomic, so a burst
/// of waiters never registers more than the bound.
const REGISTER_WAITER: &str = include_str!("scripts/register_waiter.lua");

/// KEYS: leases, rpm. ARGV: n leases, then (id, ttl ms) pairs, then (id, age ms) RPM pairs.
/// Writes back what a replica admitted on its own while Redis was away.
const RESTORE: &str = include_str!("scripts/restore.lua");

/// KEYS: registry. ARGV: member, ttl ms. Heartbeats this replica and returns the live members.
const REGISTRY_HEARTBEAT: &str = include_str!("scripts/registry_heartbeat.lua");

/// The scripts, hashed once.
pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) charge_rpm: Script,
    pub(super) renew: Script,
    pub(super) resume: Script,
    pub(super) release: Script,
    pub(super) orphan: Script,
    pub(super) record_spend: Script,
    pub(super) set_cooldown: Script,
    pub(super) register_waiter: Script,
    pub(super) restore: Script,
    pub(super) registry_heartbeat: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        // The parts are joined by a newline, so each stays on its own lines and the script text
        // (and its SHA, which `EVALSHA` sends) is what it was when the parts were Rust literals.
        let script = |body: &str| Script::new(&format!("{TIME_PRELUDE}\n{PRELUDE}\n{body}"));
        let lease_script = |body: &str| {
            Script::new(&format!(
                "{TIME_PRELUDE}\n{PRELUDE}\n{LEASE_PRELUDE}\n{body}"
            ))
        };
        Scripts {
            acquire: script(ACQUIRE),
            charge_rpm: script(CHARGE_RPM),
            renew: lease_script(RENEW),
            resume: lease_script(RESUME),
            release: lease_script(RELEASE),
            orphan: lease_script(ORPHAN),
            record_spend: script(RECORD_SPEND),
            set_cooldown: script(SET_COOLDOWN),
            register_waiter: script(REGISTER_WAITER),
            restore: script(RESTORE),
            registry_heartbeat: script(REGISTRY_HEARTBEAT),
        }
    }
}
