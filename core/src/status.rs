//! The pool at a glance, as the operator's `status` verb and the status page read it: every
//! account's live status, load against its limits, usage windows and block, and admission's
//! state as its replicas report it in the replica registry. The selection engine builds it
//! (`Selector::status`), `poolgate-proto` carries it (`ReadStatus`), the operator CLI renders it;
//! one type, so both modes show the same.

use crate::AccountId;
use crate::account::Platform;
use crate::health::LiveStatus;
use crate::windows::WindowReading;

/// The failure policy admission runs under (docs/DESIGN.md §4), or `Memory`: the standalone
/// relay's in-process lease engine, no Redis to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionPolicy {
    Open,
    Divided,
    Closed,
    Memory,
}

impl AdmissionPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionPolicy::Open => "open",
            AdmissionPolicy::Divided => "divided",
            AdmissionPolicy::Closed => "closed",
            AdmissionPolicy::Memory => "memory",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "open" => Some(AdmissionPolicy::Open),
            "divided" => Some(AdmissionPolicy::Divided),
            "closed" => Some(AdmissionPolicy::Closed),
            "memory" => Some(AdmissionPolicy::Memory),
            _ => None,
        }
    }
}

/// Whether admission serves from Redis (`Ok`), from a replica's fallback (`Degraded`), or
/// cannot be told (`Unknown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionState {
    Ok,
    Degraded,
    Unknown,
}

impl AdmissionState {
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionState::Ok => "ok",
            AdmissionState::Degraded => "degraded",
            AdmissionState::Unknown => "unknown",
        }
    }
}

/// One admission replica as the registry lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaReport {
    /// Its registry member (an instance id).
    pub id: String,
    /// Whether its registry entry is live (heartbeated within the registry ttl). A replica that
    /// cannot reach Redis cannot heartbeat: its entry goes stale.
    pub fresh: bool,
    /// What it last reported; `Unknown` when its entry is stale or it reports nothing (a replica
    /// older than the reports).
    pub state: AdmissionState,
    /// Its failure policy, when it reported one.
    pub policy: Option<AdmissionPolicy>,
    /// How long ago it last reported, ms; `None` when it never did.
    pub report_age_ms: Option<u64>,
}

/// Admission's state as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionReport {
    /// The policy every fresh replica reported; `None` when none did or they disagree.
    pub policy: Option<AdmissionPolicy>,
    pub state: AdmissionState,
    /// Every replica the registry lists, by id; empty when not known.
    pub replicas: Vec<ReplicaReport>,
}

impl AdmissionReport {
    /// Nothing could be read.
    pub fn unknown() -> Self {
        AdmissionReport {
            policy: None,
            state: AdmissionState::Unknown,
            replicas: Vec::new(),
        }
    }

    /// The in-process lease engine: no Redis, nothing to degrade.
    pub fn in_process() -> Self {
        AdmissionReport {
            policy: Some(AdmissionPolicy::Memory),
            state: AdmissionState::Ok,
            replicas: Vec::new(),
        }
    }

    /// Admission's state from its replicas' reports: `Degraded` when any fresh replica says so,
    /// `Ok` when every fresh replica says ok (at least one), else `Unknown` (none fresh, or a
    /// fresh one that reports nothing). A stale replica counts for nothing: it says nothing
    /// about now. The policy is the one the fresh replicas agree on. Replicas sorted by id.
    pub fn from_replicas(mut replicas: Vec<ReplicaReport>) -> Self {
        replicas.sort_by(|a, b| a.id.cmp(&b.id));
        let fresh: Vec<&ReplicaReport> = replicas.iter().filter(|r| r.fresh).collect();
        let state = if fresh.iter().any(|r| r.state == AdmissionState::Degraded) {
            AdmissionState::Degraded
        } else if !fresh.is_empty() && fresh.iter().all(|r| r.state == AdmissionState::Ok) {
            AdmissionState::Ok
        } else {
            AdmissionState::Unknown
        };
        let policy = match fresh.first().and_then(|r| r.policy) {
            Some(first) if fresh.iter().all(|r| r.policy == Some(first)) => Some(first),
            _ => None,
        };
        AdmissionReport {
            policy,
            state,
            replicas,
        }
    }
}

/// The kind of block an account is under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    Hard,
    Soft,
    Breaker,
}

impl BlockKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockKind::Hard => "hard",
            BlockKind::Soft => "soft",
            BlockKind::Breaker => "breaker",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "hard" => Some(BlockKind::Hard),
            "soft" => Some(BlockKind::Soft),
            "breaker" => Some(BlockKind::Breaker),
            _ => None,
        }
    }
}

