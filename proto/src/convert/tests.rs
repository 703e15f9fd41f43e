//! The conversions' tests: strict decoding, the deprecated string fields, the lease messages.

use super::*;
use crate::admission::v1 as apb;
use crate::selector::v1 as spb;
use poolgate_core::account::{CredentialKind, Platform, Price, Secret, Service};
use poolgate_core::lease::{Denial, DenyReason, LeaseTerms, LostReason, UserLimit};
use poolgate_core::plan::{Effect, Plan};
use std::time::Duration;

/// Every domain value goes to the wire and back unchanged, and every named proto value but
/// `UNSPECIFIED` has a domain value (a new proto value without one fails here).
fn round_trips<D, P>(values: &[D], proto_values: impl Iterator<Item = i32>)
where
    D: EnumField + Copy + PartialEq + std::fmt::Debug,
    P: From<D> + Into<i32>,
{
    for &value in values {
        let wire: i32 = P::from(value).into();
        assert_eq!(D::decode("f", wire), Ok(value));
    }
    let named: Vec<i32> = proto_values.filter(|&v| v != 0).collect();
    assert_eq!(
        named.len(),
        values.len(),
        "a proto value has no domain value"
    );
    for wire in named {
        assert!(D::decode("f", wire).is_ok(), "{wire}");
    }
}

/// The wire values prost knows for an enum, 0..=64.
fn known<P: TryFrom<i32>>() -> impl Iterator<Item = i32> {
    (0..=64).filter(|&v| P::try_from(v).is_ok())
}

/// An account's `serves` from a newer release: the values this build knows are kept; a list of
/// only newer ones is `None` (the account is left out), never read as the platform's default.
#[test]
fn a_serves_list_keeps_what_this_build_knows() {
    let chat = spb::Service::Chat as i32;
    let embeddings = spb::Service::Embeddings as i32;
    assert_eq!(serves_from_wire(&[]), Some(vec![]));
    assert_eq!(
        serves_from_wire(&[chat, embeddings]),
        Some(vec![Service::Chat, Service::Embeddings])
    );
    assert_eq!(
        serves_from_wire(&[embeddings, 77]),
        Some(vec![Service::Embeddings])
    );
    assert_eq!(serves_from_wire(&[77, 78]), None);
    assert_eq!(
        serves_to_wire(&[Service::Rerank]),
        vec![spb::Service::Rerank as i32]
    );
}

#[test]
fn every_enum_round_trips() {
    round_trips::<_, spb::Platform>(&Platform::ALL, known::<spb::Platform>());
    round_trips::<_, spb::Service>(&Service::ALL, known::<spb::Service>());
    round_trips::<_, spb::CredentialKind>(
        &[
            CredentialKind::ApiKey,
            CredentialKind::OAuth,
            CredentialKind::ChatGptOAuth,
        ],
        known::<spb::CredentialKind>(),
    );
    round_trips::<_, spb::OutcomeClass>(
        &[
            OutcomeClass::Success,
            OutcomeClass::Conflict,
            OutcomeClass::Busy,
            OutcomeClass::WindowExhausted,
            OutcomeClass::Broken,
            OutcomeClass::Unauthorized,
            OutcomeClass::QuotaGone,
            OutcomeClass::ClientError,
        ],
        known::<spb::OutcomeClass>(),
    );
    round_trips::<_, spb::NoneReason>(
        &[
            NoneReason::NoAccounts,
            NoneReason::ModelNotAllowed,
            NoneReason::AllBlocked,
            NoneReason::AllExcluded,
            NoneReason::BreakerOpen,
            NoneReason::Confirming,
        ],
        known::<spb::NoneReason>(),
    );
    round_trips::<_, apb::DenyReason>(
        &[
            DenyReason::Concurrency,
            DenyReason::Rpm,
            DenyReason::UserRpm,
            DenyReason::SessionWindow,
            DenyReason::Cooling,
            DenyReason::QueueFull,
            DenyReason::BackendUnavailable,
            DenyReason::LeaseUnknown,
            DenyReason::KeyConcurrency,
            DenyReason::KeyTpm,
            DenyReason::KeyBudget,
        ],
        known::<apb::DenyReason>(),
    );
    round_trips::<_, apb::LostReason>(
        &[
            LostReason::BackendUnavailable,
            LostReason::Released,
            LostReason::NoRoom,
            LostReason::Expired,
        ],
        known::<apb::LostReason>(),
    );
}

#[test]
fn unknown_and_unspecified_values_are_errors_naming_the_field() {
    let unknown = DenyReason::decode("denied.reason", 99).unwrap_err();
    assert_eq!(unknown.field, "denied.reason");
    assert!(unknown.to_string().contains("denied.reason"), "{unknown}");
    let unspecified = CredentialKind::decode("accounts.kind", 0).unwrap_err();
    assert_eq!(unspecified.field, "accounts.kind");
    assert!(unspecified.problem.contains("UNSPECIFIED"), "{unspecified}");
    assert_eq!(
        Platform::decode("platform", -1).unwrap_err().field,
        "platform"
    );
    assert!(OutcomeClass::try_from(spb::OutcomeClass::Unspecified).is_err());
    assert!(LostReason::try_from(apb::LostReason::Unspecified).is_err());
    let status = tonic::Status::from(unknown);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("denied.reason"));
}

