//! A client key as the selection API answers for it: the [`Caller`] of a key that may be used,
//! or why it is refused ([`KeyRefused`]), or unknown ([`KeyCheck`]). The same answer whichever
//! implementation of the API gave it (the engine in process, or the selector over gRPC).

use crate::keys::{KeyAccess, KeyRefusal};
use crate::lease::KeyLimits;

/// The authenticated client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub api_key_id: i64,
    pub user: String,
    pub group: String,
    pub user_rpm_limit: i32,
    /// What the key may reach (docs/DESIGN.md §6, "What a client key reaches"): every request
    /// is checked against it before any account is asked.
    pub access: KeyAccess,
    /// What admission counts for the key (docs/DESIGN.md §4, "Client key limits"): its leases
    /// carry them when any is set (`KeyLimits::any`). `api_key_id` is the key's.
    pub limits: KeyLimits,
}

impl Caller {
    /// The key's limits for a lease's terms: `None` when the key has none (its leases are the
    /// ones they were before key limits existed).
    pub fn key_limits(&self) -> Option<KeyLimits> {
        self.limits.any().then(|| KeyLimits {
            api_key_id: self.api_key_id,
            ..self.limits.clone()
        })
    }
}

impl From<crate::account::ApiKeyRecord> for Caller {
    fn from(record: crate::account::ApiKeyRecord) -> Self {
        Caller {
            api_key_id: record.id,
            user: record.user,
            group: record.group,
            user_rpm_limit: record.user_rpm_limit,
            access: record.access,
            limits: record.limits,
        }
    }
}

/// The answer for a client key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyCheck {
    /// A key that may be used (its model and endpoint lists are checked per request).
    Known(Caller),
    /// A key that exists but is refused as a whole: disabled, or expired.
    Refused(KeyRefused),
    /// Unknown or revoked.
    Unknown,
}

impl KeyCheck {
    /// The caller of a key that may be used.
    pub fn caller(self) -> Option<Caller> {
        match self {
            KeyCheck::Known(caller) => Some(caller),
            KeyCheck::Refused(_) | KeyCheck::Unknown => None,
        }
    }
}

/// A key's request refused before any account is asked: why (which decides the status, the
/// error type and the metric label) and the words the client reads, which name the reason and
/// never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRefused {
    pub reason: RefusedFor,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefusedFor {
    Disabled,
    Expired,
    Endpoint,
    /// The model the client asked for.
    Model(String),
}

impl RefusedFor {
    /// The label of `relay_key_refusals_total` (bounded: never the model or the key).
    pub fn as_str(&self) -> &'static str {
        match self {
            RefusedFor::Disabled => "disabled",
            RefusedFor::Expired => "expired",
            RefusedFor::Endpoint => "endpoint",
            RefusedFor::Model(_) => "model",
        }
    }
}

impl From<KeyRefusal> for KeyRefused {
    fn from(refusal: KeyRefusal) -> Self {
        let message = refusal.message();
        let reason = match refusal {
            KeyRefusal::Disabled => RefusedFor::Disabled,
            KeyRefusal::Expired { .. } => RefusedFor::Expired,
            KeyRefusal::EndpointNotAllowed(_) => RefusedFor::Endpoint,
            KeyRefusal::ModelNotAllowed(model) => RefusedFor::Model(model),
        };
        KeyRefused { reason, message }
    }
}
