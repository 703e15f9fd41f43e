//! Selection's messages: plans, outcome report answers, usage records, account views, prices.

use poolgate_core::account::{Account, Platform, Price, Secret};
use poolgate_core::plan::{Effect, Plan, PlannedAccount, UsageRecord};

use super::{ConvertError, EnumField, credential_kind, effect, none_reason};
use crate::selector::v1 as spb;

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
