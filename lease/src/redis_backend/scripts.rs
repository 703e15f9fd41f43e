//! The admission Lua scripts (`scripts/*.lua`), each with its KEYS/ARGV contract, joined to the
//! preludes and hashed once.
//!
//! Every script starts with the clock's `TIME_PRELUDE` (so `now` is Redis `TIME`) and returns
//! `now` as its reply's last element.

use poolgate_runtime::clock::TIME_PRELUDE;
use redis::Script;

/// Shared Lua prelude (after the clock's): `extend`, which makes a key live at least `ms` more
/// (with slack: twice that, set only when `PTTL` says less is left, so most calls are one
/// read-only command; a key's expiry is garbage collection, never a decision), the RPM check, the
/// session-window spend.
const PRELUDE: &str = include_str!("scripts/prelude.lua");

/// Shared by the lease scripts: whether a lease is live, and whether its release fence is up.
/// The fence (KEYS `released`: member = lease id, score = fence expiry) is raised by every
/// release path, so no heartbeat or resume brings a released lease back. Raising one prunes the
/// set's expired fences on about one call in eight (`now % 8 == 0`): an expired fence reads as
/// down whether it is pruned or not, and the set stays bounded by the fences of a few periods.
const LEASE_PRELUDE: &str = include_str!("scripts/lease_prelude.lua");

/// Shared by the scripts that gate and charge a client key (`ClientKeyKeys`, 8 KEYS from index k:
/// leases, released, tpm, billed, spend total, day, week, month). `key_check(k, a)` reads ARGV
/// from a: key concurrency limit, TPM limit, TPM window ms, then per budget (total, day, week,
/// month) its limit (micro-USD, 0 = none) and the ms until it resets; it refuses with
/// `key_budget`, `key_tpm` or `key_concurrency`. `key_charge(k, id, a, billed_ms)` reads ARGV from
/// a: tokens, spend micro-USD, TPM window ms, the four counters' ttls (0 = none); it charges once
/// per lease id (the `billed` set), so a retried release charges nothing more. The TPM is a hash
/// of per-second buckets (field = second, value = tokens).
const KEY_PRELUDE: &str = include_str!("scripts/key_prelude.lua");

/// KEYS: leases, rpm, cooldown, window, user rpm (on a Cluster, where the user's key is in
/// another slot, the account rpm key again with a user limit of 0), kept, then on one node the
/// 8 key slot keys (see `KEY_PRELUDE`).
/// ARGV: lease id, ttl ms, concurrency limit, rpm limit, window limit (micro-USD, 0 = none),
/// rpm window ms, session window ms, ignore cooldown (1/0), user rpm limit (0 = none), keyed
/// (1/0: the key slot joins this script), recount ms (> 0: the caller saw this account's `kept`
/// marker, so a missing one means Redis lost the account's state), then the key's gate ARGV
/// (see `KEY_PRELUDE`).
/// Returns {reason, retry_ms, now}; reason 'granted' when the lease (in the account's and the
/// key's slot) and the RPM events (account and user, member = lease id) were added. A refusal at
/// any gate writes nothing, so a refused acquire is this one round trip; the one write before
/// the gates is the `kept` marker: set (to 0) where missing, or, where missing and the caller
/// saw it, set to now + recount and the acquire refused 'wiped'; while it is in the future every
/// acquire is refused 'recounting' (docs/DESIGN.md §3, "When Redis is wiped").
const ACQUIRE: &str = include_str!("scripts/acquire.lua");

/// KEYS: an RPM ZSET (account or user). ARGV: event id, limit, window ms.
/// Returns {charged (1/0), retry_ms, now}. Idempotent by event id: an event already charged
/// answers charged and counts once.
const CHARGE_RPM: &str = include_str!("scripts/charge_rpm.lua");

/// KEYS: leases, released, kept (the account's marker; a placeholder in the slot when ARGV 6 is
/// 0), and on one node for a keyed lease the key's leases and released.
/// ARGV: lease id, ttl ms, mode ('1': a missing lease may be re-added with room, '0': never,
/// '2': only while the account recounts), concurrency limit (<= 0: unlimited), key concurrency
/// limit, marker (1: KEYS[3] is the account's `kept`; 0: a key slot's renewal on a Cluster,
/// with the key's two keys as if they were an account's), recount ms.
/// Returns {state, now}: 1 = renewed, 2 = restored (was missing or expired, and the account had
/// room), 3 = lost: released (fence up), 4 = lost: no room, 5 = lost: expired (no restore),
/// 6 = restored: the lease and the account's marker were both gone, so Redis lost the account's
/// state, and the account now recounts for `recount` ms, 7 = restored while the account
/// recounts (whatever the limit: the holders of a wipe's leases put them back), 8 = not restored
/// (mode '2' and the account does not recount). A lost lease writes nothing.
const RENEW: &str = include_str!("scripts/renew.lua");

/// KEYS: leases, holders, released (and on one node for a keyed lease, the key's leases and
/// released). ARGV: lease id, ttl ms.
/// Returns {holder epoch, now}; 0 = the lease is unknown or expired, -1 = it was released (fence
/// up). The caller becomes the lease's holder, so the stream it replaces can no longer orphan
/// it; a resume within the orphan grace lowers the fence the orphaning raised.
const RESUME: &str = include_str!("scripts/resume.lua");

