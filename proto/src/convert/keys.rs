//! Client keys on the wire (docs/DESIGN.md §6, "What a client key reaches"): what `Authenticate`
//! answers (a key's access, or the refusal of a disabled or expired key with the metadata entry
//! that names why), the self-service `DescribeKey`, and the operator's key view, new keys' limits
//! and partial updates. Read strictly: an unknown endpoint name, a bad pattern, a negative expiry
//! or an unknown period is an error naming the field, never dropped or guessed.

use poolgate_core::account::ApiKeyRecord;
use poolgate_core::keys::{
    Endpoint, KeyAccess, KeyDescription, KeyRefusal, PeriodUsage, UsagePeriod,
    check_model_patterns, parse_endpoints,
};

use super::ConvertError;
use crate::selector::v1 as spb;

/// The ASCII metadata entry of an `Authenticate` refusal (`PERMISSION_DENIED`) that names why:
/// [`key_refusal_name`].
pub const KEY_REFUSAL_METADATA: &str = "poolgate-key-refusal";

/// The name `poolgate-key-refusal` carries for a key refused as a whole: `disabled` or `expired`;
/// `None` for the refusals of one request (endpoint, model), which the relay decides itself.
pub fn key_refusal_name(refusal: &KeyRefusal) -> Option<&'static str> {
    match refusal {
        KeyRefusal::Disabled => Some("disabled"),
        KeyRefusal::Expired { .. } => Some("expired"),
        KeyRefusal::EndpointNotAllowed(_) | KeyRefusal::ModelNotAllowed(_) => None,
    }
}

/// `Authenticate`'s answer for a key refused as a whole: `PERMISSION_DENIED` with the client's
/// words for it ([`KeyRefusal::message`], which never names the key) and the
/// [`KEY_REFUSAL_METADATA`] entry. `None` for a refusal that is not of the key as a whole.
pub fn key_refusal_status(refusal: &KeyRefusal) -> Option<tonic::Status> {
    let name = key_refusal_name(refusal)?;
    let mut status = tonic::Status::permission_denied(refusal.message());
    status.metadata_mut().insert(
        KEY_REFUSAL_METADATA,
        tonic::metadata::AsciiMetadataValue::from_static(name),
    );
    Some(status)
}

/// An expiry on the wire: ms since the epoch, 0 for never.
fn expiry_to_wire(expires_at_ms: Option<i64>) -> i64 {
    expires_at_ms.unwrap_or(0)
}

/// An expiry from the wire (`field` names it): 0 is never, a negative value is an error.
pub fn expiry(field: &'static str, expires_at_ms: i64) -> Result<Option<i64>, ConvertError> {
    match expires_at_ms {
        0 => Ok(None),
        ms if ms > 0 => Ok(Some(ms)),
        ms => Err(ConvertError::new(
            field,
            format!("must be ms since the epoch (0: never), got {ms}"),
        )),
    }
}

/// An endpoint list as names (`messages`, `models`), as the wire and the database keep it.
pub fn endpoint_names(endpoints: &[Endpoint]) -> Vec<String> {
    endpoints.iter().map(|e| e.as_str().to_owned()).collect()
}

/// A model pattern list from the wire, checked as an operator's ([`check_model_patterns`]).
pub fn model_patterns(
    field: &'static str,
    patterns: Vec<String>,
) -> Result<Vec<String>, ConvertError> {
    check_model_patterns(&patterns).map_err(|problem| ConvertError::new(field, problem))?;
    Ok(patterns)
}

/// An endpoint list from the wire: every name known ([`parse_endpoints`]), at most one entry
/// per endpoint.
pub fn endpoints(field: &'static str, names: &[String]) -> Result<Vec<Endpoint>, ConvertError> {
    parse_endpoints(names).map_err(|problem| ConvertError::new(field, problem))
}

fn access(
    expires_at_ms: i64,
    disabled: bool,
    allowed_models: Vec<String>,
    allowed_endpoints: &[String],
) -> Result<KeyAccess, ConvertError> {
    Ok(KeyAccess {
        expires_at_ms: expiry("expires_at_ms", expires_at_ms)?,
        disabled,
        allowed_models: model_patterns("allowed_models", allowed_models)?,
        allowed_endpoints: endpoints("allowed_endpoints", allowed_endpoints)?,
    })
}

/// `Authenticate`'s answer for a key that may be used (a refused one is
/// [`key_refusal_status`]).
impl From<&ApiKeyRecord> for spb::AuthenticateResponse {
    fn from(record: &ApiKeyRecord) -> Self {
        spb::AuthenticateResponse {
            api_key_id: record.id,
            user: record.user.clone(),
            group: record.group.clone(),
            user_rpm_limit: record.user_rpm_limit,
            expires_at_ms: expiry_to_wire(record.access.expires_at_ms),
            allowed_models: record.access.allowed_models.clone(),
            allowed_endpoints: endpoint_names(&record.access.allowed_endpoints),
        }
    }
}

