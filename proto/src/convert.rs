//! Proto ↔ domain conversions, written once for the services and the relay. Decoding is strict:
//! an unknown or `UNSPECIFIED` enum value is a [`ConvertError`] naming the field, never mapped to
//! a likely-looking value (a guessed credential kind sends a credential the wrong way; a guessed
//! deny reason hides a refusal the caller should act on). Servers answer a `ConvertError` with
//! `INVALID_ARGUMENT`; the relay treats one in an answer as a backend error.
//!
//! Enums on the wire are `i32`: decode them with [`EnumField::decode`], which names the field.
//! Fields that carry a value twice while a string field is deprecated (`credential_kind`,
//! `none_reason`) decode through [`credential_kind`] and [`none_reason`]: the enum when set, else
//! the string, and an error when both are set and disagree.

use std::time::Duration;

use poolgate_core::account::{CredentialKind, Platform, Price};
use poolgate_core::lease::{Denial, DenyReason, LeaseTerms, LostReason, MAX_WAIT, UserLimit};
use poolgate_core::money::{micros_to_usd, usd_to_micros};
use poolgate_core::outcome::OutcomeClass;
use poolgate_core::select::NoneReason;
use poolgate_core::{MAX_NAME_BYTES, millis};

use crate::admission::v1 as apb;
use crate::selector::v1 as spb;

/// A proto value that has no domain meaning. The message names the field, so a server's
/// `INVALID_ARGUMENT` (or a relay's log line) says which one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {problem}")]
pub struct ConvertError {
    /// The proto field, as its message names it (`platform`, `account_id`, `kind`).
    pub field: &'static str,
    /// What is wrong with the value (never the value of a credential).
    pub problem: String,
}

impl ConvertError {
    pub fn new(field: &'static str, problem: impl Into<String>) -> Self {
        ConvertError {
            field,
            problem: problem.into(),
        }
    }
}

impl From<ConvertError> for tonic::Status {
    fn from(error: ConvertError) -> Self {
        tonic::Status::invalid_argument(error.to_string())
    }
}

