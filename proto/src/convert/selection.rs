//! Selection's messages: plans, outcome report answers, usage records, usage-window readings,
//! account views, prices.

use poolgate_core::AccountId;
use poolgate_core::account::{
    Account, AccountIdentity, CredentialKind, ImportedSettings, Platform, Price, Secret, SignIn,
};
use poolgate_core::outcome::{MAX_REASON_BYTES, Outcome, OutcomeClass, bounded_reason};
use poolgate_core::plan::{Effect, Plan, PlanRequest, PlannedAccount, UsageRecord};
use poolgate_core::price::{ListedPrice, PriceSource};
use poolgate_core::select::NoneReason;
use poolgate_core::windows::{MinuteLimit, Scope, WindowKind, WindowReading, WindowStatus};

use super::{ConvertError, EnumField, credential_kind, effect, none_reason};
use crate::selector::v1 as spb;

/// A relay's `Select` for `request`, its session named as the selector binds it (`binding`,
/// the engine's scoped name); the relay reads `NONE_REASON_CONFIRMING`.
pub fn select_request(request: &PlanRequest, binding: Option<String>) -> spb::SelectRequest {
    spb::SelectRequest {
        group: request.group.clone(),
        platform: spb::Platform::from(request.platform) as i32,
        model: request.model.clone(),
        session_hash: binding.unwrap_or_default(),
        previous_response_id: request.previous_response_id.clone().unwrap_or_default(),
        exclude_account_ids: request.exclude.clone(),
        max_accounts: 0,
        api_key_id: request.api_key_id,
        reads_confirming: true,
        service: spb::Service::from(request.service) as i32,
    }
}

impl From<&Outcome> for spb::ReportOutcomeRequest {
    fn from(outcome: &Outcome) -> Self {
        spb::ReportOutcomeRequest {
            account_id: outcome.account_id,
            class: spb::OutcomeClass::from(outcome.class) as i32,
            status: u32::from(outcome.status),
            reset_at_ms: outcome.reset_at_ms.map_or(0, |ms| ms.max(0) as u64),
            reason: bounded_reason(&outcome.reason).to_owned(),
            after_refresh: false,
            refused_credential_fingerprint: outcome.refused_fingerprint.clone().unwrap_or_default(),
            before_send: outcome.before_send,
        }
    }
}

/// An outcome report read strictly, each field named when it is refused: a positive account
/// id, a known class, an HTTP status (0: no answer), a reason of at most
/// [`MAX_REASON_BYTES`], the refused credential's fingerprint as 32 hex digits. `before_send`
/// holds only without an answer.
pub fn read_outcome(request: spb::ReportOutcomeRequest) -> Result<Outcome, ConvertError> {
    if request.account_id <= 0 {
        return Err(ConvertError::new(
            "account_id",
            format!("must be a positive account id, got {}", request.account_id),
        ));
    }
    let class = OutcomeClass::decode("class", request.class)?;
    let status = u16::try_from(request.status)
        .ok()
        .filter(|status| *status <= 999)
        .ok_or_else(|| {
            ConvertError::new("status", "must be an HTTP status (0 for a network error)")
        })?;
    if request.reason.len() > MAX_REASON_BYTES {
        return Err(ConvertError::new(
            "reason",
            format!("must be at most {MAX_REASON_BYTES} bytes"),
        ));
    }
    let reset_at_ms = match request.reset_at_ms {
        0 => None,
        ms => {
            Some(i64::try_from(ms).map_err(|_| ConvertError::new("reset_at_ms", "out of range"))?)
        }
    };
    let refused_fingerprint = match request.refused_credential_fingerprint.as_str() {
        "" => None,
        fingerprint
            if fingerprint.len() == 32 && fingerprint.bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            Some(fingerprint.to_ascii_lowercase())
        }
        _ => {
            return Err(ConvertError::new(
                "refused_credential_fingerprint",
                "must be 32 hex digits (the first 16 bytes of the credential's SHA-256)",
            ));
        }
    };
    Ok(Outcome {
        reset_at_ms,
        reason: request.reason,
        refused_fingerprint,
        before_send: request.before_send && status == 0,
        ..Outcome::new(request.account_id, class, status)
    })
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
            // No price known: unset, which older relays read as 0, as they always did.
            price: (account.price.source != PriceSource::None).then(|| account.price.price.into()),
            // "None" is said only of a refusal; a price nobody stated stays unsaid, as from an
            // older selector.
            price_source: if account.price.source == PriceSource::None
                && !account.price.refuse_budgeted
            {
                0
            } else {
                spb::PriceSource::from(account.price.source) as i32
            },
            price_fallback_from: account.price.fallback_from.clone(),
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
            subscriptions_cli_only: plan.subscriptions_cli_only,
            rerank_passthrough: plan.rerank_passthrough,
        }
    }
}