#[test]
fn a_credential_kind_sent_twice_takes_the_enum_else_the_string_and_refuses_a_disagreement() {
    let oauth = spb::CredentialKind::Oauth as i32;
    assert_eq!(credential_kind(oauth, ""), Ok(CredentialKind::OAuth));
    assert_eq!(credential_kind(oauth, "oauth"), Ok(CredentialKind::OAuth));
    assert_eq!(
        credential_kind(0, "chatgpt_oauth"),
        Ok(CredentialKind::ChatGptOAuth)
    );
    assert_eq!(credential_kind(oauth, "api_key").unwrap_err().field, "kind");
    assert_eq!(
        credential_kind(oauth, "nonsense").unwrap_err().field,
        "kind"
    );
    assert_eq!(credential_kind(0, "").unwrap_err().field, "credential_kind");
    assert_eq!(
        credential_kind(0, "API_KEY").unwrap_err().field,
        "credential_kind"
    );
    assert_eq!(credential_kind(42, "").unwrap_err().field, "kind");
}

/// The declared fallbacks for values a newer release may send (docs/DESIGN.md §8): only numbers
/// this build does not know; `UNSPECIFIED` and disagreements stay errors.
#[test]
fn newer_values_read_as_their_declared_fallbacks() {
    assert!(newer_value::<spb::NoneReason>(99));
    assert!(!newer_value::<spb::NoneReason>(0), "unset is not newer");
    assert!(!newer_value::<spb::NoneReason>(
        spb::NoneReason::Confirming as i32
    ));
    assert_eq!(none_reason(99, ""), Ok(Some(NONE_REASON_FALLBACK)));
    assert_eq!(
        none_reason(99, "gone_fishing"),
        Ok(Some(NoneReason::AllBlocked))
    );
    assert_eq!(effect(99, ""), Ok(EFFECT_FALLBACK));
    assert_eq!(EFFECT_FALLBACK, Effect::None);
    // A plan account of a newer platform or sign-in is left out; the rest is served.
    let good = plan_entry(spb::CredentialKind::ApiKey as i32, "");
    let newer_kind = plan_entry(42, "");
    let newer_platform = spb::PlanAccount {
        account_id: 4,
        platform: 17,
        ..plan_entry(spb::CredentialKind::ApiKey as i32, "")
    };
    let plan = Plan::try_from(select_answer(
        vec![newer_kind.clone(), good, newer_platform.clone()],
        0,
        "",
    ))
    .expect("readable");
    assert_eq!(plan.accounts.len(), 1);
    assert_eq!(plan.accounts[0].credential_kind, CredentialKind::ApiKey);
    assert_eq!(plan.none_reason, None);
    // Left empty by it: a retryable refusal, not a plan with nothing and no reason.
    let plan =
        Plan::try_from(select_answer(vec![newer_kind, newer_platform], 0, "")).expect("readable");
    assert!(plan.accounts.is_empty());
    assert_eq!(plan.none_reason, Some(NoneReason::AllExcluded));
}

#[test]
fn a_none_reason_sent_twice_takes_the_enum_else_the_string_and_refuses_a_disagreement() {
    let blocked = spb::NoneReason::AllBlocked as i32;
    assert_eq!(none_reason(0, ""), Ok(None));
    assert_eq!(none_reason(blocked, ""), Ok(Some(NoneReason::AllBlocked)));
    assert_eq!(
        none_reason(blocked, "all_blocked"),
        Ok(Some(NoneReason::AllBlocked))
    );
    assert_eq!(
        none_reason(0, "model_not_allowed"),
        Ok(Some(NoneReason::ModelNotAllowed))
    );
    assert_eq!(
        none_reason(blocked, "no_accounts").unwrap_err().field,
        "reason"
    );
    assert_eq!(
        none_reason(0, "gone_fishing").unwrap_err().field,
        "none_reason"
    );
    // The confirmation's reason, both ways (a relay that does not know the value is
    // never sent it: `SelectRequest.reads_confirming`).
    let confirming = spb::NoneReason::Confirming as i32;
    assert_eq!(confirming, 6, "an added value, never renumbered");
    assert_eq!(
        none_reason(confirming, "confirming"),
        Ok(Some(NoneReason::Confirming))
    );
    assert_eq!(
        none_reason(0, "confirming"),
        Ok(Some(NoneReason::Confirming))
    );
    assert_eq!(
        none_reason(confirming, "all_blocked").unwrap_err().field,
        "reason"
    );
}

#[test]
fn prices_and_denials_round_trip() {
    let price = Price {
        per_search_unit: 0.0,
        input_per_mtok: 3.0,
        output_per_mtok: 15.0,
        cache_write_per_mtok: 3.75,
        cache_read_per_mtok: 0.3,
    };
    assert_eq!(Price::from(spb::Price::from(price)), price);
    let denial = Denial::new(DenyReason::UserRpm, 1234);
    assert_eq!(Denial::try_from(apb::Denied::from(denial)), Ok(denial));
    let unknown = apb::Denied {
        reason: 99,
        retry_after_ms: 0,
    };
    assert_eq!(Denial::try_from(unknown).unwrap_err().field, "reason");
}

fn terms() -> LeaseTerms {
    LeaseTerms {
        account_id: 7,
        concurrency_limit: 3,
        rpm_limit: 60,
        user: Some(UserLimit {
            user_id: "alice".into(),
            rpm_limit: 10,
        }),
        session_hash: Some("s1".into()),
        session_window_limit_micros: 12_500_000,
        session_bound: true,
        ignore_cooldown: false,
        key: None,
    }
}

#[test]
fn lease_terms_round_trip_through_an_acquire() {
    let acquire = apb::Acquire::from(&terms());
    assert_eq!(acquire.wait_ms, 0);
    assert_eq!(LeaseTerms::try_from(acquire), Ok(terms()));
    let unlimited = LeaseTerms {
        user: None,
        session_hash: None,
        session_window_limit_micros: 0,
        ..terms()
    };
    assert_eq!(
        LeaseTerms::try_from(apb::Acquire::from(&unlimited)),
        Ok(unlimited)
    );
    assert_eq!(
        wait(wait_ms(Duration::from_millis(1500))),
        Ok(Duration::from_millis(1500))
    );
    assert_eq!(wait_ms(Duration::from_secs(3600)), 600_000);
}

