//! The operator's status view (`ReadStatus`): `poolgate_core::status::StatusReport` on the wire
//! and back. Read strictly like every answer: an unknown or unset live status, platform or
//! admission state, a block kind that is none of `hard`, `soft`, `breaker`, a non-positive id or
//! clock, a spend that is not a finite amount are errors naming the field (with its path:
//! `accounts.windows.kind`), never a guess. The failure policy is the exception that proves the
//! rule: its `UNSPECIFIED` is a documented value, "not known".

use poolgate_core::health::LiveStatus;
use poolgate_core::status::{
    AccountStanding, AdmissionPolicy, AdmissionReport, AdmissionState, BlockKind, BlockNote,
    ReplicaReport, StatusReport,
};
use poolgate_core::windows::WindowReading;

use super::{ConvertError, EnumField, account_id};
use crate::selector::v1 as spb;

enum_pair!("status", spb::LiveStatus <=> LiveStatus {
    Active <=> Active,
    Disabled <=> Disabled,
    SoftBlocked <=> SoftBlocked,
    HardBlocked <=> HardBlocked,
    Confirming <=> Confirming,
    BreakerOpen <=> BreakerOpen,
    Retired <=> Retired,
    Error <=> Error,
});

enum_pair!("admission", spb::AdmissionState <=> AdmissionState {
    Unknown <=> Unknown,
    Ok <=> Ok,
    Degraded <=> Degraded,
});

enum_pair!("failure_policy", spb::FailurePolicy <=> AdmissionPolicy {
    Open <=> Open,
    Divided <=> Divided,
    Closed <=> Closed,
    Memory <=> Memory,
});

fn policy_to_wire(policy: Option<AdmissionPolicy>) -> i32 {
    policy.map_or(spb::FailurePolicy::Unspecified, spb::FailurePolicy::from) as i32
}

/// `UNSPECIFIED`: not known; any other value must be one this side knows.
fn policy_from_wire(
    field: &'static str,
    value: i32,
) -> Result<Option<AdmissionPolicy>, ConvertError> {
    if value == spb::FailurePolicy::Unspecified as i32 {
        return Ok(None);
    }
    AdmissionPolicy::decode(field, value).map(Some)
}

/// A `ReadStatus` answer for `report`.
pub fn status_answer(report: &StatusReport) -> spb::ReadStatusResponse {
    spb::ReadStatusResponse {
        now_ms: report.now_ms,
        failure_policy: policy_to_wire(report.admission.policy),
        admission: spb::AdmissionState::from(report.admission.state) as i32,
        admission_replicas: report
            .admission
            .replicas
            .iter()
            .map(|replica| spb::AdmissionReplica {
                id: replica.id.clone(),
                fresh: replica.fresh,
                state: spb::AdmissionState::from(replica.state) as i32,
                failure_policy: policy_to_wire(replica.policy),
                report_age_ms: replica.report_age_ms,
            })
            .collect(),
        accounts: report.accounts.iter().map(account_view).collect(),
    }
}

fn account_view(account: &AccountStanding) -> spb::AccountStatusView {
    spb::AccountStatusView {
        id: account.id,
        name: account.name.clone(),
        group: account.group.clone(),
        platform: spb::Platform::from(account.platform) as i32,
        credential_masked: account.credential_masked.clone(),
        status: spb::LiveStatus::from(account.status) as i32,
        status_reason: account.status_reason.clone(),
        leases: account.leases,
        concurrency_limit: account.concurrency_limit,
        rpm_used: account.rpm_used,
        rpm_limit: account.rpm_limit,
        session_spend_usd: account.session_spend_usd,
        session_window_limit_usd: account.session_window_limit_usd,
        windows: account
            .windows
            .iter()
            .map(spb::WindowReading::from)
            .collect(),
        kind: account
            .kind
            .map_or(spb::CredentialKind::Unspecified as i32, |kind| {
                spb::CredentialKind::from(kind) as i32
            }),
        email: account.email.clone(),
        plan: account.plan.clone(),
        token_expires_at_ms: account.token_expires_at_ms.max(0) as u64,
        refreshable: account.refreshable,
        serves: super::serves_to_wire(&account.serves),
        block: account.block.as_ref().map(|block| spb::StatusBlock {
            kind: block.kind.as_str().to_owned(),
            class: block.class.clone(),
            status: u32::from(block.status),
            reason: block.reason.clone(),
            remaining_ms: block.remaining_ms,
        }),
    }
}