/// The answer to a select: the plan, said so that the asking relay can read it. A relay that
/// did not set `reads_confirming` (older than `NONE_REASON_CONFIRMING`, whose decoding refuses
/// an enum value it does not know as an unreadable plan) is told `all_blocked` instead, with the
/// same short retry hint, which it waits for and then plans again: what the reason asks.
pub fn select_response(plan: &Plan, reads_confirming: bool) -> spb::SelectResponse {
    if reads_confirming || plan.none_reason != Some(NoneReason::Confirming) {
        return spb::SelectResponse::from(plan);
    }
    let older = Plan {
        none_reason: Some(NoneReason::AllBlocked),
        ..plan.clone()
    };
    spb::SelectResponse::from(&older)
}

/// A plan read strictly: an account whose credential kind or platform the reader cannot read
/// fails the whole answer (a credential is never sent the wrong way on a guess). The declared
/// fallback: an account whose platform or credential kind is a value newer than this build (a
/// platform or sign-in a later release added) is left out of the plan, and the rest is served;
/// a plan left empty by it reads as all excluded (a retryable 503).
#[allow(deprecated)]
impl TryFrom<spb::SelectResponse> for Plan {
    type Error = ConvertError;

    fn try_from(answer: spb::SelectResponse) -> Result<Self, ConvertError> {
        let usage_headers_to_clients = answer.usage_headers_to_clients;
        let planned = answer.accounts.len();
        let accounts = answer
            .accounts
            .into_iter()
            .filter(|account| {
                !(super::newer_value::<spb::Platform>(account.platform)
                    || super::newer_value::<spb::CredentialKind>(account.kind))
            })
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
                    price: super::model_price(
                        account.price,
                        account.price_source,
                        account.price_fallback_from,
                    ),
                    soft_blocked: account.soft_blocked,
                    inflight: u32::try_from(account.inflight).ok(),
                    usage_headers_to_clients,
                })
            })
            .collect::<Result<Vec<_>, ConvertError>>()?;
        let mut none_reason = none_reason(answer.reason, &answer.none_reason)?;
        if accounts.is_empty() && planned > 0 && none_reason.is_none() {
            none_reason = Some(NoneReason::AllExcluded);
        }
        Ok(Plan {
            accounts,
            sticky: answer.sticky,
            none_reason,
            retry_after_ms: answer.retry_after_ms,
            previous_response_other_key: answer.previous_response_other_key,
            subscriptions_cli_only: answer.subscriptions_cli_only,
            rerank_passthrough: answer.rerank_passthrough,
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
            price_source: r
                .price_source
                .map(|source| spb::PriceSource::from(source) as i32)
                .unwrap_or_default(),
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
            price_source: super::usage_price_source(r.price_source),
        })
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
            upstream_id: account.identity.upstream_id.clone(),
            email: account.identity.email.clone(),
            plan: account.identity.plan.clone(),
            token_expires_at_ms: account
                .oauth
                .as_ref()
                .map_or(0, |oauth| oauth.expires_at_ms.max(0) as u64),
            refreshable: account
                .oauth
                .as_ref()
                .is_some_and(|oauth| !oauth.refresh_token.is_empty()),
            serves: super::serves_to_wire(&account.serves),
        }
    }
}

