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

use std::borrow::Cow;
use std::time::Duration;

use poolgate_core::account::{Account, Secret};
use poolgate_core::account::{CredentialKind, Platform, Price};
use poolgate_core::lease::{
    ClientMessage, Denial, DenyReason, LeaseEvent, LeaseId, LeaseTerms, LostReason, MAX_WAIT,
    UserLimit,
};
use poolgate_core::money::{micros_to_usd, usd_to_micros};
use poolgate_core::outcome::OutcomeClass;
use poolgate_core::plan::{Effect, Plan, PlannedAccount, UsageRecord};
use poolgate_core::select::NoneReason;
use poolgate_core::{MAX_NAME_BYTES, millis};

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

/// What an outcome report applied, from an answer that carries it twice while `applied` (the
/// string) is deprecated: `effect` when set, else the string. Both set and disagreeing, or
/// neither readable, is an error.
pub fn effect(effect: i32, legacy: &str) -> Result<Effect, ConvertError> {
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

/// The answer to an outcome report: what was applied, its block length, and with
/// [`Effect::Refreshed`] the fresh credential to retry with.
// The deprecated string field is filled next to the enum until no caller reads it.
#[allow(deprecated)]
pub fn report_answer(
    effect: Effect,
    block_ms: u64,
    refreshed: Option<&Secret>,
) -> spb::ReportOutcomeResponse {
    spb::ReportOutcomeResponse {
        applied: effect.as_str().to_owned(),
        block_ms,
        refreshed_credential: refreshed
            .map(|fresh| fresh.expose().to_owned())
            .unwrap_or_default(),
        effect: spb::Effect::from(effect) as i32,
    }
}

/// A report answer read strictly: the effect, and the fresh credential when the effect is
/// [`Effect::Refreshed`] (a refreshed answer without one is an error, never a retry with
/// nothing).
#[allow(deprecated)]
pub fn read_report_answer(
    answer: spb::ReportOutcomeResponse,
) -> Result<(Effect, Option<Secret>), ConvertError> {
    let effect = effect(answer.effect, &answer.applied)?;
    if effect != Effect::Refreshed {
        return Ok((effect, None));
    }
    if answer.refreshed_credential.is_empty() {
        return Err(ConvertError::new(
            "refreshed_credential",
            "is required when the effect is refreshed",
        ));
    }
    Ok((effect, Some(Secret::new(answer.refreshed_credential))))
}

// The deprecated string field is filled next to the enum until no caller reads it.
#[allow(deprecated)]
impl From<&PlannedAccount> for spb::PlanAccount {
    fn from(account: &PlannedAccount) -> Self {
        spb::PlanAccount {
            account_id: account.id,
            name: account.name.clone(),
            platform: spb::Platform::from(account.platform) as i32,
            base_url: account.base_url.clone(),
            credential: account.credential.expose().to_owned(),
            kind: spb::CredentialKind::from(account.credential_kind) as i32,
            credential_kind: account.credential_kind.as_str().to_owned(),
            mapped_model: account.mapped_model.clone(),
            concurrency_limit: account.concurrency_limit,
            rpm_limit: account.rpm_limit,
            session_window_limit_usd: account.session_window_limit_usd,
            proxy_url: account.proxy_url.clone().unwrap_or_default(),
            disable_stream_usage: !account.stream_usage,
            price: Some(account.price.into()),
            soft_blocked: account.soft_blocked,
            inflight: account
                .inflight
                .and_then(|n| i32::try_from(n).ok())
                .unwrap_or(-1),
        }
    }
}

/// A plan as the selector answers it. The group's `usage_headers_to_clients` travels once per
/// answer (every account of a plan is of the request's group).
#[allow(deprecated)]
impl From<&Plan> for spb::SelectResponse {
    fn from(plan: &Plan) -> Self {
        spb::SelectResponse {
            accounts: plan.accounts.iter().map(spb::PlanAccount::from).collect(),
            sticky: plan.sticky,
            reason: plan
                .none_reason
                .map(|reason| spb::NoneReason::from(reason) as i32)
                .unwrap_or_default(),
            none_reason: plan
                .none_reason
                .map(|reason| reason.as_str().to_owned())
                .unwrap_or_default(),
            retry_after_ms: plan.retry_after_ms,
            previous_response_other_key: plan.previous_response_other_key,
            usage_headers_to_clients: plan
                .accounts
                .first()
                .is_some_and(|account| account.usage_headers_to_clients),
        }
    }
}

/// A plan read strictly: an account whose credential kind or platform the reader cannot read
/// fails the whole answer (a credential is never sent the wrong way on a guess).
#[allow(deprecated)]
impl TryFrom<spb::SelectResponse> for Plan {
    type Error = ConvertError;

    fn try_from(answer: spb::SelectResponse) -> Result<Self, ConvertError> {
        let usage_headers_to_clients = answer.usage_headers_to_clients;
        let accounts = answer
            .accounts
            .into_iter()
            .map(|account| {
                let credential_kind = credential_kind(account.kind, &account.credential_kind)?;
                Ok(PlannedAccount {
                    id: account.account_id,
                    name: account.name,
                    platform: Platform::decode("platform", account.platform)?,
                    base_url: account.base_url,
                    credential: Secret::new(account.credential),
                    credential_kind,
                    mapped_model: account.mapped_model,
                    concurrency_limit: account.concurrency_limit,
                    rpm_limit: account.rpm_limit,
                    session_window_limit_usd: account.session_window_limit_usd,
                    proxy_url: (!account.proxy_url.is_empty()).then_some(account.proxy_url),
                    stream_usage: !account.disable_stream_usage,
                    price: account.price.unwrap_or_default().into(),
                    soft_blocked: account.soft_blocked,
                    inflight: u32::try_from(account.inflight).ok(),
                    usage_headers_to_clients,
                })
            })
            .collect::<Result<Vec<_>, ConvertError>>()?;
        Ok(Plan {
            accounts,
            sticky: answer.sticky,
            none_reason: none_reason(answer.reason, &answer.none_reason)?,
            retry_after_ms: answer.retry_after_ms,
            previous_response_other_key: answer.previous_response_other_key,
        })
    }
}

impl From<UsageRecord> for spb::UsageRecord {
    fn from(r: UsageRecord) -> Self {
        spb::UsageRecord {
            api_key_id: r.api_key_id,
            user: r.user,
            account_id: r.account_id,
            model: r.model,
            input_tokens: r.input_tokens,
            output_tokens: r.output_tokens,
            cache_write_tokens: r.cache_write_tokens,
            cache_read_tokens: r.cache_read_tokens,
            cost_usd: r.cost_usd,
            status: u32::from(r.status),
            latency_ms: r.latency_ms,
            at_ms: r.at_ms,
        }
    }
}

/// A usage record as a relay sends it; `field` names the batch in errors.
impl TryFrom<spb::UsageRecord> for UsageRecord {
    type Error = ConvertError;

    fn try_from(r: spb::UsageRecord) -> Result<Self, ConvertError> {
        Ok(UsageRecord {
            api_key_id: r.api_key_id,
            user: r.user,
            account_id: r.account_id,
            model: r.model,
            input_tokens: r.input_tokens,
            output_tokens: r.output_tokens,
            cache_write_tokens: r.cache_write_tokens,
            cache_read_tokens: r.cache_read_tokens,
            cost_usd: r.cost_usd,
            status: u16::try_from(r.status)
                .map_err(|_| ConvertError::new("records.status", "must be an HTTP status"))?,
            latency_ms: r.latency_ms,
            at_ms: r.at_ms,
        })
    }
}

/// A lease id as a holder sends it; `field` names it in the error (the text is shown cut short,
/// never whole).
pub fn lease_id(field: &'static str, text: &str) -> Result<LeaseId, ConvertError> {
    LeaseId::parse(text).ok_or_else(|| {
        let shown: String = text.chars().take(64).collect();
        ConvertError::new(field, format!("not a lease id: {shown:?}"))
    })
}

/// An `Acquire` as lease terms and the wait it asks for; errors name the field inside `message`.
fn acquire_terms(
    acquire: apb::Acquire,
    message: &str,
) -> Result<(LeaseTerms, Duration), ConvertError> {
    let wait = wait(acquire.wait_ms).map_err(|e| e.within(message))?;
    let terms = LeaseTerms::try_from(acquire).map_err(|e| e.within(message))?;
    Ok((terms, wait))
}

/// A message of the lease stream, validated: a resume's terms must be for its lease's account.
impl TryFrom<apb::LeaseRequest> for ClientMessage {
    type Error = ConvertError;

    fn try_from(request: apb::LeaseRequest) -> Result<Self, ConvertError> {
        use apb::lease_request::Kind;
        match request.kind {
            None => Err(ConvertError::new(
                "kind",
                "a lease request must set one of acquire, resume, heartbeat, attempt, release",
            )),
            Some(Kind::Acquire(acquire)) => {
                let (terms, wait) = acquire_terms(acquire, "acquire")?;
                Ok(ClientMessage::Acquire { terms, wait })
            }
            Some(Kind::Resume(resume)) => {
                let lease_id = lease_id("resume.lease_id", &resume.lease_id)?;
                let acquire = resume.terms.ok_or_else(|| {
                    ConvertError::new("resume.terms", "is required (the original acquire)")
                })?;
                let (terms, _) = acquire_terms(acquire, "resume.terms")?;
                if terms.account_id != lease_id.account_id() {
                    return Err(ConvertError::new(
                        "resume.terms.account_id",
                        "does not match the lease id's account",
                    ));
                }
                Ok(ClientMessage::Resume { lease_id, terms })
            }
            Some(Kind::Heartbeat(_)) => Ok(ClientMessage::Heartbeat),
            Some(Kind::Attempt(_)) => Ok(ClientMessage::Attempt),
            Some(Kind::Release(release)) => Ok(ClientMessage::Release {
                spend_micros: spend_micros("release.spend_usd", release.spend_usd)?,
            }),
        }
    }
}

fn ttl_ms(ttl: Duration) -> u32 {
    u32::try_from(millis(ttl)).unwrap_or(u32::MAX)
}

impl From<LeaseEvent> for apb::LeaseEvent {
    fn from(event: LeaseEvent) -> Self {
        use apb::lease_event::Kind;
        let kind = match event {
            LeaseEvent::Granted { lease_id, ttl } => Kind::Granted(apb::Granted {
                lease_id: lease_id.to_string(),
                ttl_ms: ttl_ms(ttl),
            }),
            LeaseEvent::Denied(denial) => Kind::Denied(denial.into()),
            LeaseEvent::Queued { position } => Kind::Queued(apb::Queued { position }),
            LeaseEvent::Renewed { ttl, restored } => Kind::Renewed(apb::Renewed {
                ttl_ms: ttl_ms(ttl),
                restored,
            }),
            LeaseEvent::NotRenewed { left } => Kind::NotRenewed(apb::NotRenewed {
                ttl_ms: ttl_ms(left),
            }),
            LeaseEvent::AttemptAccepted => Kind::AttemptAccepted(apb::AttemptAccepted {}),
            LeaseEvent::Released => Kind::Released(apb::Released {}),
            LeaseEvent::Lost { reason, detail } => Kind::Lost(apb::Lost {
                reason: detail,
                lost_reason: apb::LostReason::from(reason) as i32,
            }),
        };
        apb::LeaseEvent { kind: Some(kind) }
    }
}

// The deprecated `credential_kind` string is filled next to `kind` until no caller reads it.
#[allow(deprecated)]
impl From<&Account> for spb::AccountView {
    fn from(account: &Account) -> Self {
        spb::AccountView {
            id: account.id,
            name: account.name.clone(),
            group: account.group.clone(),
            platform: spb::Platform::from(account.platform) as i32,
            base_url: account.base_url.clone(),
            credential_masked: account.credential.masked(),
            kind: spb::CredentialKind::from(account.credential_kind) as i32,
            credential_kind: account.credential_kind.as_str().to_owned(),
            status: account.status.as_str().to_owned(),
            status_reason: account.status_reason.clone(),
            priority: account.priority,
            weight: account.weight,
            concurrency_limit: account.concurrency_limit,
            rpm_limit: account.rpm_limit,
            session_window_limit_usd: account.session_window_limit_usd,
            allowed_models: account.allowed_models.clone(),
            model_mapping: account.model_mapping.clone().into_iter().collect(),
            proxy_url: account.proxy_url.clone().unwrap_or_default(),
            probe_model: account.probe_model.clone().unwrap_or_default(),
            disable_stream_usage: !account.stream_usage,
        }
    }
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
            plan_entry(99, ""),
            plan_entry(0, ""),
            plan_entry(0, "bearer"),
            plan_entry(spb::CredentialKind::ApiKey as i32, "oauth"),
        ] {
            let good = plan_entry(spb::CredentialKind::ApiKey as i32, "api_key");
            assert!(Plan::try_from(select_answer(vec![good, account], 0, "")).is_err());
        }
        assert!(Plan::try_from(select_answer(vec![], 42, "")).is_err());
        assert!(Plan::try_from(select_answer(vec![], 0, "everything_on_fire")).is_err());
    }
}