/// A `ReadStatus` answer read strictly (see the module's rules).
pub fn read_status_answer(answer: spb::ReadStatusResponse) -> Result<StatusReport, ConvertError> {
    if answer.now_ms <= 0 {
        return Err(ConvertError::new(
            "now_ms",
            format!("must be a time since the epoch, got {}", answer.now_ms),
        ));
    }
    let replicas = answer
        .admission_replicas
        .into_iter()
        .map(|replica| read_replica(replica).map_err(|error| error.within("admission_replicas")))
        .collect::<Result<Vec<_>, _>>()?;
    let accounts = answer
        .accounts
        .into_iter()
        .map(|account| read_account(account).map_err(|error| error.within("accounts")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(StatusReport {
        now_ms: answer.now_ms,
        admission: AdmissionReport {
            policy: policy_from_wire("failure_policy", answer.failure_policy)?,
            state: AdmissionState::decode("admission", answer.admission)?,
            replicas,
        },
        accounts,
    })
}

fn read_replica(replica: spb::AdmissionReplica) -> Result<ReplicaReport, ConvertError> {
    if replica.id.is_empty() {
        return Err(ConvertError::new("id", "must not be empty"));
    }
    Ok(ReplicaReport {
        id: replica.id,
        fresh: replica.fresh,
        state: AdmissionState::decode("state", replica.state)?,
        policy: policy_from_wire("failure_policy", replica.failure_policy)?,
        report_age_ms: replica.report_age_ms,
    })
}

fn read_account(account: spb::AccountStatusView) -> Result<AccountStanding, ConvertError> {
    let id = account_id("id", account.id)?;
    let session_spend_usd = match account.session_spend_usd {
        Some(usd) if !usd.is_finite() || usd < 0.0 => {
            return Err(ConvertError::new(
                "session_spend_usd",
                "must be a finite amount of at least 0",
            ));
        }
        spend => spend,
    };
    let windows = account
        .windows
        .into_iter()
        .map(|reading| WindowReading::try_from(reading).map_err(|error| error.within("windows")))
        .collect::<Result<Vec<_>, _>>()?;
    let block = account
        .block
        .map(|block| read_block(block).map_err(|error| error.within("block")))
        .transpose()?;
    Ok(AccountStanding {
        id,
        name: account.name,
        group: account.group,
        platform: EnumField::decode("platform", account.platform)?,
        credential_masked: account.credential_masked,
        status: LiveStatus::decode("status", account.status)?,
        status_reason: account.status_reason,
        leases: account.leases,
        concurrency_limit: account.concurrency_limit,
        rpm_used: account.rpm_used,
        rpm_limit: account.rpm_limit,
        session_spend_usd,
        session_window_limit_usd: account.session_window_limit_usd,
        windows,
        block,
        // Unset (an older selector) or a kind newer than this reader: not said.
        kind: (account.kind != spb::CredentialKind::Unspecified as i32)
            .then(|| crate::convert::EnumField::decode("kind", account.kind).ok())
            .flatten(),
        email: account.email,
        plan: account.plan,
        token_expires_at_ms: i64::try_from(account.token_expires_at_ms).unwrap_or(i64::MAX),
        refreshable: account.refreshable,
        // Values newer than this build are left out; only such values: not said.
        serves: super::serves_from_wire(&account.serves).unwrap_or_default(),
    })
}

fn read_block(block: spb::StatusBlock) -> Result<BlockNote, ConvertError> {
    let kind = BlockKind::parse(&block.kind)
        .ok_or_else(|| ConvertError::new("kind", "must be one of hard, soft, breaker"))?;
    let status = u16::try_from(block.status)
        .ok()
        .filter(|status| *status <= 999)
        .ok_or_else(|| {
            ConvertError::new("status", format!("{} is no HTTP status", block.status))
        })?;
    Ok(BlockNote {
        kind,
        class: block.class,
        status,
        reason: block.reason,
        remaining_ms: block.remaining_ms,
    })
}

#[cfg(test)]
mod tests {
    use poolgate_core::account::Platform;
    use poolgate_core::windows::{Scope, WindowKind, WindowStatus};

    use super::*;

    fn report() -> StatusReport {
        StatusReport {
            now_ms: 1_700_000_000_000,
            admission: AdmissionReport::from_replicas(vec![ReplicaReport {
                id: "00ff".into(),
                fresh: true,
                state: AdmissionState::Degraded,
                policy: Some(AdmissionPolicy::Divided),
                report_age_ms: Some(250),
            }]),
            accounts: vec![AccountStanding {
                id: 7,
                name: "claude-1".into(),
                group: "team".into(),
                platform: Platform::Anthropic,
                credential_masked: "…wxyz".into(),
                status: LiveStatus::HardBlocked,
                status_reason: String::new(),
                leases: Some(2),
                concurrency_limit: 4,
                rpm_used: None,
                rpm_limit: 0,
                session_spend_usd: Some(1.25),
                session_window_limit_usd: 10.0,
                windows: vec![WindowReading {
                    kind: WindowKind::FiveHour,
                    scope: Scope::Account,
                    utilization: Some(0.5),
                    reset_at_ms: 1_700_000_100_000,
                    length_ms: Some(5 * 3_600_000),
                    status: WindowStatus::Allowed,
                    observed_at_ms: 1_699_999_990_000,
                }],
                block: Some(BlockNote {
                    kind: BlockKind::Hard,
                    class: "quota_gone".into(),
                    status: 402,
                    reason: "insufficient credit".into(),
                    remaining_ms: 60_000,
                }),
                kind: Some(poolgate_core::account::CredentialKind::OAuth),
                email: "ada@example.com".into(),
                plan: "max".into(),
                token_expires_at_ms: 1_700_003_600_000,
                refreshable: false,
                serves: vec![poolgate_core::account::Service::Chat],
            }],
        }
    }

    #[test]
    fn a_status_report_survives_the_wire() {
        let report = report();
        assert_eq!(read_status_answer(status_answer(&report)), Ok(report));
        let unknown = StatusReport {
            admission: AdmissionReport::unknown(),
            ..self::report()
        };
        let wire = status_answer(&unknown);
        assert_eq!(wire.failure_policy, spb::FailurePolicy::Unspecified as i32);
        assert_eq!(read_status_answer(wire), Ok(unknown));
    }

    #[test]
    fn a_status_answer_this_side_cannot_read_is_an_error_naming_the_field() {
        let field = |change: fn(&mut spb::ReadStatusResponse)| {
            let mut wire = status_answer(&report());
            change(&mut wire);
            read_status_answer(wire)
                .map(|_| ())
                .map_err(|error| error.field.into_owned())
        };
        assert_eq!(field(|w| w.now_ms = 0), Err("now_ms".into()));
        assert_eq!(
            field(|w| w.admission = spb::AdmissionState::Unspecified as i32),
            Err("admission".into())
        );
        assert_eq!(
            field(|w| w.failure_policy = 99),
            Err("failure_policy".into())
        );
        assert_eq!(
            field(|w| w.accounts[0].status = spb::LiveStatus::Unspecified as i32),
            Err("accounts.status".into())
        );
        assert_eq!(field(|w| w.accounts[0].id = 0), Err("accounts.id".into()));
        assert_eq!(
            field(|w| w.accounts[0].session_spend_usd = Some(f64::NAN)),
            Err("accounts.session_spend_usd".into())
        );
        assert_eq!(
            field(|w| w.accounts[0].windows[0].kind = 0),
            Err("accounts.windows.kind".into())
        );
        assert_eq!(
            field(|w| {
                if let Some(block) = w.accounts[0].block.as_mut() {
                    block.kind = "gentle".into();
                }
            }),
            Err("accounts.block.kind".into())
        );
        assert_eq!(
            field(|w| w.admission_replicas[0].state = 42),
            Err("admission_replicas.state".into())
        );
    }
}
