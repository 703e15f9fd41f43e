//! Client keys on the wire (docs/DESIGN.md §6, "What a client key reaches"): what `Authenticate`
//! answers (a key's access, or the refusal of a disabled or expired key with the metadata entry
//! that names why), the self-service `DescribeKey`, and the operator's key view, new keys' limits
//! and partial updates; with each, the key's own limits (concurrency, TPM, budgets: docs/DESIGN.md
//! §4, "Client key limits"). Read strictly: an unknown endpoint name, a bad pattern, a negative
//! expiry or limit, a budget that is not a finite amount, or an unknown period is an error naming
//! the field, never dropped or guessed — except an endpoint name in the answers a relay reads
//! (`Authenticate`, `DescribeKey`), which a newer selector may know and this release not: it is
//! left out, and a list of only such names holds the key disabled (docs/DESIGN.md §8).

use poolgate_core::account::ApiKeyRecord;
/// An operator's partial change to a key, the domain type `UpdateApiKey` carries.
pub use poolgate_core::keys::KeyUpdate;
use poolgate_core::keys::{
    Endpoint, KeyAccess, KeyDescription, KeyRefusal, ModelPeriodUsage, PeriodUsage, UsagePeriod,
    check_model_patterns, check_new_model_patterns, known_endpoints, parse_endpoints,
};
use poolgate_core::lease::KeyLimits;
use poolgate_core::money::{MAX_SPEND_USD, micros_to_usd, usd_to_micros};

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

