//! The Redis key layout (docs/DESIGN.md §3): the contract between admission (which writes leases
//! and reads cooldowns) and the selector (which reads leases and writes cooldowns).
//!
//! Every key of one account carries the hash tag `{a:<account_id>}` so a single Lua script may
//! touch all of them on a Redis Cluster; every key of one user carries `{u:<user>}`, every key of
//! one client key (its limits, docs/DESIGN.md §4) `{k:<api_key_id>}`. Selector-only state lives
//! under `pg:sel:`. No other module spells a key name.

/// Prefix of every poolgate key, so a shared Redis can be scanned or cleaned by prefix.
pub const PREFIX: &str = "pg";

/// The Pub/Sub channel a release publishes on when it freed a slot of an account with waiters
/// (message `<publisher tag> <lease id>`); every admission replica subscribes to it.
pub const LEASE_WAKE_CHANNEL: &str = "pg:lease:wake";

/// The keys of one upstream account, all in the hash slot of `{a:<account_id>}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountKeys {
    /// ZSET: member = lease id, score = lease expiry (ms since the epoch, Redis `TIME`).
    pub leases: String,
    /// ZSET: member = unique event id, score = event time (ms). A rolling minute of acquires and
    /// attempts.
    pub rpm: String,
    /// STRING with a PX expiry: present while the account is hard-blocked. Value = class/reason.
    pub cooldown: String,
    /// ZSET: member = waiter id, score = waiter expiry (ms), so a dead replica's waiters expire.
    pub waiters: String,
    /// HASH: `start` (window start, ms) and `spend` (micro-USD in the window).
    pub window: String,
    /// HASH: lease id -> holder epoch, for leases that were resumed: a stream that ended only
    /// orphans the lease if it is still the current holder.
    pub holders: String,
    /// ZSET: member = lease id, score = release fence expiry (ms). Leases ended by a `Release`
    /// (stream or unary) or the orphan grace: no heartbeat or resume brings them back while the
    /// fence is up (at least a lease ttl plus the orphan grace).
    pub released: String,
    /// STRING, expiring a day after the account's last acquire or renewal: present while Redis
    /// keeps the account's state. Value = until when (ms) new acquires wait while the holders of
    /// leases a wipe took put them back (0: none). Missing where an admission replica saw it
    /// means Redis lost the account's state (docs/DESIGN.md §3, "When Redis is wiped").
    pub kept: String,
}

impl AccountKeys {
    pub fn new(account_id: i64) -> Self {
        let tag = format!("{PREFIX}:{{a:{account_id}}}");
        AccountKeys {
            leases: format!("{tag}:leases"),
            rpm: format!("{tag}:rpm"),
            cooldown: format!("{tag}:cooldown"),
            waiters: format!("{tag}:waiters"),
            window: format!("{tag}:window"),
            holders: format!("{tag}:holders"),
            released: format!("{tag}:released"),
            kept: format!("{tag}:kept"),
        }
    }

    /// Every key, for tests and for operators cleaning up an account.
    pub fn all(&self) -> [&str; 6] {
        [
            &self.kept,
            &self.leases,
            &self.rpm,
            &self.cooldown,
            &self.waiters,
            &self.window,
        ]
    }
}

/// The keys of one client key's limits (docs/DESIGN.md §4), all in the hash slot of
/// `{k:<api_key_id>}`: on one node the account's scripts take them too, on a Cluster they are
/// another hash slot (charged first, refunded on refusal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientKeyKeys {
    /// ZSET: member = lease id, score = expiry (ms): the key's leases, as the account's.
    pub leases: String,
    /// ZSET: member = lease id, score = release fence expiry (ms).
    pub released: String,
    /// HASH: field = second (Redis time / 1000), value = tokens finished in it.
    pub tpm: String,
    /// ZSET: member = lease id, score = until (ms): leases whose release charged the key.
    pub billed: String,
    /// STRING counters (micro-USD), one per budget period id (`t`, `d:…`, `w:…`, `m:…`): total,
    /// day, week, month, in that order.
    pub spend: [String; 4],
}

impl ClientKeyKeys {
    /// The keys of `api_key_id` with the budget counters of `periods` (total, day, week, month).
    pub fn new(api_key_id: i64, periods: [&str; 4]) -> Self {
        let tag = client_key_tag(api_key_id);
        ClientKeyKeys {
            leases: format!("{tag}:leases"),
            released: format!("{tag}:released"),
            tpm: format!("{tag}:tpm"),
            billed: format!("{tag}:billed"),
            spend: periods.map(|period| client_key_spend(api_key_id, period)),
        }
    }

    /// The key's leases and fences (renew, resume, orphan); the budget counters are the total's.
    pub fn slot_only(api_key_id: i64) -> Self {
        Self::new(api_key_id, ["t"; 4])
    }
}

fn client_key_tag(api_key_id: i64) -> String {
    format!("{PREFIX}:{{k:{api_key_id}}}")
}

/// STRING: a client key's budget counter (micro-USD) for one period id.
pub fn client_key_spend(api_key_id: i64, period_id: &str) -> String {
    format!("{}:spend:{period_id}", client_key_tag(api_key_id))
}

/// ZSET of one user's requests in the rolling minute (member = event id, score = ms).
pub fn user_rpm(user: &str) -> String {
    format!("{PREFIX}:{{u:{user}}}:rpm")
}

/// ZSET of live admission replicas: member = instance id, score = heartbeat expiry (ms). The
/// `divided` failure policy ranks replicas by member order.
pub fn admission_replicas() -> String {
    format!("{PREFIX}:admission:replicas")
}