impl From<&ListedPrice> for spb::PriceView {
    fn from(listed: &ListedPrice) -> Self {
        spb::PriceView {
            model: listed.model.clone(),
            price: listed.price.map(spb::Price::from),
            source: spb::PriceSource::from(listed.source) as i32,
            catalogue_price: listed.catalogue.map(spb::Price::from),
        }
    }
}

/// A listed price read strictly (the operator CLI's reading: a source it does not know is an
/// error naming the field, never a guess).
impl TryFrom<spb::PriceView> for ListedPrice {
    type Error = ConvertError;

    fn try_from(view: spb::PriceView) -> Result<Self, ConvertError> {
        let source = PriceSource::decode("source", view.source)?;
        let price = view.price.map(Price::from);
        if price.is_none() != (source == PriceSource::None) {
            return Err(ConvertError::new(
                "price",
                "is set exactly when the source is not none",
            ));
        }
        Ok(ListedPrice {
            model: view.model,
            price,
            source,
            catalogue: view.catalogue_price.map(Price::from),
        })
    }
}

impl From<Price> for spb::Price {
    fn from(price: Price) -> Self {
        spb::Price {
            per_search_unit: price.per_search_unit,
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
            per_search_unit: price.per_search_unit,
            input_per_mtok: price.input_per_mtok,
            output_per_mtok: price.output_per_mtok,
            cache_write_per_mtok: price.cache_write_per_mtok,
            cache_read_per_mtok: price.cache_read_per_mtok,
        }
    }
}

enum_pair!("minute_limit", spb::MinuteLimit <=> MinuteLimit {
    Requests <=> Requests,
    Tokens <=> Tokens,
    InputTokens <=> InputTokens,
    OutputTokens <=> OutputTokens,
});

enum_pair!("status", spb::WindowStatus <=> WindowStatus {
    Unknown <=> Unknown,
    Allowed <=> Allowed,
    AllowedWarning <=> AllowedWarning,
    Rejected <=> Rejected,
});

/// Most accounts one `RecordWindows` call carries.
pub const MAX_WINDOW_ACCOUNTS: usize = 1000;
/// Most readings per account in one call.
pub const MAX_WINDOW_READINGS: usize = 64;
/// Longest model scope token, in bytes.
const MAX_SCOPE_BYTES: usize = 64;

impl From<&WindowReading> for spb::WindowReading {
    fn from(reading: &WindowReading) -> Self {
        let (kind, minute_limit) = match reading.kind {
            WindowKind::FiveHour => (spb::WindowKind::FiveHour, spb::MinuteLimit::Unspecified),
            WindowKind::SevenDay => (spb::WindowKind::SevenDay, spb::MinuteLimit::Unspecified),
            WindowKind::SevenDayOverageIncluded => (
                spb::WindowKind::SevenDayOverageIncluded,
                spb::MinuteLimit::Unspecified,
            ),
            WindowKind::SevenDayModel => (
                spb::WindowKind::SevenDayModel,
                spb::MinuteLimit::Unspecified,
            ),
            WindowKind::Overage => (spb::WindowKind::Overage, spb::MinuteLimit::Unspecified),
            WindowKind::CodexPrimary => {
                (spb::WindowKind::CodexPrimary, spb::MinuteLimit::Unspecified)
            }
            WindowKind::CodexSecondary => (
                spb::WindowKind::CodexSecondary,
                spb::MinuteLimit::Unspecified,
            ),
            WindowKind::PerMinute(limit) => {
                (spb::WindowKind::PerMinute, spb::MinuteLimit::from(limit))
            }
        };
        spb::WindowReading {
            kind: kind as i32,
            minute_limit: minute_limit as i32,
            scope_models: match &reading.scope {
                Scope::Account => String::new(),
                Scope::Models(token) => token.clone(),
            },
            utilization: reading.utilization,
            reset_at_ms: reading.reset_at_ms,
            length_ms: reading.length_ms,
            status: spb::WindowStatus::from(reading.status) as i32,
            observed_at_ms: reading.observed_at_ms,
        }
    }
}

/// A reading read strictly: the kind (with its minute limit for a per-minute window, and only
/// then), the status, a finite utilization in 0..=1, a positive length.
impl TryFrom<spb::WindowReading> for WindowReading {
    type Error = ConvertError;

