//! Plain admission types: what a lease asks for, how it is named, and why it may be refused.
//! Nothing here knows gRPC or Redis.

use std::fmt;
use std::time::Duration;

use crate::{AccountId, MAX_NAME_BYTES};

/// Longest `wait_ms` an acquire may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// Per-user request limit, charged only on a request's first granted lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserLimit {
    pub user_id: String,
    pub rpm_limit: i32,
}

/// A client key's own limits (docs/DESIGN.md §4), checked and charged with the account's. Every
/// limit <= 0: none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyLimits {
    pub api_key_id: i64,
    /// Requests of the key in flight at once: a lease slot like an account's.
    pub concurrency_limit: i32,
    /// Input + output tokens (cache reads and writes count as input) over a rolling minute.
    pub tpm_limit: i64,
    /// Spend budgets in micro-USD: in total and per calendar day, week and month (the
    /// deployment's time zone and week start).
    pub budget_total_micros: i64,
    pub budget_day_micros: i64,
    pub budget_week_micros: i64,
    pub budget_month_micros: i64,
}

impl KeyLimits {
    /// Whether any limit is set (a key without any is never counted).
    pub fn any(&self) -> bool {
        self.concurrency_limit > 0
            || self.tpm_limit > 0
            || self.budget_total_micros > 0
            || self.budget_day_micros > 0
            || self.budget_week_micros > 0
            || self.budget_month_micros > 0
    }

    /// Whether a spend budget is set (a model without a price may be refused to such a key:
    /// docs/DESIGN.md §6, "Prices").
    pub fn has_budget(&self) -> bool {
        self.budget_total_micros > 0
            || self.budget_day_micros > 0
            || self.budget_week_micros > 0
            || self.budget_month_micros > 0
    }
}

/// The terms of one lease: the account's limits as the selector configured them, and what the
/// request brings (user, session, its client key's limits).
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseTerms {
    pub account_id: AccountId,
    /// <= 0: unlimited.
    pub concurrency_limit: i32,
    /// <= 0: unlimited.
    pub rpm_limit: i32,
    /// Present only when a user limit applies (> 0).
    pub user: Option<UserLimit>,
    pub session_hash: Option<String>,
    /// Session window limit in micro-USD; <= 0: unlimited.
    pub session_window_limit_micros: i64,
    /// The session is bound to this account: it may use the sticky reserve.
    pub session_bound: bool,
    /// The selector's confirmation probe: the account's cooldown (the "confirming" hard block
    /// that keeps client traffic away while the probe runs) does not refuse it; every other gate
    /// does. Only in-process callers set it; the gRPC API has no such field.
    pub ignore_cooldown: bool,
    /// Present only when the request's client key has a limit (`KeyLimits::any`).
    pub key: Option<KeyLimits>,
}

impl LeaseTerms {
    /// An account with every limit <= 0 is never leased in Redis (docs/DESIGN.md §4).
    pub fn account_unlimited(&self) -> bool {
        self.concurrency_limit <= 0 && self.rpm_limit <= 0 && self.session_window_limit_micros <= 0
    }

    /// The window spend at which this acquire is refused: the limit, or for a bound session the
    /// limit plus the sticky reserve. 0 when the window is unlimited.
    pub fn effective_window_limit_micros(&self, sticky_reserve: f64) -> i64 {
        if self.session_window_limit_micros <= 0 {
            return 0;
        }
        if self.session_bound {
            (self.session_window_limit_micros as f64 * (1.0 + sticky_reserve)).round() as i64
        } else {
            self.session_window_limit_micros
        }
    }
}

/// A lease id: `<account>.<instance>.<sequence>`, and `.k<api_key_id>` when the lease also
/// holds a slot of its client key (the key has a limit, `KeyLimits::any`). The account (and the
/// key) let any replica find the lease's keys from the id alone (unary `Release`, `Resume`); the
/// random per-process instance id and the sequence keep ids unique across replicas and restarts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseId {
    account_id: AccountId,
    api_key_id: Option<i64>,
    text: String,
}

impl LeaseId {
    pub fn new(account_id: AccountId, instance: &str, sequence: u64) -> Self {
        LeaseId {
            account_id,
            api_key_id: None,
            text: format!("{account_id}.{instance}.{sequence}"),
        }
    }