/// A new model pattern list from the wire (a key created or changed): only the documented
/// syntax ([`check_new_model_patterns`]).
pub fn new_model_patterns(
    field: &'static str,
    patterns: Vec<String>,
) -> Result<Vec<String>, ConvertError> {
    check_new_model_patterns(&patterns).map_err(|problem| ConvertError::new(field, problem))?;
    Ok(patterns)
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

/// A key's access as an answer of a newer release may carry it: an endpoint this release does not
/// know is left out of the list, and a list of only such endpoints holds the key disabled, never
/// reads as no list ([`known_endpoints`], DESIGN §8). Everything else is read strictly.
fn answered_access(
    expires_at_ms: i64,
    disabled: bool,
    allowed_models: Vec<String>,
    allowed_endpoints: &[String],
) -> Result<KeyAccess, ConvertError> {
    let (known, only_newer) = known_endpoints(allowed_endpoints);
    Ok(KeyAccess {
        expires_at_ms: expiry("expires_at_ms", expires_at_ms)?,
        disabled: disabled || only_newer,
        allowed_models: model_patterns("allowed_models", allowed_models)?,
        allowed_endpoints: known,
    })
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

/// A key's concurrency limit from the wire: 0 none, negative refused.
pub fn concurrency_limit(field: &'static str, limit: i32) -> Result<i32, ConvertError> {
    if limit < 0 {
        return Err(ConvertError::new(
            field,
            format!("must be >= 0 (0: none), got {limit}"),
        ));
    }
    Ok(limit)
}

/// A key's TPM limit from the wire: 0 none, negative refused.
pub fn tpm_limit(field: &'static str, limit: i64) -> Result<i64, ConvertError> {
    if limit < 0 {
        return Err(ConvertError::new(
            field,
            format!("must be >= 0 (0: none), got {limit}"),
        ));
    }
    Ok(limit)
}

/// A key's budget in USD as micro-USD (0: none); negative, not finite or above
/// [`MAX_SPEND_USD`] refused.
pub fn budget_micros(field: &'static str, usd: f64) -> Result<i64, ConvertError> {
    usd_to_micros(usd).ok_or_else(|| {
        ConvertError::new(
            field,
            format!("must be a finite amount in [0, {MAX_SPEND_USD}] USD (0: none), got {usd}"),
        )
    })
}

/// A budget on the wire: USD, 0 for none.
pub fn budget_usd(micros: i64) -> f64 {
    micros_to_usd(micros.max(0))
}

/// The six limit fields every key message spells alike (`key_concurrency_limit`,
/// `key_tpm_limit`, `key_budget_{total,day,week,month}_usd`), in that order.
struct WireLimits {
    concurrency: i32,
    tpm: i64,
    total_usd: f64,
    day_usd: f64,
    week_usd: f64,
    month_usd: f64,
}

impl WireLimits {
    fn of(limits: &KeyLimits) -> Self {
        WireLimits {
            concurrency: limits.concurrency_limit.max(0),
            tpm: limits.tpm_limit.max(0),
            total_usd: budget_usd(limits.budget_total_micros),
            day_usd: budget_usd(limits.budget_day_micros),
            week_usd: budget_usd(limits.budget_week_micros),
            month_usd: budget_usd(limits.budget_month_micros),
        }
    }

    fn read(self, api_key_id: i64) -> Result<KeyLimits, ConvertError> {
        Ok(KeyLimits {
            api_key_id,
            concurrency_limit: concurrency_limit("key_concurrency_limit", self.concurrency)?,
            tpm_limit: tpm_limit("key_tpm_limit", self.tpm)?,
            budget_total_micros: budget_micros("key_budget_total_usd", self.total_usd)?,
            budget_day_micros: budget_micros("key_budget_day_usd", self.day_usd)?,
            budget_week_micros: budget_micros("key_budget_week_usd", self.week_usd)?,
            budget_month_micros: budget_micros("key_budget_month_usd", self.month_usd)?,
        })
    }
}

/// `Authenticate`'s answer for a key that may be used (a refused one is
/// [`key_refusal_status`]).
impl From<&ApiKeyRecord> for spb::AuthenticateResponse {
    fn from(record: &ApiKeyRecord) -> Self {
        let limits = WireLimits::of(&record.limits);
        spb::AuthenticateResponse {
            api_key_id: record.id,
            user: record.user.clone(),
            group: record.group.clone(),
            user_rpm_limit: record.user_rpm_limit,
            expires_at_ms: expiry_to_wire(record.access.expires_at_ms),
            allowed_models: record.access.allowed_models.clone(),
            allowed_endpoints: endpoint_names(&record.access.allowed_endpoints),
            key_concurrency_limit: limits.concurrency,
            key_tpm_limit: limits.tpm,
            key_budget_total_usd: limits.total_usd,
            key_budget_day_usd: limits.day_usd,
            key_budget_week_usd: limits.week_usd,
            key_budget_month_usd: limits.month_usd,
        }
    }
}

/// What a key that `Authenticate` accepted may reach (never disabled: a disabled key is
/// refused). An answer with a list the relay cannot read is an error, never a key without limits;
/// an endpoint a newer selector knows and this relay does not is left out ([`answered_access`]).
pub fn authenticated_access(answer: &spb::AuthenticateResponse) -> Result<KeyAccess, ConvertError> {
    answered_access(
        answer.expires_at_ms,
        false,
        answer.allowed_models.clone(),
        &answer.allowed_endpoints,
    )
}

/// The limits admission counts for a key that `Authenticate` accepted (`api_key_id` from the
/// answer; every limit 0: none). A negative or non-finite limit is an error naming the field,
/// never a key without limits.
pub fn authenticated_limits(answer: &spb::AuthenticateResponse) -> Result<KeyLimits, ConvertError> {
    WireLimits {
        concurrency: answer.key_concurrency_limit,
        tpm: answer.key_tpm_limit,
        total_usd: answer.key_budget_total_usd,
        day_usd: answer.key_budget_day_usd,
        week_usd: answer.key_budget_week_usd,
        month_usd: answer.key_budget_month_usd,
    }
    .read(answer.api_key_id)
}

/// A key as its holder sees it, on the wire.
impl From<&KeyDescription> for spb::DescribeKeyResponse {
    fn from(description: &KeyDescription) -> Self {
        let record = &description.record;
        let limits = WireLimits::of(&record.limits);
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
            usage: usage_to_wire(&description.usage),
            key_prefix: record.prefix.clone(),
            key_concurrency_limit: limits.concurrency,
            key_tpm_limit: limits.tpm,
            key_budget_total_usd: limits.total_usd,
            key_budget_day_usd: limits.day_usd,
            key_budget_week_usd: limits.week_usd,
            key_budget_month_usd: limits.month_usd,
            month_models: model_usage_to_wire(&description.models),
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

/// A key's usage per model and price source on the wire (`DescribeKeyResponse.month_models`,
/// `ReadUsageResponse.models`).
pub fn model_usage_to_wire(models: &[ModelPeriodUsage]) -> Vec<spb::ModelUsage> {
    models
        .iter()
        .map(|model| spb::ModelUsage {
            model: model.model.clone(),
            price_source: model
                .price_source
                .map(|source| spb::PriceSource::from(source) as i32)
                .unwrap_or_default(),
            requests: model.usage.requests.max(0) as u64,
            input_tokens: model.usage.input_tokens.max(0) as u64,
            output_tokens: model.usage.output_tokens.max(0) as u64,
            cost_usd: model.usage.cost_usd,
        })
        .collect()
}

/// A key's usage per model from the wire, as its holder reads it: a price source unset or newer
/// than this build is not said (`None`, shown as `unknown`, never a guess); a cost that is not
/// finite is an error naming the field.
pub fn model_usage_from_wire(
    models: Vec<spb::ModelUsage>,
) -> Result<Vec<ModelPeriodUsage>, ConvertError> {
    models
        .into_iter()
        .map(|model| {
            if !model.cost_usd.is_finite() {
                return Err(ConvertError::new("month_models.cost_usd", "must be finite"));
            }
            let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            Ok(ModelPeriodUsage {
                model: model.model,
                price_source: super::usage_price_source(model.price_source),
                usage: PeriodUsage {
                    requests: count(model.requests),
                    input_tokens: count(model.input_tokens),
                    output_tokens: count(model.output_tokens),
                    cost_usd: model.cost_usd,
                },
            })
        })
        .collect()
}

/// A key's usage per period (`KeyDescription::usage`) on the wire.
pub fn usage_to_wire(usage: &[(UsagePeriod, i64, PeriodUsage)]) -> Vec<spb::KeyPeriodUsage> {
    usage
        .iter()
        .map(|(period, from_ms, usage)| spb::KeyPeriodUsage {
            period: period.as_str().to_owned(),
            from_ms: *from_ms,
            requests: usage.requests,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cost_usd: usage.cost_usd,
        })
        .collect()
}

/// A key's usage per period from the wire, read strictly: an unknown period or a cost that is
/// not finite is an error naming the field.
pub fn usage_from_wire(
    usage: Vec<spb::KeyPeriodUsage>,
) -> Result<Vec<(UsagePeriod, i64, PeriodUsage)>, ConvertError> {
    usage
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
        .collect()
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
        let access = answered_access(
            answer.expires_at_ms,
            answer.disabled,
            answer.allowed_models,
            &answer.allowed_endpoints,
        )?;
        let limits = WireLimits {
            concurrency: answer.key_concurrency_limit,
            tpm: answer.key_tpm_limit,
            total_usd: answer.key_budget_total_usd,
            day_usd: answer.key_budget_day_usd,
            week_usd: answer.key_budget_week_usd,
            month_usd: answer.key_budget_month_usd,
        }
        .read(answer.api_key_id)?;
        let usage = usage_from_wire(answer.usage)?;
        let models = model_usage_from_wire(answer.month_models)?;
        Ok(KeyDescription {
            record: ApiKeyRecord {
                id: answer.api_key_id,
                name: answer.name,
                prefix: answer.key_prefix,
                user: answer.user,
                group: answer.group,
                user_rpm_limit: answer.user_rpm_limit,
                limits,
                active: true,
                access,
            },
            usage,
            models,
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

/// A key as the operator's list shows it with its usage per period (`Selector::key_usage`).
pub fn api_key_view(
    record: &ApiKeyRecord,
    usage: &[(UsagePeriod, i64, PeriodUsage)],
) -> spb::ApiKeyView {
    spb::ApiKeyView {
        usage: usage_to_wire(usage),
        ..spb::ApiKeyView::from(record)
    }
}

/// A key as the operator's list shows it (its hash never), without its usage.
impl From<&ApiKeyRecord> for spb::ApiKeyView {
    fn from(record: &ApiKeyRecord) -> Self {
        let limits = WireLimits::of(&record.limits);
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
            key_concurrency_limit: limits.concurrency,
            key_tpm_limit: limits.tpm,
            key_budget_total_usd: limits.total_usd,
            key_budget_day_usd: limits.day_usd,
            key_budget_week_usd: limits.week_usd,
            key_budget_month_usd: limits.month_usd,
            usage: Vec::new(),
        }
    }
}

/// A key of the operator's list read strictly (the CLI shows it): a status other than
/// `active`, `disabled` or `revoked`, or a list it cannot read, is an error. Its usage is
/// [`usage_from_wire`]'s.
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
            limits: WireLimits {
                concurrency: view.key_concurrency_limit,
                tpm: view.key_tpm_limit,
                total_usd: view.key_budget_total_usd,
                day_usd: view.key_budget_day_usd,
                week_usd: view.key_budget_week_usd,
                month_usd: view.key_budget_month_usd,
            }
            .read(view.id)?,
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
    Ok(KeyAccess {
        expires_at_ms: expiry("expires_at_ms", request.expires_at_ms.unwrap_or(0))?,
        disabled: false,
        allowed_models: new_model_patterns("allowed_models", request.allowed_models.clone())?,
        allowed_endpoints: endpoints("allowed_endpoints", &request.allowed_endpoints)?,
    })
}

/// The limits a `CreateApiKey` request gives its new key (`api_key_id` 0: not yet known).
pub fn new_key_limits(request: &spb::CreateApiKeyRequest) -> Result<KeyLimits, ConvertError> {
    WireLimits {
        concurrency: request.key_concurrency_limit,
        tpm: request.key_tpm_limit,
        total_usd: request.key_budget_total_usd,
        day_usd: request.key_budget_day_usd,
        week_usd: request.key_budget_week_usd,
        month_usd: request.key_budget_month_usd,
    }
    .read(0)
}

/// The `CreateApiKeyRequest` limit fields of `limits` (the operator CLI's).
pub fn set_new_key_limits(request: &mut spb::CreateApiKeyRequest, limits: &KeyLimits) {
    let wire = WireLimits::of(limits);
    request.key_concurrency_limit = wire.concurrency;
    request.key_tpm_limit = wire.tpm;
    request.key_budget_total_usd = wire.total_usd;
    request.key_budget_day_usd = wire.day_usd;
    request.key_budget_week_usd = wire.week_usd;
    request.key_budget_month_usd = wire.month_usd;
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
                .then(|| new_model_patterns("allowed_models", request.allowed_models))
                .transpose()?,
            allowed_endpoints: endpoint_list
                .then(|| endpoints("allowed_endpoints", &request.allowed_endpoints))
                .transpose()?,
            concurrency_limit: request
                .key_concurrency_limit
                .map(|limit| concurrency_limit("key_concurrency_limit", limit))
                .transpose()?,
            tpm_limit: request
                .key_tpm_limit
                .map(|limit| tpm_limit("key_tpm_limit", limit))
                .transpose()?,
            budget_total_micros: request
                .key_budget_total_usd
                .map(|usd| budget_micros("key_budget_total_usd", usd))
                .transpose()?,
            budget_day_micros: request
                .key_budget_day_usd
                .map(|usd| budget_micros("key_budget_day_usd", usd))
                .transpose()?,
            budget_week_micros: request
                .key_budget_week_usd
                .map(|usd| budget_micros("key_budget_week_usd", usd))
                .transpose()?,
            budget_month_micros: request
                .key_budget_month_usd
                .map(|usd| budget_micros("key_budget_month_usd", usd))
                .transpose()?,
        };
        if update.is_empty() {
            return Err(ConvertError::new(
                "id",
                "the update changes nothing: give disabled, expires_at_ms, a replace_* list or a \
                 key_* limit",
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
            key_concurrency_limit: update.concurrency_limit,
            key_tpm_limit: update.tpm_limit,
            key_budget_total_usd: update.budget_total_micros.map(budget_usd),
            key_budget_day_usd: update.budget_day_micros.map(budget_usd),
            key_budget_week_usd: update.budget_week_micros.map(budget_usd),
            key_budget_month_usd: update.budget_month_micros.map(budget_usd),
        }
    }
}