/// The block that decides an account's live status (a hard block over an open breaker over a
/// soft block), as the operator's `blocks` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockNote {
    pub kind: BlockKind,
    /// The outcome class that caused it.
    pub class: String,
    /// The upstream's HTTP status (0: none caused it).
    pub status: u16,
    pub reason: String,
    pub remaining_ms: u64,
}

/// One account on the status view.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountStanding {
    pub id: AccountId,
    pub name: String,
    pub group: String,
    pub platform: Platform,
    /// `Secret::masked`: never more than the last four characters.
    pub credential_masked: String,
    pub status: LiveStatus,
    /// The stored status's reason.
    pub status_reason: String,
    /// Live leases; `None`: unknown.
    pub leases: Option<u32>,
    pub concurrency_limit: i32,
    /// Requests admitted in the rolling minute; `None`: unknown or not counted.
    pub rpm_used: Option<u32>,
    pub rpm_limit: i32,
    /// Spend in the current session window, USD; `None`: unknown or not counted.
    pub session_spend_usd: Option<f64>,
    pub session_window_limit_usd: f64,
    /// The stored usage-window readings (docs/DESIGN.md §5).
    pub windows: Vec<WindowReading>,
    pub block: Option<BlockNote>,
    /// What its credential is; `None`: not said (an older selector).
    pub kind: Option<crate::account::CredentialKind>,
    /// Who the upstream says it is (a sign-in or an import); empty: not known.
    pub email: String,
    pub plan: String,
    /// OAuth: when its access token expires (ms since the epoch; 0: unknown), and whether a
    /// refresh token keeps it alive (without one it must be signed in again before then).
    pub token_expires_at_ms: i64,
    pub refreshable: bool,
    /// What it serves: its own list, or what its platform and credential serve when it names
    /// none (docs/DESIGN.md §6, "Embeddings and rerank"); empty: not said (an older selector).
    pub serves: Vec<crate::account::Service>,
}

/// The pool at a glance, read at `now_ms` (the answering side's clock).
#[derive(Debug, Clone, PartialEq)]
pub struct StatusReport {
    pub now_ms: i64,
    pub admission: AdmissionReport,
    /// Ascending by id.
    pub accounts: Vec<AccountStanding>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(id: &str, fresh: bool, state: AdmissionState) -> ReplicaReport {
        ReplicaReport {
            id: id.into(),
            fresh,
            state,
            policy: Some(AdmissionPolicy::Divided),
            report_age_ms: Some(100),
        }
    }

    #[test]
    fn admission_is_degraded_when_any_fresh_replica_says_so_and_ok_only_when_all_do() {
        use AdmissionState::{Degraded, Ok, Unknown};
        let state = |replicas: Vec<ReplicaReport>| AdmissionReport::from_replicas(replicas).state;
        assert_eq!(
            state(vec![replica("a", true, Ok), replica("b", true, Ok)]),
            Ok
        );
        assert_eq!(
            state(vec![replica("a", true, Ok), replica("b", true, Degraded)]),
            Degraded
        );
        // A stale replica says nothing about now, whatever it last said.
        assert_eq!(
            state(vec![replica("a", true, Ok), replica("b", false, Degraded)]),
            Ok
        );
        assert_eq!(state(vec![replica("a", false, Ok)]), Unknown);
        assert_eq!(state(Vec::new()), Unknown);
        // A fresh replica that reports nothing (an older one) leaves it unknown.
        assert_eq!(
            state(vec![replica("a", true, Ok), replica("b", true, Unknown)]),
            Unknown
        );
    }

    #[test]
    fn the_policy_is_the_one_the_fresh_replicas_agree_on() {
        let mut open = replica("b", true, AdmissionState::Ok);
        open.policy = Some(AdmissionPolicy::Open);
        let agreed = AdmissionReport::from_replicas(vec![
            open.clone(),
            replica("c", false, AdmissionState::Ok),
        ]);
        assert_eq!(agreed.policy, Some(AdmissionPolicy::Open));
        let split =
            AdmissionReport::from_replicas(vec![open, replica("a", true, AdmissionState::Ok)]);
        assert_eq!(split.policy, None);
        assert_eq!(
            split
                .replicas
                .iter()
                .map(|r| r.id.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        for policy in [
            AdmissionPolicy::Open,
            AdmissionPolicy::Divided,
            AdmissionPolicy::Closed,
            AdmissionPolicy::Memory,
        ] {
            assert_eq!(AdmissionPolicy::parse(policy.as_str()), Some(policy));
        }
        assert_eq!(AdmissionPolicy::parse("lenient"), None);
    }
}