    /// A lease that also counts against client key `api_key_id` (> 0).
    pub fn keyed(account_id: AccountId, api_key_id: i64, instance: &str, sequence: u64) -> Self {
        LeaseId {
            account_id,
            api_key_id: Some(api_key_id),
            text: format!("{account_id}.{instance}.{sequence}.k{api_key_id}"),
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        if text.len() > MAX_NAME_BYTES {
            return None;
        }
        let mut parts = text.split('.');
        let account_id: AccountId = parts.next()?.parse().ok()?;
        let instance = parts.next()?;
        let sequence = parts.next()?;
        let api_key_id = match parts.next() {
            None => None,
            Some(key) => {
                let digits = key.strip_prefix('k')?;
                if !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                Some(digits.parse::<i64>().ok().filter(|id| *id > 0)?)
            }
        };
        let valid = account_id > 0
            && !instance.is_empty()
            && instance.bytes().all(|b| b.is_ascii_alphanumeric())
            && sequence.parse::<u64>().is_ok()
            && parts.next().is_none();
        valid.then(|| LeaseId {
            account_id,
            api_key_id,
            text: text.to_owned(),
        })
    }

    pub fn account_id(&self) -> AccountId {
        self.account_id
    }

    /// The client key whose slot this lease also holds, if any.
    pub fn api_key_id(&self) -> Option<i64> {
        self.api_key_id
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Why admission said no. A refusal is an answer, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenyReason {
    Concurrency,
    Rpm,
    UserRpm,
    SessionWindow,
    Cooling,
    QueueFull,
    BackendUnavailable,
    LeaseUnknown,
    /// The client key holds as many leases as its concurrency limit (waitable).
    KeyConcurrency,
    /// The client key's tokens of the rolling minute reached its TPM limit (waitable: the
    /// retry-after is when enough of them age out).
    KeyTpm,
    /// A spend budget of the client key is used up; the retry-after is the period's reset (0 for
    /// the total budget, which never resets). Not waitable.
    KeyBudget,
}

impl DenyReason {
    /// Stable lowercase name, used in metric labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::Concurrency => "concurrency",
            DenyReason::Rpm => "rpm",
            DenyReason::UserRpm => "user_rpm",
            DenyReason::SessionWindow => "session_window",
            DenyReason::Cooling => "cooling",
            DenyReason::QueueFull => "queue_full",
            DenyReason::BackendUnavailable => "backend_unavailable",
            DenyReason::LeaseUnknown => "lease_unknown",
            DenyReason::KeyConcurrency => "key_concurrency",
            DenyReason::KeyTpm => "key_tpm",
            DenyReason::KeyBudget => "key_budget",
        }
    }

    /// Whether waiting may turn this refusal into a grant (a slot or an RPM event frees up).
    pub fn is_waitable(self) -> bool {
        matches!(
            self,
            DenyReason::Concurrency
                | DenyReason::Rpm
                | DenyReason::KeyConcurrency
                | DenyReason::KeyTpm
        )
    }
}

/// A refusal with a hint of when trying again may succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denial {
    pub reason: DenyReason,
    /// Milliseconds from now; 0 when unknown.
    pub retry_after_ms: u64,
}

impl Denial {
    pub fn new(reason: DenyReason, retry_after_ms: u64) -> Self {
        Denial {
            reason,
            retry_after_ms,
        }
    }
}

/// Why a held lease ended without its holder's `Release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LostReason {
    /// The backend could not renew the lease for a whole ttl. The lease may still be live
    /// elsewhere: resuming on another replica may work.
    BackendUnavailable,
    /// The lease was released (a stream or unary `Release`, or the orphan grace ran out): it
    /// stays released; resuming it would take a slot that is no longer the holder's.
    Released,
    /// The backend had lost the lease (a flush, a restart, an eviction) and the account has no
    /// room to take it back: the slots went to grants made since.
    NoRoom,
    /// The holder's heartbeats stopped for longer than the ttl: the lease expired and its slot
    /// may have been granted (or its release fence may have fallen) since.
    Expired,
}

impl LostReason {
    /// Stable lowercase name, used in metric labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            LostReason::BackendUnavailable => "backend_unavailable",
            LostReason::Released => "released",
            LostReason::NoRoom => "no_room",
            LostReason::Expired => "expired",
        }
    }
}

/// Result of a renewal (a heartbeat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was live; its expiry is now + ttl.
    Renewed,
    /// The backend had lost the lease and the account had room: it was added again.
    Restored,
    /// The lease is not held any more; the holder must stop renewing it.
    Lost(LostReason),
}

/// Result of a `Resume`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumption {
    /// The lease was live; the caller is its holder now (see `LeaseBackend::orphan`).
    Resumed { holder_epoch: u64 },
    /// The lease is unknown or expired.
    Unknown,
    /// The lease was released (its release fence is still up).
    Released,
}

/// Durations and bounds that shape admission. Plain values so tests build them directly.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a lease lives without a heartbeat (default 2 min).
    pub lease_ttl: Duration,
    /// How long a lease whose stream ended without `Release` stays resumable (default 5 s).
    pub orphan_grace: Duration,
    /// The rolling RPM window (60 s; shorter only in tests).
    pub rpm_window: Duration,
    /// Length of an account's session window, from its first spend (default 5 h).
    pub session_window: Duration,
    /// Extra share of the session window a bound session may use (default 0.1).
    pub sticky_reserve: f64,
    /// Waiters per account at most (default 100).
    pub max_waiting: u32,
    /// First poll delay of a waiter (100 ms), doubled up to `wait_poll_max` (1 s).
    pub wait_poll_initial: Duration,
    pub wait_poll_max: Duration,
    /// The time zone client keys' calendar budgets (day, week, month) follow: an IANA name
    /// (default `UTC`). The lease engine checks it at start.
    pub budget_time_zone: String,
    /// The first day of a budget week (default Monday).
    pub budget_week_start: Weekday,
}