    fn try_from(reading: spb::WindowReading) -> Result<Self, ConvertError> {
        let kind = spb::WindowKind::try_from(reading.kind).map_err(|_| {
            ConvertError::new("kind", format!("unknown WindowKind value {}", reading.kind))
        })?;
        let plain = |kind: WindowKind| {
            if reading.minute_limit == spb::MinuteLimit::Unspecified as i32 {
                Ok(kind)
            } else {
                Err(ConvertError::new(
                    "minute_limit",
                    "is only for WINDOW_KIND_PER_MINUTE",
                ))
            }
        };
        let kind = match kind {
            spb::WindowKind::Unspecified => {
                return Err(ConvertError::new(
                    "kind",
                    "must be set, got WINDOW_KIND_UNSPECIFIED",
                ));
            }
            spb::WindowKind::FiveHour => plain(WindowKind::FiveHour)?,
            spb::WindowKind::SevenDay => plain(WindowKind::SevenDay)?,
            spb::WindowKind::SevenDayOverageIncluded => plain(WindowKind::SevenDayOverageIncluded)?,
            spb::WindowKind::SevenDayModel => plain(WindowKind::SevenDayModel)?,
            spb::WindowKind::Overage => plain(WindowKind::Overage)?,
            spb::WindowKind::CodexPrimary => plain(WindowKind::CodexPrimary)?,
            spb::WindowKind::CodexSecondary => plain(WindowKind::CodexSecondary)?,
            spb::WindowKind::PerMinute => {
                WindowKind::PerMinute(MinuteLimit::decode("minute_limit", reading.minute_limit)?)
            }
        };
        if reading.scope_models.len() > MAX_SCOPE_BYTES {
            return Err(ConvertError::new(
                "scope_models",
                format!("must be at most {MAX_SCOPE_BYTES} bytes"),
            ));
        }
        let scope = if reading.scope_models.is_empty() {
            Scope::Account
        } else {
            Scope::Models(reading.scope_models)
        };
        if let Some(used) = reading.utilization
            && !(used.is_finite() && (0.0..=1.0).contains(&used))
        {
            return Err(ConvertError::new(
                "utilization",
                format!("must be a finite share in [0, 1], got {used}"),
            ));
        }
        if let Some(length) = reading.length_ms
            && length <= 0
        {
            return Err(ConvertError::new(
                "length_ms",
                format!("must be positive when set, got {length}"),
            ));
        }
        Ok(WindowReading {
            kind,
            scope,
            utilization: reading.utilization,
            reset_at_ms: reading.reset_at_ms,
            length_ms: reading.length_ms,
            status: WindowStatus::decode("status", reading.status)?,
            observed_at_ms: reading.observed_at_ms,
        })
    }
}

/// A `RecordWindows` request for these accounts' readings (the caller keeps within
/// [`MAX_WINDOW_ACCOUNTS`] and [`MAX_WINDOW_READINGS`]).
pub fn windows_request(
    accounts: impl IntoIterator<Item = (AccountId, Vec<WindowReading>)>,
) -> spb::RecordWindowsRequest {
    spb::RecordWindowsRequest {
        accounts: accounts
            .into_iter()
            .map(|(account_id, readings)| spb::AccountWindows {
                account_id,
                readings: readings.iter().map(spb::WindowReading::from).collect(),
            })
            .collect(),
    }
}

