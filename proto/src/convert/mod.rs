//! Proto ↔ domain conversions, written once for the services and the relay. Decoding is strict:
//! an unknown or `UNSPECIFIED` enum value is a [`ConvertError`] naming the field, never mapped to
//! a likely-looking value (a guessed credential kind sends a credential the wrong way; a guessed
//! deny reason hides a refusal the caller should act on). Servers answer a `ConvertError` with
//! `INVALID_ARGUMENT`; the relay treats one in an answer as a backend error.
//!
//! The exceptions are the declared fallbacks for a value a newer release may send (a number this
//! build does not know; `UNSPECIFIED` stays an error), where a fallback cannot do harm
//! (docs/DESIGN.md §8, "Enum values across releases"): a plan account whose platform or
//! credential kind is newer is left out of the plan ([`newer_value`]); a newer none reason reads
//! as `ALL_BLOCKED` ([`NONE_REASON_FALLBACK`]); a newer effect as `NONE` ([`EFFECT_FALLBACK`]); a
//! window reading of a newer kind, limit or status is dropped; a newer lost reason is resumed
//! (the relay's keeper); a plan account's or usage record's price source that is unset or newer
//! reads as older selectors and relays meant it ([`model_price`], [`usage_price_source`]). Every
//! other enum has no fallback: deny reasons, outcome classes, and
//! what the operator tools read.
//!
//! Enums on the wire are `i32`: decode them with [`EnumField::decode`], which names the field.
//! Fields that carry a value twice while a string field is deprecated (`credential_kind`,
//! `none_reason`) decode through [`credential_kind`] and [`none_reason`]: the enum when set, else
//! the string, and an error when both are set and disagree.

use std::borrow::Cow;

use poolgate_core::account::{CredentialKind, Platform, Price, Service};
use poolgate_core::lease::{DenyReason, LostReason};
use poolgate_core::money::usd_to_micros;
use poolgate_core::outcome::OutcomeClass;
use poolgate_core::plan::Effect;
use poolgate_core::price::{ModelPrice, PriceSource};
use poolgate_core::select::NoneReason;

use crate::admission::v1 as apb;
use crate::selector::v1 as spb;

/// A proto value that has no domain meaning. The message names the field, so a server's
/// `INVALID_ARGUMENT` (or a relay's log line) says which one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {problem}")]
pub struct ConvertError {
    /// The proto field, as its message names it (`platform`, `account_id`, `kind`; a nested
    /// one with its path: `resume.terms.account_id`).
    pub field: Cow<'static, str>,
    /// What is wrong with the value (never the value of a credential).
    pub problem: String,
}

impl ConvertError {
    pub fn new(field: impl Into<Cow<'static, str>>, problem: impl Into<String>) -> Self {
        ConvertError {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The same error for a field inside `message` (`acquire` + `wait_ms` → `acquire.wait_ms`).
    pub fn within(self, message: &str) -> Self {
        ConvertError {
            field: format!("{message}.{}", self.field).into(),
            problem: self.problem,
        }
    }
}

impl From<ConvertError> for tonic::Status {
    fn from(error: ConvertError) -> Self {
        tonic::Status::invalid_argument(error.to_string())
    }
}

/// Whether `value` is a number the enum `P` does not have: a value a newer release added. (`0`,
/// `UNSPECIFIED`, is known: it means "not set", which is not a newer value.)
pub fn newer_value<P: TryFrom<i32>>(value: i32) -> bool {
    P::try_from(value).is_err()
}

/// What a newer none reason reads as: the accounts are there but none serves now, so the client
/// gets a retryable 503 with the answer's `retry_after_ms`, as for a reason this build knows.
pub const NONE_REASON_FALLBACK: NoneReason = NoneReason::AllBlocked;

/// What a newer report effect reads as: nothing the relay must act on (the relay acts only on
/// the effects it knows: a new token, a confirmation).
pub const EFFECT_FALLBACK: Effect = Effect::None;

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
                $domain::try_from(known).map_err(|error| ConvertError { field: field.into(), ..error })
            }
        }
    };
}

enum_pair!("price_source", spb::PriceSource <=> PriceSource {
    Operator <=> Operator,
    Catalogue <=> Catalogue,
    Fallback <=> Fallback,
    None <=> None,
});