#[test]
fn a_bad_acquire_names_its_field() {
    let field = |edit: fn(&mut apb::Acquire)| {
        let mut acquire = apb::Acquire::from(&terms());
        edit(&mut acquire);
        LeaseTerms::try_from(acquire).map(|_| ()).unwrap_err().field
    };
    assert_eq!(field(|a| a.account_id = 0), "account_id");
    assert_eq!(field(|a| a.user_id = Some(String::new())), "user_id");
    assert_eq!(field(|a| a.user_id = None), "user_id");
    assert_eq!(
        field(|a| a.session_hash = Some("x".repeat(129))),
        "session_hash"
    );
    assert_eq!(
        field(|a| a.session_window_limit_usd = f64::NAN),
        "session_window_limit_usd"
    );
    assert_eq!(wait(600_001).unwrap_err().field, "wait_ms");
    assert_eq!(spend_micros("usd", -1.0).unwrap_err().field, "usd");
}

#[allow(deprecated)]
fn plan_entry(kind: i32, legacy: &str) -> spb::PlanAccount {
    spb::PlanAccount {
        account_id: 3,
        platform: spb::Platform::Anthropic as i32,
        kind,
        credential_kind: legacy.into(),
        inflight: -1,
        ..Default::default()
    }
}

#[allow(deprecated)]
fn select_answer(
    accounts: Vec<spb::PlanAccount>,
    reason: i32,
    legacy: &str,
) -> spb::SelectResponse {
    spb::SelectResponse {
        accounts,
        reason,
        none_reason: legacy.into(),
        ..Default::default()
    }
}

#[test]
fn a_plan_reads_the_enums_and_an_older_selectors_strings() {
    let oauth = spb::CredentialKind::Oauth as i32;
    for account in [
        plan_entry(oauth, ""),
        plan_entry(oauth, "oauth"),
        plan_entry(0, "oauth"),
    ] {
        let plan = Plan::try_from(select_answer(vec![account], 0, "")).expect("readable");
        assert_eq!(plan.accounts[0].credential_kind, CredentialKind::OAuth);
        assert_eq!(plan.accounts[0].inflight, None);
        assert_eq!(plan.none_reason, None);
    }
    let blocked = spb::NoneReason::AllBlocked as i32;
    for (reason, legacy) in [(blocked, ""), (blocked, "all_blocked"), (0, "all_blocked")] {
        let plan = Plan::try_from(select_answer(vec![], reason, legacy)).expect("readable");
        assert_eq!(plan.none_reason, Some(NoneReason::AllBlocked));
    }
}

#[test]
fn a_plan_entry_whose_kind_the_relay_cannot_read_fails_the_plan_instead_of_a_guess() {
    for account in [
        plan_entry(0, ""),
        plan_entry(0, "bearer"),
        plan_entry(spb::CredentialKind::ApiKey as i32, "oauth"),
    ] {
        let good = plan_entry(spb::CredentialKind::ApiKey as i32, "api_key");
        assert!(Plan::try_from(select_answer(vec![good, account], 0, "")).is_err());
    }
    assert!(Plan::try_from(select_answer(vec![], 0, "everything_on_fire")).is_err());
}

#[allow(deprecated)]
#[test]
fn a_report_answer_reads_the_effect_and_an_older_selectors_string_and_never_guesses() {
    let fresh = Secret::new("fresh-token");
    let answer = report_answer(Effect::Refreshed, 0, Some(&fresh));
    assert_eq!(answer.applied, "refreshed");
    let (effect, credential) = read_report_answer(answer).expect("readable");
    assert_eq!(effect, Effect::Refreshed);
    assert_eq!(
        credential.map(|c| c.expose().to_owned()),
        Some("fresh-token".into())
    );

    let older = spb::ReportOutcomeResponse {
        applied: "hard_block".into(),
        block_ms: 5,
        ..Default::default()
    };
    assert_eq!(
        read_report_answer(older).expect("readable").0,
        Effect::HardBlock
    );

    let refreshed_without_token = spb::ReportOutcomeResponse {
        effect: spb::Effect::Refreshed as i32,
        ..Default::default()
    };
    assert!(read_report_answer(refreshed_without_token).is_err());
    let disagreeing = spb::ReportOutcomeResponse {
        effect: spb::Effect::None as i32,
        applied: "refreshed".into(),
        ..Default::default()
    };
    assert!(read_report_answer(disagreeing).is_err());
    assert!(read_report_answer(spb::ReportOutcomeResponse::default()).is_err());
}

mod windows {
    use super::*;
    use poolgate_core::windows::{MinuteLimit, Scope, WindowKind, WindowReading, WindowStatus};

    fn reading(kind: WindowKind) -> WindowReading {
        WindowReading {
            kind,
            scope: Scope::Account,
            utilization: Some(0.42),
            reset_at_ms: 1_900_000_000_000,
            length_ms: Some(3_600_000),
            status: WindowStatus::AllowedWarning,
            observed_at_ms: 1_800_000_000_000,
        }
    }

    fn decode(wire: spb::WindowReading) -> Result<WindowReading, ConvertError> {
        WindowReading::try_from(wire)
    }