/// A proto enum field, as it is on the wire (`i32`), to its domain value.
pub trait EnumField: Sized {
    /// `field` names the field in the error: an unknown value, or `UNSPECIFIED`.
    fn decode(field: &'static str, value: i32) -> Result<Self, ConvertError>;
}

/// One table per enum pair: `From` domain → proto, `TryFrom` proto → domain (`UNSPECIFIED` is an
/// error), and [`EnumField`] for the `i32` on the wire. `$field` is the field's usual name.
macro_rules! enum_pair {
    ($field:literal, $pm:ident::$proto:ident <=> $domain:ident { $($p:ident <=> $d:ident),+ $(,)? }) => {
        impl From<$domain> for $pm::$proto {
            fn from(value: $domain) -> Self {
                match value {
                    $($domain::$d => $pm::$proto::$p,)+
                }
            }
        }

        impl TryFrom<$pm::$proto> for $domain {
            type Error = ConvertError;

            fn try_from(value: $pm::$proto) -> Result<Self, ConvertError> {
                match value {
                    $($pm::$proto::$p => Ok($domain::$d),)+
                    other => Err(ConvertError::new(
                        $field,
                        format!("must be set, got {}", other.as_str_name()),
                    )),
                }
            }
        }

        impl EnumField for $domain {
            fn decode(field: &'static str, value: i32) -> Result<Self, ConvertError> {
                let known = $pm::$proto::try_from(value).map_err(|_| {
                    ConvertError::new(field, format!("unknown {} value {value}", stringify!($proto)))
                })?;
                $domain::try_from(known).map_err(|error| ConvertError { field, ..error })
            }
        }
    };
}

enum_pair!("platform", spb::Platform <=> Platform {
    Anthropic <=> Anthropic,
    Openai <=> OpenAi,
});

enum_pair!("kind", spb::CredentialKind <=> CredentialKind {
    ApiKey <=> ApiKey,
    Oauth <=> OAuth,
    ChatgptOauth <=> ChatGptOAuth,
});

enum_pair!("class", spb::OutcomeClass <=> OutcomeClass {
    Success <=> Success,
    Conflict <=> Conflict,
    Busy <=> Busy,
    WindowExhausted <=> WindowExhausted,
    Broken <=> Broken,
    Unauthorized <=> Unauthorized,
    QuotaGone <=> QuotaGone,
    ClientError <=> ClientError,
});

enum_pair!("reason", spb::NoneReason <=> NoneReason {
    NoAccounts <=> NoAccounts,
    ModelNotAllowed <=> ModelNotAllowed,
    AllBlocked <=> AllBlocked,
    AllExcluded <=> AllExcluded,
    BreakerOpen <=> BreakerOpen,
});

enum_pair!("reason", apb::DenyReason <=> DenyReason {
    Concurrency <=> Concurrency,
    Rpm <=> Rpm,
    UserRpm <=> UserRpm,
    SessionWindow <=> SessionWindow,
    Cooling <=> Cooling,
    QueueFull <=> QueueFull,
    BackendUnavailable <=> BackendUnavailable,
    LeaseUnknown <=> LeaseUnknown,
});

enum_pair!("lost_reason", apb::LostReason <=> LostReason {
    BackendUnavailable <=> BackendUnavailable,
    Released <=> Released,
    NoRoom <=> NoRoom,
    Expired <=> Expired,
});

/// The credential kind of a message that carries it twice while `credential_kind` (the string)
/// is deprecated: `kind` when set, else the string. Both set and naming different kinds is an
/// error (the caller is confused about what it sends); so is neither.
pub fn credential_kind(kind: i32, legacy: &str) -> Result<CredentialKind, ConvertError> {
    let from_string = || {
        CredentialKind::parse(legacy).ok_or_else(|| {
            ConvertError::new(
                "credential_kind",
                "must be api_key, oauth or chatgpt_oauth (or set kind)",
            )
        })
    };
    if kind == spb::CredentialKind::Unspecified as i32 {
        return from_string();
    }
    let decoded = CredentialKind::decode("kind", kind)?;
    if !legacy.is_empty() && CredentialKind::parse(legacy) != Some(decoded) {
        return Err(ConvertError::new(
            "kind",
            format!(
                "{} disagrees with the deprecated credential_kind; set one, or both alike",
                decoded.as_str()
            ),
        ));
    }
    Ok(decoded)
}

/// Why a select answer is empty, from a message that carries it twice while `none_reason` (the
/// string) is deprecated: `reason` when set, else the string; `None` when neither is (the plan
/// has accounts). Both set and naming different reasons is an error.
pub fn none_reason(reason: i32, legacy: &str) -> Result<Option<NoneReason>, ConvertError> {
    if reason == spb::NoneReason::Unspecified as i32 {
        if legacy.is_empty() {
            return Ok(None);
        }
        return NoneReason::parse(legacy)
            .map(Some)
            .ok_or_else(|| ConvertError::new("none_reason", "not a known reason (or set reason)"));
    }
    let decoded = NoneReason::decode("reason", reason)?;
    if !legacy.is_empty() && NoneReason::parse(legacy) != Some(decoded) {
        return Err(ConvertError::new(
            "reason",
            format!(
                "{} disagrees with the deprecated none_reason",
                decoded.as_str()
            ),
        ));
    }
    Ok(Some(decoded))
}

impl From<Price> for spb::Price {
    fn from(price: Price) -> Self {
        spb::Price {
            input_per_mtok: price.input_per_mtok,
            output_per_mtok: price.output_per_mtok,
            cache_write_per_mtok: price.cache_write_per_mtok,
            cache_read_per_mtok: price.cache_read_per_mtok,
        }
    }
}

impl From<spb::Price> for Price {
    fn from(price: spb::Price) -> Self {
        Price {
            input_per_mtok: price.input_per_mtok,
            output_per_mtok: price.output_per_mtok,
            cache_write_per_mtok: price.cache_write_per_mtok,
            cache_read_per_mtok: price.cache_read_per_mtok,
        }
    }
}

impl From<Denial> for apb::Denied {
    fn from(denial: Denial) -> Self {
        apb::Denied {
            reason: apb::DenyReason::from(denial.reason) as i32,
            retry_after_ms: denial.retry_after_ms,
        }
    }
}

impl TryFrom<apb::Denied> for Denial {
    type Error = ConvertError;