/// A plan account's price as the selector sent it. `price_source` unset (an older selector) or
/// newer than this build reads `price` as older selectors meant it (`ModelPrice::legacy`: zeros
/// or unset are no price, anything else the operator's): the price sent is what is charged
/// either way, and a guessed "catalogue" or "fallback" would only mislabel it
/// (docs/DESIGN.md §8).
pub fn model_price(price: Option<spb::Price>, source: i32, fallback_from: String) -> ModelPrice {
    let price: Price = price.unwrap_or_default().into();
    match spb::PriceSource::try_from(source)
        .ok()
        .and_then(|known| PriceSource::try_from(known).ok())
    {
        None => ModelPrice::legacy(price),
        // A selector says "none" only when its operator refuses unpriced models.
        Some(PriceSource::None) => ModelPrice::refused(),
        Some(PriceSource::Fallback) => ModelPrice::fallback(price, fallback_from),
        Some(source) => ModelPrice::new(price, source),
    }
}

/// A usage record's price source: unset is "not said" (an older relay), and so is a value newer
/// than this build (the ledger keeps NULL rather than a guess).
pub fn usage_price_source(source: i32) -> Option<PriceSource> {
    spb::PriceSource::try_from(source)
        .ok()
        .and_then(|known| PriceSource::try_from(known).ok())
}

enum_pair!("platform", spb::Platform <=> Platform {
    Anthropic <=> Anthropic,
    Openai <=> OpenAi,
    Rerank <=> Rerank,
});

enum_pair!("service", spb::Service <=> Service {
    Chat <=> Chat,
    Embeddings <=> Embeddings,
    Rerank <=> Rerank,
});

/// An account's `serves` list from the wire: values newer than this build are left out; `None`
/// when only such values were named (the account serves nothing this build knows: left out,
/// never read as the platform's default, which may serve more).
pub fn serves_from_wire(values: &[i32]) -> Option<Vec<Service>> {
    let known: Vec<Service> = values
        .iter()
        .filter_map(|value| Service::decode("serves", *value).ok())
        .collect();
    (known.is_empty() == values.is_empty()).then_some(known)
}

/// An account's `serves` list to the wire.
pub fn serves_to_wire(serves: &[Service]) -> Vec<i32> {
    serves
        .iter()
        .map(|service| spb::Service::from(*service) as i32)
        .collect()
}

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
    Confirming <=> Confirming,
});

enum_pair!("effect", spb::Effect <=> Effect {
    None <=> None,
    SoftBlock <=> SoftBlock,
    HardBlock <=> HardBlock,
    BreakerOpen <=> BreakerOpen,
    BreakerClosed <=> BreakerClosed,
    Confirming <=> Confirming,
    Error <=> Error,
    Refreshed <=> Refreshed,
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
    KeyConcurrency <=> KeyConcurrency,
    KeyTpm <=> KeyTpm,
    KeyBudget <=> KeyBudget,
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
/// has accounts). Both set and naming different reasons is an error. A reason newer than this
/// build reads as [`NONE_REASON_FALLBACK`] (its string, newer too, is not compared).
pub fn none_reason(reason: i32, legacy: &str) -> Result<Option<NoneReason>, ConvertError> {
    if newer_value::<spb::NoneReason>(reason) {
        return Ok(Some(NONE_REASON_FALLBACK));
    }
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

/// What an outcome report applied, from an answer that carries it twice while `applied` (the
/// string) is deprecated: `effect` when set, else the string. Both set and disagreeing, or
/// neither readable, is an error. An effect newer than this build reads as [`EFFECT_FALLBACK`].
pub fn effect(effect: i32, legacy: &str) -> Result<Effect, ConvertError> {
    if newer_value::<spb::Effect>(effect) {
        return Ok(EFFECT_FALLBACK);
    }
    if effect == spb::Effect::Unspecified as i32 {
        return Effect::parse(legacy)
            .ok_or_else(|| ConvertError::new("applied", "not a known effect (or set effect)"));
    }
    let decoded = Effect::decode("effect", effect)?;
    if !legacy.is_empty() && Effect::parse(legacy) != Some(decoded) {
        return Err(ConvertError::new(
            "effect",
            format!("{} disagrees with the deprecated applied", decoded.as_str()),
        ));
    }
    Ok(decoded)
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

pub mod keys;
mod lease;
mod selection;
mod status;
#[cfg(test)]
mod tests;
mod view;
mod windows;

pub use lease::{
    channel_end, channel_error, channel_event, channel_request, lease_id, wait, wait_ms,
};
pub use selection::{
    MAX_WINDOW_ACCOUNTS, MAX_WINDOW_READINGS, read_outcome, read_report_answer,
    read_windows_request, report_answer, select_request, select_response, windows_request,
};
pub use status::{read_status_answer, status_answer};
pub use windows::{
    AccountReadings, WindowsAnswer, read_windows_answer, read_windows_query, windows_answer,
    windows_query,
};