    #[test]
    fn the_window_enums_round_trip() {
        round_trips::<_, spb::MinuteLimit>(
            &[
                MinuteLimit::Requests,
                MinuteLimit::Tokens,
                MinuteLimit::InputTokens,
                MinuteLimit::OutputTokens,
            ],
            known::<spb::MinuteLimit>(),
        );
        round_trips::<_, spb::WindowStatus>(
            &[
                WindowStatus::Unknown,
                WindowStatus::Allowed,
                WindowStatus::AllowedWarning,
                WindowStatus::Rejected,
            ],
            known::<spb::WindowStatus>(),
        );
    }

    #[test]
    fn every_window_kind_and_scope_round_trips() {
        let kinds = [
            WindowKind::FiveHour,
            WindowKind::SevenDay,
            WindowKind::SevenDayOverageIncluded,
            WindowKind::SevenDayModel,
            WindowKind::Overage,
            WindowKind::CodexPrimary,
            WindowKind::CodexSecondary,
            WindowKind::PerMinute(MinuteLimit::Requests),
            WindowKind::PerMinute(MinuteLimit::OutputTokens),
        ];
        for kind in kinds {
            let original = reading(kind);
            assert_eq!(decode(spb::WindowReading::from(&original)), Ok(original));
        }
        // Every named kind but UNSPECIFIED has a domain kind.
        let named = known::<spb::WindowKind>().filter(|&v| v != 0).count();
        assert_eq!(named, kinds.len() - 1, "a proto kind has no domain kind");

        let scoped = WindowReading {
            scope: Scope::Models("opus".into()),
            utilization: None,
            length_ms: None,
            ..reading(WindowKind::SevenDayModel)
        };
        let wire = spb::WindowReading::from(&scoped);
        assert_eq!(wire.scope_models, "opus");
        assert_eq!(
            wire.utilization, None,
            "an unknown utilization stays unknown"
        );
        assert_eq!(decode(wire), Ok(scoped));
        assert_eq!(
            spb::WindowReading::from(&reading(WindowKind::FiveHour)).scope_models,
            "",
            "account-wide is an empty scope"
        );
    }

    #[test]
    fn an_unreadable_reading_is_an_error_naming_its_field() {
        let good = spb::WindowReading::from(&reading(WindowKind::FiveHour));
        let field = |wire: spb::WindowReading| decode(wire).map(|_| ()).unwrap_err().field;
        assert_eq!(
            field(spb::WindowReading {
                kind: 0,
                ..good.clone()
            }),
            "kind"
        );
        assert_eq!(
            field(spb::WindowReading {
                kind: 99,
                ..good.clone()
            }),
            "kind"
        );
        assert_eq!(
            field(spb::WindowReading {
                status: 0,
                ..good.clone()
            }),
            "status"
        );
        assert_eq!(
            field(spb::WindowReading {
                status: 99,
                ..good.clone()
            }),
            "status"
        );
        // A per-minute window says what it counts; no other kind does.
        let per_minute = spb::WindowReading {
            kind: spb::WindowKind::PerMinute as i32,
            ..good.clone()
        };
        assert_eq!(field(per_minute), "minute_limit");
        let with_limit = spb::WindowReading {
            minute_limit: spb::MinuteLimit::Tokens as i32,
            ..good.clone()
        };
        assert_eq!(field(with_limit), "minute_limit");
        for used in [f64::NAN, f64::INFINITY, -0.1, 1.01] {
            let bad = spb::WindowReading {
                utilization: Some(used),
                ..good.clone()
            };
            assert_eq!(field(bad), "utilization", "{used}");
        }
        let bad = spb::WindowReading {
            length_ms: Some(0),
            ..good.clone()
        };
        assert_eq!(field(bad), "length_ms");
        let bad = spb::WindowReading {
            scope_models: "x".repeat(65),
            ..good
        };
        assert_eq!(field(bad), "scope_models");
    }

    #[test]
    fn a_windows_request_is_bounded_and_names_the_field_with_its_path() {
        let readings = vec![reading(WindowKind::FiveHour), reading(WindowKind::SevenDay)];
        let request = windows_request([(7, readings.clone()), (9, Vec::new())]);
        assert_eq!(
            read_windows_request(request.clone()),
            Ok(vec![(7, readings), (9, Vec::new())])
        );

        let field = |request: spb::RecordWindowsRequest| {
            read_windows_request(request).map(|_| ()).unwrap_err().field
        };
        let mut bad = request.clone();
        bad.accounts[1].account_id = 0;
        assert_eq!(field(bad), "accounts.account_id");
        let mut bad = request.clone();
        bad.accounts[0].readings[1].utilization = Some(f64::NAN);
        assert_eq!(field(bad), "accounts.readings.utilization");
        let mut bad = request.clone();
        bad.accounts[0].readings =
            vec![bad.accounts[0].readings[0].clone(); MAX_WINDOW_READINGS + 1];
        assert_eq!(field(bad), "accounts.readings");
        let at_most = windows_request((1..=MAX_WINDOW_ACCOUNTS as i64).map(|id| (id, Vec::new())));
        assert!(read_windows_request(at_most.clone()).is_ok());
        let mut over = at_most;
        over.accounts.push(spb::AccountWindows {
            account_id: 5,
            readings: Vec::new(),
        });
        assert_eq!(field(over), "accounts");
    }