/// What a key that `Authenticate` accepted may reach (never disabled: a disabled key is
/// refused). An answer with a list the relay cannot read is an error, never a key without limits.
pub fn authenticated_access(answer: &spb::AuthenticateResponse) -> Result<KeyAccess, ConvertError> {
    access(
        answer.expires_at_ms,
        false,
        answer.allowed_models.clone(),
        &answer.allowed_endpoints,
    )
}

/// A key as its holder sees it, on the wire.
impl From<&KeyDescription> for spb::DescribeKeyResponse {
    fn from(description: &KeyDescription) -> Self {
        let record = &description.record;
        spb::DescribeKeyResponse {
            api_key_id: record.id,
            name: record.name.clone(),
            user: record.user.clone(),
            group: record.group.clone(),
            user_rpm_limit: record.user_rpm_limit,
            expires_at_ms: expiry_to_wire(record.access.expires_at_ms),
            disabled: record.access.disabled,
            allowed_models: record.access.allowed_models.clone(),
            allowed_endpoints: endpoint_names(&record.access.allowed_endpoints),
            usage: description
                .usage
                .iter()
                .map(|(period, from_ms, usage)| spb::KeyPeriodUsage {
                    period: period.as_str().to_owned(),
                    from_ms: *from_ms,
                    requests: usage.requests,
                    input_tokens: usage.input_tokens,
                    output_tokens: usage.output_tokens,
                    cost_usd: usage.cost_usd,
                })
                .collect(),
            key_prefix: record.prefix.clone(),
        }
    }
}

/// A period's name (`day`, `week`, `month`, `total`) to the period.
pub fn usage_period(field: &'static str, name: &str) -> Result<UsagePeriod, ConvertError> {
    UsagePeriod::ALL
        .into_iter()
        .find(|period| period.as_str() == name)
        .ok_or_else(|| {
            ConvertError::new(
                field,
                format!("unknown period {name:?} (day, week, month, total)"),
            )
        })
}

/// A `DescribeKey` answer read strictly (the relay shows it to the key's holder). The key it
/// describes exists and is not revoked (`active`).
impl TryFrom<spb::DescribeKeyResponse> for KeyDescription {
    type Error = ConvertError;

    fn try_from(answer: spb::DescribeKeyResponse) -> Result<Self, ConvertError> {
        if answer.api_key_id <= 0 {
            return Err(ConvertError::new(
                "api_key_id",
                format!("must be a positive key id, got {}", answer.api_key_id),
            ));
        }
        let access = access(
            answer.expires_at_ms,
            answer.disabled,
            answer.allowed_models,
            &answer.allowed_endpoints,
        )?;
        let usage = answer
            .usage
            .into_iter()
            .map(|usage| {
                let period = usage_period("usage.period", &usage.period)?;
                if !usage.cost_usd.is_finite() {
                    return Err(ConvertError::new("usage.cost_usd", "must be finite"));
                }
                Ok((
                    period,
                    usage.from_ms,
                    PeriodUsage {
                        requests: usage.requests,
                        input_tokens: usage.input_tokens,
                        output_tokens: usage.output_tokens,
                        cost_usd: usage.cost_usd,
                    },
                ))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(KeyDescription {
            record: ApiKeyRecord {
                id: answer.api_key_id,
                name: answer.name,
                prefix: answer.key_prefix,
                user: answer.user,
                group: answer.group,
                user_rpm_limit: answer.user_rpm_limit,
                limits: Default::default(),
                active: true,
                access,
            },
            usage,
        })
    }
}

/// A key's stored status as operators see it: `revoked`, `disabled` or `active` (an expired key
/// keeps its status; its expiry says the rest).
pub fn key_status(record: &ApiKeyRecord) -> &'static str {
    if !record.active {
        "revoked"
    } else if record.access.disabled {
        "disabled"
    } else {
        "active"
    }
}

/// A stored status ([`key_status`]) as (`active`: not revoked, `disabled`); `None` for any
/// other word.
pub fn parse_key_status(status: &str) -> Option<(bool, bool)> {
    match status {
        "active" => Some((true, false)),
        "disabled" => Some((true, true)),
        "revoked" => Some((false, false)),
        _ => None,
    }
}

/// A key as the operator's list shows it (its hash never).
impl From<&ApiKeyRecord> for spb::ApiKeyView {
    fn from(record: &ApiKeyRecord) -> Self {
        spb::ApiKeyView {
            id: record.id,
            name: record.name.clone(),
            user: record.user.clone(),
            group: record.group.clone(),
            user_rpm_limit: record.user_rpm_limit,
            status: key_status(record).to_owned(),
            prefix: record.prefix.clone(),
            expires_at_ms: expiry_to_wire(record.access.expires_at_ms),
            allowed_models: record.access.allowed_models.clone(),
            allowed_endpoints: endpoint_names(&record.access.allowed_endpoints),
        }
    }
}

/// A key of the operator's list read strictly (the CLI shows it): a status other than
/// `active`, `disabled` or `revoked`, or a list it cannot read, is an error.
impl TryFrom<spb::ApiKeyView> for ApiKeyRecord {
    type Error = ConvertError;