/// A `RecordWindows` request read strictly: at most [`MAX_WINDOW_ACCOUNTS`] accounts, each with
/// a positive id and at most [`MAX_WINDOW_READINGS`] readings, every reading readable. The
/// error names the field with its path (`accounts.readings.utilization`).
pub fn read_windows_request(
    request: spb::RecordWindowsRequest,
) -> Result<Vec<(AccountId, Vec<WindowReading>)>, ConvertError> {
    if request.accounts.len() > MAX_WINDOW_ACCOUNTS {
        return Err(ConvertError::new(
            "accounts",
            format!("at most {MAX_WINDOW_ACCOUNTS} accounts per call"),
        ));
    }
    request
        .accounts
        .into_iter()
        .map(|account| {
            let account_id = super::account_id("account_id", account.account_id)
                .map_err(|error| error.within("accounts"))?;
            if account.readings.len() > MAX_WINDOW_READINGS {
                return Err(ConvertError::new(
                    "accounts.readings",
                    format!("at most {MAX_WINDOW_READINGS} readings per account"),
                ));
            }
            // The declared fallback: a reading of a kind, limit or status newer than this build
            // is dropped (readings are advisory and read again), not the whole call.
            let readings = account
                .readings
                .into_iter()
                .filter(|reading| {
                    !(super::newer_value::<spb::WindowKind>(reading.kind)
                        || super::newer_value::<spb::MinuteLimit>(reading.minute_limit)
                        || super::newer_value::<spb::WindowStatus>(reading.status))
                })
                .map(|reading| {
                    WindowReading::try_from(reading)
                        .map_err(|error| error.within("accounts.readings"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((account_id, readings))
        })
        .collect()
}

impl From<&SignIn> for spb::SignInAccountRequest {
    fn from(sign_in: &SignIn) -> Self {
        let settings = &sign_in.settings;
        spb::SignInAccountRequest {
            platform: spb::Platform::from(sign_in.platform) as i32,
            kind: spb::CredentialKind::from(sign_in.kind) as i32,
            access_token: sign_in.access_token.expose().to_owned(),
            refresh_token: sign_in.refresh_token.expose().to_owned(),
            expires_at_ms: sign_in.expires_at_ms.max(0) as u64,
            token_url: sign_in.token_url.clone(),
            oauth_client_id: sign_in.client_id.clone(),
            upstream_id: sign_in.identity.upstream_id.clone(),
            email: sign_in.identity.email.clone(),
            plan: sign_in.identity.plan.clone(),
            account_id: sign_in.account_id.unwrap_or(0),
            name: sign_in.name.clone().unwrap_or_default(),
            group: sign_in.group.clone().unwrap_or_default(),
            base_url: sign_in.base_url.clone().unwrap_or_default(),
            priority: settings.priority,
            concurrency_limit: settings.concurrency_limit,
            rpm_limit: settings.rpm_limit,
            proxy_url: settings.proxy_url.clone(),
            set_model_mapping: settings.model_mapping.is_some(),
            model_mapping: settings
                .model_mapping
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
        }
    }
}

impl TryFrom<spb::SignInAccountRequest> for SignIn {
    type Error = ConvertError;

    /// A sign-in as the selector reads it; a field it cannot store is named
    /// ([`SignIn::problem`]).
    fn try_from(request: spb::SignInAccountRequest) -> Result<Self, ConvertError> {
        let text = |value: String| Some(value).filter(|v| !v.is_empty());
        let sign_in = SignIn {
            platform: Platform::decode("platform", request.platform)?,
            kind: CredentialKind::decode("kind", request.kind)?,
            access_token: Secret::new(request.access_token),
            refresh_token: Secret::new(request.refresh_token),
            expires_at_ms: i64::try_from(request.expires_at_ms)
                .map_err(|_| ConvertError::new("expires_at_ms", "out of range"))?,
            token_url: request.token_url,
            client_id: request.oauth_client_id,
            identity: AccountIdentity {
                upstream_id: request.upstream_id,
                email: request.email,
                plan: request.plan,
            },
            account_id: match request.account_id {
                0 => None,
                id if id > 0 => Some(id),
                _ => return Err(ConvertError::new("account_id", "must not be negative")),
            },
            name: text(request.name),
            group: text(request.group),
            base_url: text(request.base_url),
            settings: ImportedSettings {
                priority: request.priority,
                concurrency_limit: request.concurrency_limit,
                rpm_limit: request.rpm_limit,
                proxy_url: request.proxy_url,
                model_mapping: request
                    .set_model_mapping
                    .then(|| request.model_mapping.into_iter().collect()),
            },
        };
        if let Some((field, problem)) = sign_in.problem() {
            return Err(ConvertError::new(field, problem));
        }
        Ok(sign_in)
    }
}