    /// The declared fallback: a reading a newer relay sends of a kind, limit or status this
    /// selector does not know is dropped; the call and the other readings are kept.
    #[test]
    fn a_reading_of_a_newer_kind_or_status_is_dropped_not_the_call() {
        let readings = vec![reading(WindowKind::FiveHour), reading(WindowKind::SevenDay)];
        let mut request = windows_request([(7, readings.clone())]);
        let mut newer_kind = request.accounts[0].readings[0].clone();
        newer_kind.kind = 99;
        let mut newer_status = request.accounts[0].readings[0].clone();
        newer_status.status = 42;
        let mut newer_limit = request.accounts[0].readings[0].clone();
        newer_limit.kind = spb::WindowKind::PerMinute as i32;
        newer_limit.minute_limit = 31;
        request.accounts[0]
            .readings
            .extend([newer_kind, newer_status, newer_limit]);
        assert_eq!(read_windows_request(request), Ok(vec![(7, readings)]));
    }
}

mod keys {
    use super::super::keys::*;
    use crate::selector::v1 as spb;
    use poolgate_core::account::ApiKeyRecord;
    use poolgate_core::keys::{
        Endpoint, KeyAccess, KeyDescription, KeyRefusal, PeriodUsage, UsagePeriod,
    };
    use poolgate_core::lease::KeyLimits;

    fn record(access: KeyAccess) -> ApiKeyRecord {
        ApiKeyRecord {
            id: 7,
            name: "ci".into(),
            prefix: "pg-abc".into(),
            user: "alice".into(),
            group: "team".into(),
            user_rpm_limit: 30,
            limits: KeyLimits {
                api_key_id: 7,
                ..Default::default()
            },
            active: true,
            access,
        }
    }

    fn with_limits() -> ApiKeyRecord {
        ApiKeyRecord {
            limits: KeyLimits {
                api_key_id: 7,
                concurrency_limit: 2,
                tpm_limit: 50_000,
                budget_total_micros: 100_000_000,
                budget_day_micros: 1_500_000,
                budget_week_micros: 5_000_000,
                budget_month_micros: 20_250_000,
            },
            ..record(limited())
        }
    }

    #[test]
    fn a_keys_limits_go_to_the_wire_and_back_in_every_key_message() {
        let key = with_limits();
        let answer = spb::AuthenticateResponse::from(&key);
        assert_eq!(answer.key_concurrency_limit, 2);
        assert_eq!(answer.key_tpm_limit, 50_000);
        assert_eq!(answer.key_budget_total_usd, 100.0);
        assert_eq!(answer.key_budget_day_usd, 1.5);
        assert_eq!(answer.key_budget_week_usd, 5.0);
        assert_eq!(answer.key_budget_month_usd, 20.25);
        assert_eq!(authenticated_limits(&answer), Ok(key.limits.clone()));
        let none = spb::AuthenticateResponse::from(&record(limited()));
        let read = authenticated_limits(&none).expect("no limits");
        assert_eq!(read.api_key_id, 7, "the id comes from the answer");
        assert!(!read.any(), "zero on the wire is no limit");
        let description = KeyDescription {
            record: key.clone(),
            usage: vec![],
            models: vec![],
        };
        let wire = spb::DescribeKeyResponse::from(&description);
        assert_eq!(wire.key_budget_month_usd, 20.25);
        assert_eq!(KeyDescription::try_from(wire), Ok(description));
        let view = spb::ApiKeyView::from(&key);
        assert_eq!(view.key_concurrency_limit, 2);
        assert_eq!(ApiKeyRecord::try_from(view), Ok(key.clone()));
        let mut create = spb::CreateApiKeyRequest::default();
        set_new_key_limits(&mut create, &key.limits);
        assert_eq!(
            new_key_limits(&create),
            Ok(KeyLimits {
                api_key_id: 0,
                ..key.limits
            })
        );
    }

    #[test]
    fn a_limit_that_cannot_be_read_is_an_error_naming_the_field_not_no_limit() {
        let good = spb::AuthenticateResponse::from(&with_limits());
        type Spoil = fn(&mut spb::AuthenticateResponse);
        let cases: [(&str, Spoil); 7] = [
            ("key_concurrency_limit", |a| a.key_concurrency_limit = -1),
            ("key_tpm_limit", |a| a.key_tpm_limit = -1),
            ("key_budget_total_usd", |a| {
                a.key_budget_total_usd = f64::NAN
            }),
            ("key_budget_day_usd", |a| a.key_budget_day_usd = -0.5),
            ("key_budget_week_usd", |a| {
                a.key_budget_week_usd = f64::INFINITY
            }),
            ("key_budget_month_usd", |a| a.key_budget_month_usd = -1.0),
            ("key_budget_month_usd", |a| a.key_budget_month_usd = 1e12),
        ];
        for (field, spoil) in cases {
            let mut answer = good.clone();
            spoil(&mut answer);
            assert_eq!(
                authenticated_limits(&answer).map_err(|e| e.field),
                Err(field.into())
            );
            let mut description = spb::DescribeKeyResponse::from(&KeyDescription {
                record: with_limits(),
                usage: vec![],
                models: vec![],
            });
            description.key_concurrency_limit = answer.key_concurrency_limit;
            description.key_tpm_limit = answer.key_tpm_limit;
            description.key_budget_total_usd = answer.key_budget_total_usd;
            description.key_budget_day_usd = answer.key_budget_day_usd;
            description.key_budget_week_usd = answer.key_budget_week_usd;
            description.key_budget_month_usd = answer.key_budget_month_usd;
            assert_eq!(
                KeyDescription::try_from(description).map_err(|e| e.field),
                Err(field.into())
            );
        }
    }

