//! Admission's messages: the lease stream (acquire, resume and the rest; the events back), the
//! lease channel's tagged messages, lease terms, denials and waits.

use std::time::Duration;

use poolgate_core::lease::{
    ChannelRequest, ChannelTag, ClientMessage, Denial, DenyReason, KeyLimits, LeaseEvent, LeaseId,
    LeaseTerms, MAX_WAIT, UserLimit,
};
use poolgate_core::money::micros_to_usd;
use poolgate_core::{MAX_NAME_BYTES, millis};

use super::keys::budget_micros;
use super::{ConvertError, EnumField, account_id, spend_micros};
use crate::admission::v1 as apb;

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
                tokens: release.tokens,
            }),
        }
    }
}

/// A lease channel message: its tag, and what it asks of that conversation. The outer error is
/// a malformed channel message (tag 0, no kind: the whole channel fails); the inner one is bad
/// input in the conversation's own request (only that conversation ends with it), its field
/// named as on a lease stream.
#[allow(clippy::type_complexity)]
pub fn channel_request(
    request: apb::ChannelRequest,
) -> Result<(ChannelTag, Result<ChannelRequest, ConvertError>), ConvertError> {
    use apb::channel_request::Kind;
    let tag = ChannelTag::new(request.tag)
        .ok_or_else(|| ConvertError::new("tag", "must be > 0 (the holder's conversation tag)"))?;
    let asked = match request.kind {
        None => {
            return Err(ConvertError::new(
                "kind",
                "a channel request must set one of request, close",
            ));
        }
        Some(Kind::Close(_)) => Ok(ChannelRequest::Close),
        Some(Kind::Request(request)) => {
            ClientMessage::try_from(request).map(ChannelRequest::Message)
        }
    };
    Ok((tag, asked))
}

/// One conversation's event on a lease channel.
pub fn channel_event(tag: ChannelTag, event: LeaseEvent) -> apb::ChannelEvent {
    tagged(tag, apb::channel_event::Kind::Event(event.into()))
}

/// One conversation's failure on a lease channel: `code` is the gRPC status code a lease stream
/// would have ended with.
pub fn channel_error(tag: ChannelTag, code: i32, message: String) -> apb::ChannelEvent {
    tagged(
        tag,
        apb::channel_event::Kind::Error(apb::ChannelError { code, message }),
    )
}

/// The end of one conversation on a lease channel: its tag may be reused.
pub fn channel_end(tag: ChannelTag) -> apb::ChannelEvent {
    tagged(tag, apb::channel_event::Kind::End(apb::ChannelEnd {}))
}

fn tagged(tag: ChannelTag, kind: apb::channel_event::Kind) -> apb::ChannelEvent {
    apb::ChannelEvent {
        tag: tag.get(),
        kind: Some(kind),
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
        let key = terms.key.as_ref().filter(|key| key.any());
        let usd = |micros: i64| micros_to_usd(micros.max(0));
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
            api_key_id: key.map_or(0, |key| key.api_key_id),
            key_concurrency_limit: key.map_or(0, |key| key.concurrency_limit.max(0)),
            key_tpm_limit: key.map_or(0, |key| key.tpm_limit.max(0)),
            key_budget_total_usd: key.map_or(0.0, |key| usd(key.budget_total_micros)),
            key_budget_day_usd: key.map_or(0.0, |key| usd(key.budget_day_micros)),
            key_budget_week_usd: key.map_or(0.0, |key| usd(key.budget_week_micros)),
            key_budget_month_usd: key.map_or(0.0, |key| usd(key.budget_month_micros)),
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
        let key = key_limits(&acquire)?;
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
            key,
        })
    }
}

/// The `key_*` fields: `None` when no key limit is set; a limit without `api_key_id` or a
/// negative one is refused, naming the field.
fn key_limits(acquire: &apb::Acquire) -> Result<Option<KeyLimits>, ConvertError> {
    if acquire.key_concurrency_limit < 0 {
        return Err(ConvertError::new(
            "key_concurrency_limit",
            format!("must be >= 0, got {}", acquire.key_concurrency_limit),
        ));
    }
    if acquire.key_tpm_limit < 0 {
        return Err(ConvertError::new(
            "key_tpm_limit",
            format!("must be >= 0, got {}", acquire.key_tpm_limit),
        ));
    }
    if acquire.api_key_id < 0 {
        return Err(ConvertError::new(
            "api_key_id",
            format!("must be a positive key id, got {}", acquire.api_key_id),
        ));
    }
    let limits = KeyLimits {
        api_key_id: acquire.api_key_id,
        concurrency_limit: acquire.key_concurrency_limit,
        tpm_limit: acquire.key_tpm_limit,
        budget_total_micros: budget_micros("key_budget_total_usd", acquire.key_budget_total_usd)?,
        budget_day_micros: budget_micros("key_budget_day_usd", acquire.key_budget_day_usd)?,
        budget_week_micros: budget_micros("key_budget_week_usd", acquire.key_budget_week_usd)?,
        budget_month_micros: budget_micros("key_budget_month_usd", acquire.key_budget_month_usd)?,
    };
    if !limits.any() {
        return Ok(None);
    }
    if limits.api_key_id == 0 {
        return Err(ConvertError::new(
            "api_key_id",
            "is required when a key limit is set",
        ));
    }
    Ok(Some(limits))
}