/// A day of the week (the budget week's start).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Weekday {
    #[default]
    Monday,
    Tuesday,
    Wednesday,
    Thursday,
    Friday,
    Saturday,
    Sunday,
}

impl Weekday {
    /// Days after Monday (Monday 0, Sunday 6).
    pub fn days_from_monday(self) -> u8 {
        self as u8
    }

    /// A weekday's English name, any case (`--budget-week-start`).
    pub fn parse(text: &str) -> Result<Weekday, String> {
        Ok(match text.to_ascii_lowercase().as_str() {
            "monday" => Weekday::Monday,
            "tuesday" => Weekday::Tuesday,
            "wednesday" => Weekday::Wednesday,
            "thursday" => Weekday::Thursday,
            "friday" => Weekday::Friday,
            "saturday" => Weekday::Saturday,
            "sunday" => Weekday::Sunday,
            _ => return Err("must be a weekday: monday … sunday".into()),
        })
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lease_ttl: Duration::from_secs(120),
            orphan_grace: Duration::from_secs(5),
            rpm_window: Duration::from_secs(60),
            session_window: Duration::from_secs(5 * 3600),
            sticky_reserve: 0.1,
            max_waiting: 100,
            wait_poll_initial: Duration::from_millis(100),
            wait_poll_max: Duration::from_secs(1),
            budget_time_zone: "UTC".to_owned(),
            budget_week_start: Weekday::Monday,
        }
    }
}

/// A validated message from the lease holder.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    Acquire {
        terms: LeaseTerms,
        wait: Duration,
    },
    Resume {
        lease_id: LeaseId,
        terms: LeaseTerms,
    },
    Heartbeat,
    Attempt,
    Release {
        spend_micros: i64,
        /// Input + output tokens the upstream reported (cache reads and writes as input), charged
        /// to the client key's TPM.
        tokens: u64,
    },
}

/// What the lease stream tells the holder.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseEvent {
    Granted {
        lease_id: LeaseId,
        ttl: Duration,
    },
    Denied(Denial),
    Queued {
        position: u32,
    },
    Renewed {
        ttl: Duration,
        restored: bool,
    },
    /// A heartbeat the backend could not take; the lease holds for `left` more.
    NotRenewed {
        left: Duration,
    },
    AttemptAccepted,
    Released,
    /// The lease is not held any more; ends the stream.
    Lost {
        reason: LostReason,
        detail: String,
    },
}

/// What a lease channel message asks of one conversation (docs/DESIGN.md §4): the
/// conversation's next message, or the holder's side of it ending (as a lease stream's client
/// half closing).
#[derive(Debug, Clone, PartialEq)]
pub enum ChannelRequest {
    Message(ClientMessage),
    Close,
}

/// A lease channel conversation's tag, chosen by the holder: never 0.
pub type ChannelTag = std::num::NonZeroU64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_round_trip_and_reject_garbage() {
        let id = LeaseId::new(7, "ab12", 3);
        assert_eq!(id.as_str(), "7.ab12.3");
        assert_eq!(LeaseId::parse("7.ab12.3"), Some(id));
        for bad in [
            "", "7", "7.ab12", "0.ab.1", "-1.ab.1", "7..1", "7.a-b.1", "7.ab.x", "7.ab.1.2",
        ] {
            assert_eq!(LeaseId::parse(bad), None, "{bad:?}");
        }
        assert_eq!(LeaseId::parse(&format!("7.{}.1", "a".repeat(200))), None);
    }

    #[test]
    fn keyed_lease_ids_name_their_key_and_round_trip() {
        let id = LeaseId::keyed(7, 42, "ab12", 3);
        assert_eq!(id.as_str(), "7.ab12.3.k42");
        assert_eq!(id.api_key_id(), Some(42));
        assert_eq!(LeaseId::parse("7.ab12.3.k42"), Some(id));
        assert_eq!(
            LeaseId::parse("7.ab12.3").and_then(|id| id.api_key_id()),
            None
        );
        for bad in [
            "7.ab.1.42",
            "7.ab.1.k",
            "7.ab.1.k0",
            "7.ab.1.k-3",
            "7.ab.1.k+3",
            "7.ab.1.kx",
        ] {
            assert_eq!(LeaseId::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bound_sessions_get_the_sticky_reserve() {
        let mut terms = LeaseTerms {
            account_id: 1,
            concurrency_limit: 0,
            rpm_limit: 0,
            user: None,
            session_hash: None,
            session_window_limit_micros: 10_000_000,
            session_bound: false,
            ignore_cooldown: false,
            key: None,
        };
        assert_eq!(terms.effective_window_limit_micros(0.1), 10_000_000);
        terms.session_bound = true;
        assert_eq!(terms.effective_window_limit_micros(0.1), 11_000_000);
        terms.session_window_limit_micros = 0;
        assert_eq!(terms.effective_window_limit_micros(0.1), 0);
        assert!(terms.account_unlimited());
    }
}