    #[test]
    fn a_partial_update_of_limits_changes_only_those_given_and_zero_clears() {
        let read = |request: spb::UpdateApiKeyRequest| <(i64, KeyUpdate)>::try_from(request);
        let (_, update) = read(spb::UpdateApiKeyRequest {
            id: 7,
            key_concurrency_limit: Some(0),
            key_budget_day_usd: Some(2.5),
            ..Default::default()
        })
        .expect("a limit alone is a change");
        assert_eq!(
            update,
            KeyUpdate {
                concurrency_limit: Some(0),
                budget_day_micros: Some(2_500_000),
                ..Default::default()
            }
        );
        let before = with_limits().limits;
        assert_eq!(
            update.apply_limits(&before),
            KeyLimits {
                concurrency_limit: 0,
                budget_day_micros: 2_500_000,
                ..before
            }
        );
        assert_eq!(
            spb::UpdateApiKeyRequest::from((7, &update)),
            spb::UpdateApiKeyRequest {
                id: 7,
                key_concurrency_limit: Some(0),
                key_budget_day_usd: Some(2.5),
                ..Default::default()
            }
        );
        for (request, field) in [
            (
                spb::UpdateApiKeyRequest {
                    id: 7,
                    key_tpm_limit: Some(-1),
                    ..Default::default()
                },
                "key_tpm_limit",
            ),
            (
                spb::UpdateApiKeyRequest {
                    id: 7,
                    key_budget_total_usd: Some(f64::NAN),
                    ..Default::default()
                },
                "key_budget_total_usd",
            ),
            (
                spb::UpdateApiKeyRequest {
                    id: 7,
                    key_concurrency_limit: Some(-2),
                    ..Default::default()
                },
                "key_concurrency_limit",
            ),
        ] {
            assert_eq!(read(request).map_err(|e| e.field), Err(field.into()));
        }
    }

    fn limited() -> KeyAccess {
        KeyAccess {
            expires_at_ms: Some(1_900_000_000_000),
            disabled: false,
            allowed_models: vec!["claude-*".into()],
            allowed_endpoints: vec![Endpoint::Messages, Endpoint::Models],
        }
    }

    #[test]
    fn an_authenticated_keys_access_goes_to_the_wire_and_back() {
        let answer = spb::AuthenticateResponse::from(&record(limited()));
        assert_eq!(answer.expires_at_ms, 1_900_000_000_000);
        assert_eq!(answer.allowed_endpoints, vec!["messages", "models"]);
        assert_eq!(authenticated_access(&answer), Ok(limited()));
        let unlimited = spb::AuthenticateResponse::from(&record(KeyAccess::default()));
        assert_eq!(unlimited.expires_at_ms, 0);
        assert_eq!(authenticated_access(&unlimited), Ok(KeyAccess::default()));
    }

    #[test]
    fn an_access_list_the_relay_cannot_read_is_an_error_naming_the_field_not_no_limit() {
        let good = spb::AuthenticateResponse::from(&record(limited()));
        // An endpoint a newer selector knows: left out of the list (DESIGN §8), never widening it.
        let mut newer = good.clone();
        newer.allowed_endpoints.push("images".into());
        let read = authenticated_access(&newer).expect("readable");
        assert_eq!(read, authenticated_access(&good).expect("readable"));
        let mut only_newer = good.clone();
        only_newer.allowed_endpoints = vec!["images".into(), "audio".into()];
        let read = authenticated_access(&only_newer).expect("readable");
        assert!(
            read.disabled,
            "a list of only newer endpoints holds the key disabled, never reads as every endpoint"
        );
        // An operator's request naming an endpoint this release does not know is refused.
        let request = spb::CreateApiKeyRequest {
            allowed_endpoints: vec!["images".into()],
            ..Default::default()
        };
        assert_eq!(
            new_key_access(&request).map_err(|e| e.field),
            Err("allowed_endpoints".into())
        );
        let mut blank = good.clone();
        blank.allowed_models.push(String::new());
        assert_eq!(
            authenticated_access(&blank).map_err(|e| e.field),
            Err("allowed_models".into())
        );
        let mut negative = good;
        negative.expires_at_ms = -1;
        assert_eq!(
            authenticated_access(&negative).map_err(|e| e.field),
            Err("expires_at_ms".into())
        );
    }

    #[test]
    fn a_key_refused_as_a_whole_is_permission_denied_naming_why_in_metadata() {
        for (refusal, name) in [
            (KeyRefusal::Disabled, "disabled"),
            (KeyRefusal::Expired { at_ms: 0 }, "expired"),
        ] {
            let status = key_refusal_status(&refusal).expect("a refusal of the key");
            assert_eq!(status.code(), tonic::Code::PermissionDenied);
            assert_eq!(status.message(), refusal.message());
            assert_eq!(
                status
                    .metadata()
                    .get(KEY_REFUSAL_METADATA)
                    .and_then(|v| v.to_str().ok()),
                Some(name)
            );
        }
        assert!(key_refusal_status(&KeyRefusal::EndpointNotAllowed(Endpoint::Models)).is_none());
    }

    #[test]
    fn a_description_goes_to_the_wire_and_back_and_an_unknown_period_is_refused() {
        let description = KeyDescription {
            record: record(KeyAccess {
                disabled: true,
                ..limited()
            }),
            usage: UsagePeriod::ALL
                .into_iter()
                .map(|period| {
                    (
                        period,
                        period.start_ms(1_800_000_000_000),
                        PeriodUsage {
                            requests: 3,
                            input_tokens: 10,
                            output_tokens: 20,
                            cost_usd: 0.5,
                        },
                    )
                })
                .collect(),
            models: vec![poolgate_core::keys::ModelPeriodUsage {
                model: "claude-opus-6".into(),
                price_source: Some(poolgate_core::price::PriceSource::Fallback),
                usage: PeriodUsage {
                    requests: 1,
                    input_tokens: 10,
                    output_tokens: 7,
                    cost_usd: 0.25,
                },
            }],
        };
        let wire = spb::DescribeKeyResponse::from(&description);
        assert!(wire.disabled);
        assert_eq!(wire.key_prefix, "pg-abc");
        assert_eq!(
            wire.month_models[0].price_source,
            spb::PriceSource::Fallback as i32
        );
        assert_eq!(KeyDescription::try_from(wire.clone()), Ok(description));
        let mut unknown = wire;
        unknown.usage[0].period = "year".into();
        assert_eq!(
            KeyDescription::try_from(unknown).map_err(|e| e.field),
            Err("usage.period".into())
        );
    }

