//! The admission replica registry in Redis: each replica heartbeats its member in, with a report
//! of its own state (its failure policy, degraded or not), and reads who is live (the failure
//! policy's `divided` shares and its Redis probe, docs/DESIGN.md §4). The reports are read back
//! for the operator's status view.

use poolgate_core::status::{AdmissionPolicy, AdmissionReport, AdmissionState, ReplicaReport};
use poolgate_runtime::error::StateError;
use poolgate_runtime::redis_keys;

use super::RedisBackend;

/// A report no replica rewrote for this long is dropped: a replica that left without leaving
/// (killed) is listed as stale for a while, then forgotten.
pub const REPORTS_KEPT_MS: u64 = 10 * 60 * 1000;

/// `registry_read.lua`'s reply: the members with their entry's expiry, the reports by member,
/// Redis' `now`.
type RegistryRead = (Vec<(String, f64)>, Vec<(String, String)>, i64);

/// What a replica reports of itself with each heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnReport {
    pub policy: AdmissionPolicy,
    pub degraded: bool,
}

impl OwnReport {
    /// `<policy>|<ok|degraded>`; the heartbeat script appends `|<now>`.
    fn value(self) -> String {
        let state = if self.degraded {
            AdmissionState::Degraded
        } else {
            AdmissionState::Ok
        };
        format!("{}|{}", self.policy.as_str(), state.as_str())
    }
}

/// A stored report read back: (policy, state, written at ms). Anything else, a value a newer
/// replica may write included, reads as nothing known rather than an error.
fn parse_report(value: &str) -> (Option<AdmissionPolicy>, AdmissionState, Option<i64>) {
    let mut parts = value.split('|');
    let policy = parts.next().and_then(AdmissionPolicy::parse);
    let state = match parts.next() {
        Some("ok") => AdmissionState::Ok,
        Some("degraded") => AdmissionState::Degraded,
        _ => AdmissionState::Unknown,
    };
    let at = parts.next().and_then(|at| at.parse().ok());
    (policy, state, at)
}

/// The registry as read at `now`: every member (with its entry's expiry) and every report,
/// joined by replica. A member whose entry expired is stale and says nothing (`Unknown`); so
/// does a report whose member left the registry, and a member that writes no report (a replica
/// older than the reports).
pub(crate) fn admission_report(
    now: i64,
    members: Vec<(String, f64)>,
    reports: Vec<(String, String)>,
) -> AdmissionReport {
    let mut replicas: Vec<ReplicaReport> = members
        .iter()
        .map(|(id, expiry)| ReplicaReport {
            id: id.clone(),
            fresh: *expiry >= now as f64,
            state: AdmissionState::Unknown,
            policy: None,
            report_age_ms: None,
        })
        .collect();
    for (id, value) in reports {
        let (policy, state, at) = parse_report(&value);
        let index = match replicas.iter().position(|r| r.id == id) {
            Some(index) => index,
            None => {
                replicas.push(ReplicaReport {
                    id,
                    fresh: false,
                    state: AdmissionState::Unknown,
                    policy: None,
                    report_age_ms: None,
                });
                replicas.len() - 1
            }
        };
        let replica = &mut replicas[index];
        replica.policy = policy;
        replica.report_age_ms = at.map(|at| now.saturating_sub(at).max(0) as u64);
        if replica.fresh {
            replica.state = state;
        }
    }
    AdmissionReport::from_replicas(replicas)
}

impl RedisBackend {
    /// Heartbeats `member` into the replica registry with its `report`; returns the live
    /// members, sorted.
    pub async fn registry_heartbeat(
        &self,
        member: &str,
        ttl_ms: u64,
        report: OwnReport,
    ) -> Result<(Vec<String>, bool), StateError> {
        let (mut members, present, now): (Vec<String>, i64, i64) = self
            .script(
                self.scripts
                    .registry_heartbeat
                    .key(redis_keys::admission_replicas())
                    .key(redis_keys::admission_replica_reports())
                    .arg(member)
                    .arg(ttl_ms)
                    .arg(report.value())
                    .arg(REPORTS_KEPT_MS),
            )
            .await?;
        self.learn_clock(now);
        members.sort();
        Ok((members, present == 1))
    }

    /// Leaves the registry (graceful shutdown), so the others' shares grow at once, and drops
    /// this replica's report.
    pub async fn registry_leave(&self, member: &str) -> Result<(), StateError> {
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::pipe()
                    .cmd("ZREM")
                    .arg(redis_keys::admission_replicas())
                    .arg(member)
                    .cmd("HDEL")
                    .arg(redis_keys::admission_replica_reports())
                    .arg(member)
                    .query_async::<(i64, i64)>(&mut conn),
            )
            .await?;
        Ok(())
    }

    /// Admission's state from the registry and the replicas' reports, in one read.
    pub async fn registry_reports(&self) -> Result<AdmissionReport, StateError> {
        let (members, reports, now): RegistryRead = self
            .script(
                self.scripts
                    .registry_read
                    .key(redis_keys::admission_replicas())
                    .key(redis_keys::admission_replica_reports()),
            )
            .await?;
        self.learn_clock(now);
        Ok(admission_report(now, members, reports))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_member_and_a_silent_one_read_as_unknown_and_a_fresh_report_as_said() {
        let now = 1_000_000;
        let members = vec![
            ("fresh-ok".to_owned(), (now + 4_000) as f64),
            ("fresh-old".to_owned(), (now + 4_000) as f64),
            ("stale".to_owned(), (now - 1) as f64),
        ];
        let reports = vec![
            ("fresh-ok".to_owned(), format!("divided|ok|{}", now - 300)),
            (
                "stale".to_owned(),
                format!("divided|degraded|{}", now - 9_000),
            ),
            ("gone".to_owned(), format!("open|ok|{}", now - 60_000)),
        ];
        let report = admission_report(now, members, reports);
        let by_id = |id: &str| report.replicas.iter().find(|r| r.id == id).cloned();
        let fresh = by_id("fresh-ok").expect("listed");
        assert_eq!(
            (fresh.fresh, fresh.state, fresh.report_age_ms),
            (true, AdmissionState::Ok, Some(300))
        );
        let stale = by_id("stale").expect("listed");
        assert_eq!(
            (stale.fresh, stale.state, stale.report_age_ms),
            (false, AdmissionState::Unknown, Some(9_000))
        );
        assert_eq!(
            by_id("fresh-old").expect("listed").state,
            AdmissionState::Unknown
        );
        assert!(!by_id("gone").expect("listed").fresh);
        // A fresh replica that reports nothing leaves the whole unknown.
        assert_eq!(report.state, AdmissionState::Unknown);
        assert_eq!(
            parse_report("open|ok|12"),
            (Some(AdmissionPolicy::Open), AdmissionState::Ok, Some(12))
        );
        assert_eq!(
            parse_report("v9:whatever"),
            (None, AdmissionState::Unknown, None)
        );
    }
}