/// KEYS: leases, window, holders, released, waiters (and on one node for a keyed lease, the 8
/// key slot keys). ARGV: lease id, spend micro-USD, session window ms, fence ms, the
/// publisher's wake tag, charge the key (1/0), then the key's charge ARGV (see `KEY_PRELUDE`).
/// Returns {removed (1/0), now}. Raises the release fence whether or not the lease was still
/// there: a lease released after it expired must not come back either. A release that freed a
/// live slot of an account with live waiters publishes `<tag> <lease id>` on
/// `keys::LEASE_WAKE_CHANNEL`, so replicas whose waiters wait for it try at once instead of at
/// their next poll (`wake.rs`).
const RELEASE: &str = include_str!("scripts/release.lua");

/// KEYS: leases, holders, released (and on one node for a keyed lease, the key's leases and
/// released). ARGV: lease id, grace ms, holder epoch, fence ms. Cuts the expiry to now + grace
/// (never lengthens it) if the caller is still the lease's holder, and raises the release fence
/// from that expiry, on the key's slot too. Returns {cut (1/0), now}.
const ORPHAN: &str = include_str!("scripts/orphan.lua");

/// Cluster only, on the key's slot. KEYS: the 8 key slot keys. ARGV: lease id, ttl ms, then the
/// key's gate ARGV. Returns {reason, retry_ms, now}; 'granted' added the lease to the key's slot
/// (the engine's backend refunds it with `KEY_RELEASE` when the account refuses).
const KEY_ACQUIRE: &str = include_str!("scripts/key_acquire.lua");

/// Cluster only, on the key's slot. KEYS: the 8 key slot keys. ARGV: lease id, 'release' or
/// 'refund' (removes the lease only: an acquire the account refused), fence ms, charge (1/0),
/// then the key's charge ARGV. Returns {removed, now}.
const KEY_RELEASE: &str = include_str!("scripts/key_release.lua");

/// Cluster only, on the key's slot. KEYS: key leases, key released. ARGV: lease id, grace ms,
/// fence ms. Follows the account's orphan cut (made first, by the holder).
const KEY_ORPHAN: &str = include_str!("scripts/key_orphan.lua");

/// KEYS: a key's budget counter. ARGV: micro-USD, ttl ms (0 = none). Sets it only when absent.
/// Returns {set (1/0), now}.
const SEED_BUDGET: &str = include_str!("scripts/seed_budget.lua");

/// KEYS: window. ARGV: spend micro-USD, session window ms. Returns {spend in window, now}.
const RECORD_SPEND: &str = include_str!("scripts/record_spend.lua");

/// KEYS: cooldown. ARGV: ttl ms. Keeps the later of the existing and the new deadline.
const SET_COOLDOWN: &str = include_str!("scripts/set_cooldown.lua");

/// KEYS: waiters. ARGV: waiter id, max waiting, ttl ms.
/// Returns {position, now}; position 0 = the queue is full. Registration is atomic, so a burst
/// of waiters never registers more than the bound.
const REGISTER_WAITER: &str = include_str!("scripts/register_waiter.lua");

/// KEYS: leases, rpm (the account's, or a key's leases twice with no RPM pairs). ARGV: n leases, then (id, ttl ms) pairs, then (id, age ms) RPM pairs.
/// Writes back what a replica admitted on its own while Redis was away.
const RESTORE: &str = include_str!("scripts/restore.lua");

/// KEYS: registry, reports. ARGV: member, ttl ms, report (`<policy>|<state>`), reports kept ms.
/// Heartbeats this replica, writes its report stamped with `now` (`|<now>`), drops reports not
/// written for longer than kept, and returns the live members and whether this replica's own
/// entry was there (live) before.
const REGISTRY_HEARTBEAT: &str = include_str!("scripts/registry_heartbeat.lua");

/// KEYS: registry, reports. Returns {members with their expiry (`WITHSCORES`), the reports
/// (`HGETALL`), now}. Reads only.
const REGISTRY_READ: &str = include_str!("scripts/registry_read.lua");

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
    pub(super) registry_read: Script,
    pub(super) key_acquire: Script,
    pub(super) key_release: Script,
    pub(super) key_orphan: Script,
    pub(super) seed_budget: Script,
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
        let keyed_script = |body: &str| {
            Script::new(&format!(
                "{TIME_PRELUDE}\n{PRELUDE}\n{LEASE_PRELUDE}\n{KEY_PRELUDE}\n{body}"
            ))
        };
        Scripts {
            acquire: keyed_script(ACQUIRE),
            charge_rpm: script(CHARGE_RPM),
            renew: lease_script(RENEW),
            resume: lease_script(RESUME),
            release: keyed_script(RELEASE),
            orphan: lease_script(ORPHAN),
            record_spend: script(RECORD_SPEND),
            set_cooldown: script(SET_COOLDOWN),
            register_waiter: script(REGISTER_WAITER),
            restore: script(RESTORE),
            registry_heartbeat: script(REGISTRY_HEARTBEAT),
            registry_read: script(REGISTRY_READ),
            key_acquire: keyed_script(KEY_ACQUIRE),
            key_release: keyed_script(KEY_RELEASE),
            key_orphan: lease_script(KEY_ORPHAN),
            seed_budget: script(SEED_BUDGET),
        }
    }
}