    #[test]
    fn the_operators_view_names_the_stored_status() {
        let mut key = record(limited());
        assert_eq!(spb::ApiKeyView::from(&key).status, "active");
        key.access.disabled = true;
        assert_eq!(spb::ApiKeyView::from(&key).status, "disabled");
        key.active = false;
        assert_eq!(spb::ApiKeyView::from(&key).status, "revoked");
        for status in ["active", "disabled", "revoked"] {
            key.active = status != "revoked";
            key.access.disabled = status == "disabled";
            let view = spb::ApiKeyView::from(&key);
            assert_eq!(view.status, status);
            assert_eq!(ApiKeyRecord::try_from(view), Ok(key.clone()));
        }
        let mut unknown = spb::ApiKeyView::from(&key);
        unknown.status = "paused".into();
        assert_eq!(
            ApiKeyRecord::try_from(unknown).map_err(|e| e.field),
            Err("status".into())
        );
    }

    #[test]
    fn a_partial_update_is_read_strictly_and_says_what_changes() {
        let read = |request: spb::UpdateApiKeyRequest| <(i64, KeyUpdate)>::try_from(request);
        let (id, update) = read(spb::UpdateApiKeyRequest {
            id: 4,
            disabled: Some(true),
            expires_at_ms: Some(0),
            ..Default::default()
        })
        .expect("a disable that clears the expiry");
        assert_eq!(id, 4);
        assert_eq!(
            update,
            KeyUpdate {
                disabled: Some(true),
                expires_at_ms: Some(None),
                ..Default::default()
            }
        );
        let applied = update.apply(&limited());
        assert!(applied.disabled && applied.expires_at_ms.is_none());
        assert_eq!(applied.allowed_models, limited().allowed_models);
        let (_, cleared) = read(spb::UpdateApiKeyRequest {
            id: 4,
            replace_allowed_endpoints: true,
            ..Default::default()
        })
        .expect("an empty list replaces");
        assert_eq!(cleared.allowed_endpoints, Some(vec![]));
        assert_eq!(
            spb::UpdateApiKeyRequest::from((4, &cleared)),
            spb::UpdateApiKeyRequest {
                id: 4,
                replace_allowed_endpoints: true,
                ..Default::default()
            }
        );
        for (request, field) in [
            (
                spb::UpdateApiKeyRequest {
                    id: 0,
                    disabled: Some(true),
                    ..Default::default()
                },
                "id",
            ),
            (
                spb::UpdateApiKeyRequest {
                    id: 1,
                    ..Default::default()
                },
                "id",
            ),
            (
                spb::UpdateApiKeyRequest {
                    id: 1,
                    expires_at_ms: Some(-5),
                    ..Default::default()
                },
                "expires_at_ms",
            ),
            (
                spb::UpdateApiKeyRequest {
                    id: 1,
                    allowed_models: vec!["gpt-*".into()],
                    ..Default::default()
                },
                "allowed_models",
            ),
            (
                spb::UpdateApiKeyRequest {
                    id: 1,
                    allowed_endpoints: vec!["images".into()],
                    replace_allowed_endpoints: true,
                    ..Default::default()
                },
                "allowed_endpoints",
            ),
        ] {
            assert_eq!(read(request).map_err(|e| e.field), Err(field.into()));
        }
    }
}

#[test]
fn key_limits_round_trip_and_bad_ones_name_their_field() {
    use poolgate_core::lease::{KeyLimits, LeaseTerms};
    let acquire = apb::Acquire {
        account_id: 3,
        api_key_id: 42,
        key_concurrency_limit: 2,
        key_tpm_limit: 10_000,
        key_budget_total_usd: 100.0,
        key_budget_day_usd: 1.5,
        key_budget_week_usd: 5.0,
        key_budget_month_usd: 20.0,
        ..Default::default()
    };
    let terms = LeaseTerms::try_from(acquire.clone()).expect("valid key limits");
    assert_eq!(
        terms.key,
        Some(KeyLimits {
            api_key_id: 42,
            concurrency_limit: 2,
            tpm_limit: 10_000,
            budget_total_micros: 100_000_000,
            budget_day_micros: 1_500_000,
            budget_week_micros: 5_000_000,
            budget_month_micros: 20_000_000,
        })
    );
    assert_eq!(apb::Acquire::from(&terms), acquire);
    let unkeyed = LeaseTerms::try_from(apb::Acquire {
        account_id: 3,
        api_key_id: 42,
        ..Default::default()
    })
    .expect("a key without limits");
    assert_eq!(unkeyed.key, None, "a key without limits is not counted");
    let bad = [
        (
            apb::Acquire {
                key_concurrency_limit: -1,
                ..acquire.clone()
            },
            "key_concurrency_limit",
        ),
        (
            apb::Acquire {
                key_tpm_limit: -5,
                ..acquire.clone()
            },
            "key_tpm_limit",
        ),
        (
            apb::Acquire {
                key_budget_day_usd: f64::NAN,
                ..acquire.clone()
            },
            "key_budget_day_usd",
        ),
        (
            apb::Acquire {
                key_budget_month_usd: -1.0,
                ..acquire.clone()
            },
            "key_budget_month_usd",
        ),
        (
            apb::Acquire {
                key_budget_total_usd: f64::INFINITY,
                ..acquire.clone()
            },
            "key_budget_total_usd",
        ),
        (
            apb::Acquire {
                api_key_id: 0,
                ..acquire.clone()
            },
            "api_key_id",
        ),
    ];
    for (acquire, field) in bad {
        let error = LeaseTerms::try_from(acquire).expect_err(field);
        assert_eq!(error.field, field);
    }
}