/// HASH of what admission replicas report of themselves (the operator's status view): field =
/// instance id (the registry's member), value = `<failure policy>|<ok|degraded>|<Redis ms when
/// written>`, written by each replica's heartbeat with its registry entry. Hash-tagged with the
/// registry's whole name, so it shares the registry's slot and one script writes both on a
/// Cluster.
pub fn admission_replica_reports() -> String {
    format!("{{{}}}:reports", admission_replicas())
}

/// Selector-only: soft block of an account (reorders, never excludes).
pub fn soft_block(account_id: i64) -> String {
    format!("{PREFIX}:sel:soft:{account_id}")
}

/// Selector-only: circuit breaker state of an account.
pub fn breaker(account_id: i64) -> String {
    format!("{PREFIX}:sel:breaker:{account_id}")
}

/// Selector-only: the half-open breaker's probe token (one request through at a time).
pub fn breaker_probe(account_id: i64) -> String {
    format!("{PREFIX}:sel:probe:{account_id}")
}

/// Selector-only: ZSET of recent unauthorized outcomes (3 within an hour mark the account `error`).
pub fn unauthorized_events(account_id: i64) -> String {
    format!("{PREFIX}:sel:unauth:{account_id}")
}

/// Selector-only: HASH of an account's usage windows (docs/DESIGN.md §5): field = the window
/// (kind and scope, JSON), value = its newest reading (JSON), with a PX expiry renewed on every
/// write. In the account's hash slot, so the script merging a write touches one slot.
pub fn usage_windows(account_id: i64) -> String {
    format!("{PREFIX}:sel:{{a:{account_id}}}:windows")
}

/// Selector-only: sticky binding `group + session hash -> account`.
pub fn sticky_binding(group: &str, session_hash: &str) -> String {
    format!("{PREFIX}:sel:sticky:{}:{group}:{session_hash}", group.len())
}

/// Selector-only: STRING, since when (ms since the epoch) Redis has held every binding: set
/// when missing (the first start, after a wipe); no expiry (one key). A response id bound to no
/// one is unverifiable for the bindings' ttl after it (docs/DESIGN.md §3).
pub fn bindings_since() -> String {
    format!("{PREFIX}:sel:bindings-since")
}

/// Selector-only: `response id -> account` for the Responses API `previous_response_id`.
pub fn response_binding(response_id: &str) -> String {
    format!("{PREFIX}:sel:resp:{response_id}")
}

/// Selector-only: lock held while one replica confirms a billing-class answer with its probe
/// (or checks a half-open breaker): one confirmation per account, cluster-wide.
pub fn confirm_lock(account_id: i64) -> String {
    format!("{PREFIX}:sel:confirm:{account_id}")
}

/// Selector-only: lock held while one replica refreshes an account's OAuth token.
pub fn token_refresh_lock(account_id: i64) -> String {
    format!("{PREFIX}:sel:tokenlock:{account_id}")
}

/// Selector-only: lock one replica takes to read an account's usage endpoint; it lapses after
/// the read cadence, so the replicas read each account once per cadence between them.
pub fn usage_read_lock(account_id: i64) -> String {
    format!("{PREFIX}:sel:usageread:{account_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash tag is the text between the first `{` and the next `}` (Redis Cluster spec).
    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').map(|i| i + 1).unwrap_or(0);
        let close = key[open..].find('}').map(|i| open + i).unwrap_or(key.len());
        &key[open..close]
    }

    #[test]
    fn every_account_key_shares_the_account_hash_tag() {
        let keys = AccountKeys::new(42);
        for key in keys.all() {
            assert_eq!(hash_tag(key), "a:42", "{key}");
        }
        assert_ne!(AccountKeys::new(4).leases, AccountKeys::new(42).leases);
    }

    #[test]
    fn usage_windows_are_selector_keys_in_the_account_hash_slot() {
        let key = usage_windows(42);
        assert_eq!(hash_tag(&key), "a:42");
        assert!(key.starts_with("pg:sel:"), "{key}");
        assert_ne!(usage_windows(4), usage_windows(42));
    }

    #[test]
    fn every_client_key_key_shares_the_key_hash_tag() {
        let keys = ClientKeyKeys::new(7, ["t", "d:2026-12-02", "w:2026-11-30", "m:2026-12"]);
        let all = [&keys.leases, &keys.released, &keys.tpm, &keys.billed]
            .into_iter()
            .chain(&keys.spend);
        for key in all {
            assert_eq!(hash_tag(key), "k:7", "{key}");
        }
        assert_eq!(keys.spend[1], client_key_spend(7, "d:2026-12-02"));
        assert_eq!(keys.leases, "pg:{k:7}:leases");
        assert_ne!(
            ClientKeyKeys::slot_only(7).leases,
            ClientKeyKeys::slot_only(71).leases
        );
    }

    #[test]
    fn replica_reports_share_the_registrys_hash_slot() {
        let reports = admission_replica_reports();
        assert_eq!(hash_tag(&reports), hash_tag(&admission_replicas()));
        assert_eq!(reports, "{pg:admission:replicas}:reports");
    }

    #[test]
    fn user_keys_are_tagged_by_user() {
        assert_eq!(hash_tag(&user_rpm("alice")), "u:alice");
        assert_ne!(user_rpm("a"), user_rpm("b"));
    }

    #[test]
    fn sticky_keys_cannot_collide_across_group_boundaries() {
        assert_ne!(sticky_binding("a:b", "c"), sticky_binding("a", "b:c"));
    }
}