    fn try_from(view: spb::ApiKeyView) -> Result<Self, ConvertError> {
        let (active, disabled) = parse_key_status(&view.status).ok_or_else(|| {
            ConvertError::new(
                "status",
                format!("must be active, disabled or revoked, got {:?}", view.status),
            )
        })?;
        Ok(ApiKeyRecord {
            id: view.id,
            name: view.name,
            prefix: view.prefix,
            user: view.user,
            group: view.group,
            user_rpm_limit: view.user_rpm_limit,
            limits: Default::default(),
            active,
            access: access(
                view.expires_at_ms,
                disabled,
                view.allowed_models,
                &view.allowed_endpoints,
            )?,
        })
    }
}

/// The limits a `CreateApiKey` request gives its new key (never disabled at birth).
pub fn new_key_access(request: &spb::CreateApiKeyRequest) -> Result<KeyAccess, ConvertError> {
    access(
        request.expires_at_ms.unwrap_or(0),
        false,
        request.allowed_models.clone(),
        &request.allowed_endpoints,
    )
}

/// An operator's change to a key: only what is `Some` changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyUpdate {
    /// `true`: disable; `false`: enable.
    pub disabled: Option<bool>,
    /// `Some(None)`: clear the expiry.
    pub expires_at_ms: Option<Option<i64>>,
    /// The new model list (empty: every model).
    pub allowed_models: Option<Vec<String>>,
    /// The new endpoint list (empty: every endpoint).
    pub allowed_endpoints: Option<Vec<Endpoint>>,
}

impl KeyUpdate {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == KeyUpdate::default()
    }

    /// `access` with this change made.
    pub fn apply(&self, access: &KeyAccess) -> KeyAccess {
        KeyAccess {
            expires_at_ms: self.expires_at_ms.unwrap_or(access.expires_at_ms),
            disabled: self.disabled.unwrap_or(access.disabled),
            allowed_models: self
                .allowed_models
                .clone()
                .unwrap_or_else(|| access.allowed_models.clone()),
            allowed_endpoints: self
                .allowed_endpoints
                .clone()
                .unwrap_or_else(|| access.allowed_endpoints.clone()),
        }
    }
}

/// The request of a partial update (`UpdateApiKey`): the key's id and the change. A list given
/// without its `replace_*` flag is an error (the caller meant something it did not say), and so
/// is a request that changes nothing.
impl TryFrom<spb::UpdateApiKeyRequest> for (i64, KeyUpdate) {
    type Error = ConvertError;

    fn try_from(request: spb::UpdateApiKeyRequest) -> Result<Self, ConvertError> {
        if request.id <= 0 {
            return Err(ConvertError::new(
                "id",
                format!("must be a positive key id, got {}", request.id),
            ));
        }
        let list = |replace: bool, given: bool, field: &'static str| {
            if given && !replace {
                return Err(ConvertError::new(
                    field,
                    format!(
                        "is taken only with replace_{field} (an empty list allows every value)"
                    ),
                ));
            }
            Ok(replace)
        };
        let models = list(
            request.replace_allowed_models,
            !request.allowed_models.is_empty(),
            "allowed_models",
        )?;
        let endpoint_list = list(
            request.replace_allowed_endpoints,
            !request.allowed_endpoints.is_empty(),
            "allowed_endpoints",
        )?;
        let update = KeyUpdate {
            disabled: request.disabled,
            expires_at_ms: request
                .expires_at_ms
                .map(|ms| expiry("expires_at_ms", ms))
                .transpose()?,
            allowed_models: models
                .then(|| model_patterns("allowed_models", request.allowed_models))
                .transpose()?,
            allowed_endpoints: endpoint_list
                .then(|| endpoints("allowed_endpoints", &request.allowed_endpoints))
                .transpose()?,
        };
        if update.is_empty() {
            return Err(ConvertError::new(
                "id",
                "the update changes nothing: give disabled, expires_at_ms or a replace_* list",
            ));
        }
        Ok((request.id, update))
    }
}

/// The `UpdateApiKey` request of a change (the operator CLI's).
impl From<(i64, &KeyUpdate)> for spb::UpdateApiKeyRequest {
    fn from((id, update): (i64, &KeyUpdate)) -> Self {
        spb::UpdateApiKeyRequest {
            id,
            disabled: update.disabled,
            expires_at_ms: update.expires_at_ms.map(expiry_to_wire),
            allowed_models: update.allowed_models.clone().unwrap_or_default(),
            replace_allowed_models: update.allowed_models.is_some(),
            allowed_endpoints: update
                .allowed_endpoints
                .as_deref()
                .map(endpoint_names)
                .unwrap_or_default(),
            replace_allowed_endpoints: update.allowed_endpoints.is_some(),
        }
    }
}