#[test]
fn a_confirming_plan_is_said_as_all_blocked_to_a_relay_that_does_not_read_it() {
    let confirming = Plan {
        none_reason: Some(NoneReason::Confirming),
        retry_after_ms: 250,
        ..Plan::default()
    };
    let answer = select_response(&confirming, true);
    let plan = Plan::try_from(answer).expect("readable");
    assert_eq!(
        (plan.none_reason, plan.retry_after_ms),
        (Some(NoneReason::Confirming), 250)
    );
    // An older relay: a value it does not know reads as its fallback, all_blocked (a 503 with
    // the hint, no re-plan); all_blocked with the same short hint is one it waits for, then plans
    // again.
    assert_eq!(none_reason(77, ""), Ok(Some(NONE_REASON_FALLBACK)));
    let older = select_response(&confirming, false);
    #[allow(deprecated)]
    let legacy = older.none_reason.clone();
    assert_eq!(
        (older.reason, legacy.as_str(), older.retry_after_ms),
        (spb::NoneReason::AllBlocked as i32, "all_blocked", 250)
    );
    // Every other reason is said as it is, to either.
    let blocked = Plan {
        none_reason: Some(NoneReason::AllBlocked),
        retry_after_ms: 90_000,
        ..Plan::default()
    };
    assert_eq!(
        select_response(&blocked, false),
        select_response(&blocked, true)
    );
}

#[test]
fn a_plan_accounts_price_says_where_it_came_from_and_no_price_is_not_free() {
    use poolgate_core::plan::PlannedAccount;
    use poolgate_core::price::{ModelPrice, PriceSource};
    round_trips::<_, spb::PriceSource>(
        &[
            PriceSource::Operator,
            PriceSource::Catalogue,
            PriceSource::Fallback,
            PriceSource::None,
        ],
        known::<spb::PriceSource>(),
    );
    let price = Price {
        per_search_unit: 0.0,
        input_per_mtok: 5.0,
        output_per_mtok: 25.0,
        cache_write_per_mtok: 6.25,
        cache_read_per_mtok: 0.5,
    };
    let fallback = ModelPrice::fallback(price, "claude-opus-*".into());
    let free = ModelPrice::new(Price::default(), PriceSource::Operator);
    for sent in [
        fallback,
        free,
        ModelPrice::none(),
        ModelPrice::refused(),
        ModelPrice::new(price, PriceSource::Catalogue),
    ] {
        let mut account = plan_entry(spb::CredentialKind::ApiKey as i32, "");
        let wire = spb::PlanAccount::from(&PlannedAccount {
            price: sent.clone(),
            ..Plan::try_from(select_answer(vec![account.clone()], 0, ""))
                .expect("readable")
                .accounts
                .remove(0)
        });
        account.price = wire.price;
        account.price_source = wire.price_source;
        account.price_fallback_from = wire.price_fallback_from.clone();
        // No price travels as no `price` at all: what an older relay reads as 0, as before.
        assert_eq!(wire.price.is_none(), sent.source == PriceSource::None);
        let read = Plan::try_from(select_answer(vec![account], 0, "")).expect("readable");
        assert_eq!(read.accounts[0].price, sent);
    }
}

#[test]
fn an_older_selectors_price_reads_as_it_meant_it_zero_as_none() {
    use poolgate_core::price::{ModelPrice, PriceSource};
    let price = Price {
        input_per_mtok: 3.0,
        ..Price::default()
    };
    let newer = 99;
    for (sent, source, expected) in [
        (None, 0, ModelPrice::none()),
        (Some(Price::default()), 0, ModelPrice::none()),
        (
            Some(price),
            0,
            ModelPrice::new(price, PriceSource::Operator),
        ),
        (
            Some(price),
            newer,
            ModelPrice::new(price, PriceSource::Operator),
        ),
        (None, newer, ModelPrice::none()),
        // Refused is said, never inferred from an older selector's silence.
        (None, spb::PriceSource::None as i32, ModelPrice::refused()),
    ] {
        let mut account = plan_entry(spb::CredentialKind::ApiKey as i32, "");
        account.price = sent.map(spb::Price::from);
        account.price_source = source;
        let read = Plan::try_from(select_answer(vec![account], 0, "")).expect("readable");
        assert_eq!(read.accounts[0].price, expected, "{sent:?} {source}");
    }
}

#[test]
fn a_usage_records_price_source_travels_and_unset_or_newer_is_not_said() {
    use poolgate_core::plan::UsageRecord;
    use poolgate_core::price::PriceSource;
    let record = UsageRecord {
        status: 200,
        price_source: Some(PriceSource::Fallback),
        ..UsageRecord::default()
    };
    let wire = spb::UsageRecord::from(record.clone());
    assert_eq!(UsageRecord::try_from(wire.clone()), Ok(record));
    for source in [0, 99] {
        let older = spb::UsageRecord {
            price_source: source,
            ..wire.clone()
        };
        assert_eq!(
            UsageRecord::try_from(older).map(|r| r.price_source),
            Ok(None)
        );
    }
}