    fn try_from(denied: apb::Denied) -> Result<Self, ConvertError> {
        Ok(Denial::new(
            DenyReason::decode("reason", denied.reason)?,
            denied.retry_after_ms,
        ))
    }
}

/// The terms of a lease as an `Acquire` that asks for no wait (set `wait_ms` with [`wait_ms`]).
/// `ignore_cooldown` has no field: only in-process callers (the selector's probe) set it.
impl From<&LeaseTerms> for apb::Acquire {
    fn from(terms: &LeaseTerms) -> Self {
        apb::Acquire {
            account_id: terms.account_id,
            concurrency_limit: terms.concurrency_limit,
            rpm_limit: terms.rpm_limit,
            user_id: terms.user.as_ref().map(|u| u.user_id.clone()),
            user_rpm_limit: terms.user.as_ref().map(|u| u.rpm_limit).unwrap_or(0),
            session_hash: terms.session_hash.clone(),
            session_window_limit_usd: micros_to_usd(terms.session_window_limit_micros),
            session_bound: terms.session_bound,
            wait_ms: 0,
        }
    }
}

/// A wait as `Acquire.wait_ms`: whole milliseconds, at most the longest wait admission accepts.
pub fn wait_ms(wait: Duration) -> u32 {
    u32::try_from(millis(wait.min(MAX_WAIT))).unwrap_or(u32::MAX)
}

/// `Acquire.wait_ms` as a wait, at most [`MAX_WAIT`].
pub fn wait(wait_ms: u32) -> Result<Duration, ConvertError> {
    let wait = Duration::from_millis(u64::from(wait_ms));
    if wait > MAX_WAIT {
        return Err(ConvertError::new(
            "wait_ms",
            format!("must be at most {} ms, got {wait_ms}", millis(MAX_WAIT)),
        ));
    }
    Ok(wait)
}

/// A USD amount admission accepts as spend (finite, 0..=1e6), in micro-USD.
pub fn spend_micros(field: &'static str, usd: f64) -> Result<i64, ConvertError> {
    usd_to_micros(usd).ok_or_else(|| {
        ConvertError::new(
            field,
            format!("must be a finite amount in [0, 1e6] USD, got {usd}"),
        )
    })
}

/// An account id: positive.
pub fn account_id(field: &'static str, id: i64) -> Result<i64, ConvertError> {
    if id <= 0 {
        return Err(ConvertError::new(
            field,
            format!("must be a positive account id, got {id}"),
        ));
    }
    Ok(id)
}

/// An optional name: absent, or 1..=`MAX_NAME_BYTES` bytes.
fn optional_name(
    field: &'static str,
    value: Option<String>,
) -> Result<Option<String>, ConvertError> {
    match value {
        Some(value) if value.is_empty() => {
            Err(ConvertError::new(field, "must not be empty when set"))
        }
        Some(value) if value.len() > MAX_NAME_BYTES => Err(ConvertError::new(
            field,
            format!(
                "must be at most {MAX_NAME_BYTES} bytes, got {}",
                value.len()
            ),
        )),
        value => Ok(value),
    }
}

/// An `Acquire` (or a `Resume`'s terms) as lease terms, validated as the proto documents. The
/// wait is separate ([`wait`]): a `Resume` ignores it. Field names are the `Acquire`'s own; a
/// server prefixes the message's place (`acquire.`, `resume.terms.`).
impl TryFrom<apb::Acquire> for LeaseTerms {
    type Error = ConvertError;

    fn try_from(acquire: apb::Acquire) -> Result<Self, ConvertError> {
        let account_id = account_id("account_id", acquire.account_id)?;
        let user_id = optional_name("user_id", acquire.user_id)?;
        let session_hash = optional_name("session_hash", acquire.session_hash)?;
        let window_limit = acquire.session_window_limit_usd;
        let session_window_limit_micros = if window_limit.is_finite() && window_limit <= 0.0 {
            0
        } else {
            spend_micros("session_window_limit_usd", window_limit)?
        };
        let user = match (user_id, acquire.user_rpm_limit) {
            (Some(user_id), limit) if limit > 0 => Some(UserLimit {
                user_id,
                rpm_limit: limit,
            }),
            (None, limit) if limit > 0 => {
                return Err(ConvertError::new(
                    "user_id",
                    "is required when user_rpm_limit > 0",
                ));
            }
            _ => None,
        };
        Ok(LeaseTerms {
            account_id,
            concurrency_limit: acquire.concurrency_limit,
            rpm_limit: acquire.rpm_limit,
            user,
            session_hash,
            session_window_limit_micros,
            session_bound: acquire.session_bound,
            ignore_cooldown: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn every_enum_round_trips() {
        round_trips::<_, spb::Platform>(
            &[Platform::Anthropic, Platform::OpenAi],
            known::<spb::Platform>(),
        );
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
        assert_eq!(none_reason(77, "").unwrap_err().field, "reason");
    }

    #[test]
    fn prices_and_denials_round_trip() {
        let price = Price {
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
}
