//! A relay's view of the pool (`WatchView`): the config of the groups it serves and the accounts'
//! states, both ways. Read strictly, as a plan is: a field the relay cannot read is an error (the
//! relay keeps its last view), except an account of a platform or credential kind newer than
//! this build, which is left out (this build could not call it), as a plan leaves it out.

use std::collections::HashMap;

use poolgate_core::account::{
    Account, AccountIdentity, AccountStatus, ApiKeyRecord, GroupSettings, Platform, Secret,
};
use poolgate_core::health::{AccountHealth, Breaker};
use poolgate_core::price::UnpricedPolicy;
use poolgate_core::view::{AccountState, Deployment, ViewConfig, ViewUpdate};
use poolgate_core::windows::Thresholds;

use super::{ConvertError, EnumField, credential_kind};
use crate::selector::v1 as spb;

impl From<&ViewUpdate> for spb::ViewUpdate {
    fn from(update: &ViewUpdate) -> Self {
        spb::ViewUpdate {
            config: update.config.as_ref().map(spb::ViewConfig::from),
            states: update
                .states
                .iter()
                .map(spb::ViewAccountState::from)
                .collect(),
            period_ms: update.period_ms,
        }
    }
}

impl TryFrom<spb::ViewUpdate> for ViewUpdate {
    type Error = ConvertError;

    fn try_from(update: spb::ViewUpdate) -> Result<Self, ConvertError> {
        if update.period_ms == 0 {
            return Err(ConvertError::new("period_ms", "must be positive"));
        }
        Ok(ViewUpdate {
            config: update
                .config
                .map(ViewConfig::try_from)
                .transpose()
                .map_err(|error| error.within("config"))?,
            states: update
                .states
                .into_iter()
                .map(AccountState::try_from)
                .collect::<Result<_, _>>()
                .map_err(|error| error.within("states"))?,
            period_ms: update.period_ms,
        })
    }
}

impl From<&ViewConfig> for spb::ViewConfig {
    fn from(config: &ViewConfig) -> Self {
        spb::ViewConfig {
            groups: config.groups.clone(),
            accounts: config
                .accounts
                .iter()
                .map(|account| spb::ViewAccount {
                    account: Some(spb::AccountView::from(account)),
                    credential: account.credential.expose().to_owned(),
                })
                .collect(),
            keys: config
                .keys
                .iter()
                .map(|(hash, record)| spb::ViewKey {
                    hash: hash.clone(),
                    key: Some(spb::ApiKeyView::from(record)),
                })
                .collect(),
            prices: config
                .prices
                .iter()
                .map(|(model, price)| (model.clone(), spb::Price::from(*price)))
                .collect(),
            settings: config
                .settings
                .iter()
                .map(|(group, settings)| spb::ViewGroupSettings {
                    group: group.clone(),
                    usage_headers_to_clients: settings.usage_headers_to_clients,
                    window_shed_at: settings.window_shed_at,
                    window_move_at: settings.window_move_at,
                    subscriptions_cli_only: settings.subscriptions_cli_only,
                    rerank_passthrough: settings.rerank_passthrough,
                })
                .collect(),
            deployment: Some(spb::ViewDeployment {
                refuse_unpriced: config.deployment.unpriced == UnpricedPolicy::Refuse,
                window_shed_at: config.deployment.windows.shed,
                window_move_at: config.deployment.windows.move_sessions,
                plan_size: config.deployment.plan_size,
            }),
        }
    }
}

impl TryFrom<spb::ViewConfig> for ViewConfig {
    type Error = ConvertError;

    fn try_from(config: spb::ViewConfig) -> Result<Self, ConvertError> {
        let mut accounts = Vec::with_capacity(config.accounts.len());
        for account in config.accounts {
            let view = account
                .account
                .ok_or_else(|| ConvertError::new("accounts.account", "must be set"))?;
            if super::newer_value::<spb::Platform>(view.platform)
                || super::newer_value::<spb::CredentialKind>(view.kind)
            {
                continue;
            }
            // Only services newer than this build: it serves nothing this build can send it.
            let Some(serves) = super::serves_from_wire(&view.serves) else {
                continue;
            };
            let mut account =
                view_account(view, account.credential).map_err(|error| error.within("accounts"))?;
            account.serves = serves;
            accounts.push(account);
        }
        let mut keys = Vec::with_capacity(config.keys.len());
        for key in config.keys {
            if key.hash.len() != 32 {
                return Err(ConvertError::new("keys.hash", "must be 32 bytes (SHA-256)"));
            }
            let view = key
                .key
                .ok_or_else(|| ConvertError::new("keys.key", "must be set"))?;
            let record = ApiKeyRecord::try_from(view).map_err(|error| error.within("keys.key"))?;
            keys.push((key.hash, record));
        }
        let settings: HashMap<String, GroupSettings> = config
            .settings
            .into_iter()
            .map(|settings| {
                (
                    settings.group,
                    GroupSettings {
                        usage_headers_to_clients: settings.usage_headers_to_clients,
                        window_shed_at: settings.window_shed_at,
                        window_move_at: settings.window_move_at,
                        subscriptions_cli_only: settings.subscriptions_cli_only,
                        rerank_passthrough: settings.rerank_passthrough,
                    },
                )
            })
            .collect();
        let deployment = config
            .deployment
            .ok_or_else(|| ConvertError::new("deployment", "must be set"))?;
        let share = |field: &'static str, value: f64| {
            if (0.0..=1.0).contains(&value) {
                Ok(value)
            } else {
                Err(ConvertError::new(field, "must be within 0..=1"))
            }
        };
        let windows = Thresholds {
            shed: share("deployment.window_shed_at", deployment.window_shed_at)?,
            move_sessions: share("deployment.window_move_at", deployment.window_move_at)?,
        };
        if deployment.plan_size == 0 {
            return Err(ConvertError::new(
                "deployment.plan_size",
                "must be positive",
            ));
        }
        Ok(ViewConfig {
            deployment: Deployment {
                unpriced: if deployment.refuse_unpriced {
                    UnpricedPolicy::Refuse
                } else {
                    UnpricedPolicy::Fallback
                },
                windows,
                plan_size: deployment.plan_size,
            },
            groups: config.groups,
            accounts,
            keys,
            prices: config
                .prices
                .into_iter()
                .map(|(model, price)| (model, price.into()))
                .collect(),
            settings,
        })
    }
}

/// An account of the view: its operator's view and its access credential.
fn view_account(view: spb::AccountView, credential: String) -> Result<Account, ConvertError> {
    #[allow(deprecated)]
    let credential_kind = credential_kind(view.kind, &view.credential_kind)?;
    let status = AccountStatus::parse(&view.status).ok_or_else(|| {
        ConvertError::new(
            "account.status",
            format!("unknown account status {:?}", view.status),
        )
    })?;
    Ok(Account {
        serves: Vec::new(),
        id: view.id,
        name: view.name,
        group: view.group,
        platform: Platform::decode("account.platform", view.platform)?,
        base_url: view.base_url,
        credential_kind,
        credential: Secret::new(credential),
        oauth: None,
        status,
        status_reason: view.status_reason,
        priority: view.priority,
        weight: view.weight,
        concurrency_limit: view.concurrency_limit,
        rpm_limit: view.rpm_limit,
        session_window_limit_usd: view.session_window_limit_usd,
        allowed_models: view.allowed_models,
        model_mapping: view.model_mapping.into_iter().collect(),
        proxy_url: (!view.proxy_url.is_empty()).then_some(view.proxy_url),
        probe_model: (!view.probe_model.is_empty()).then_some(view.probe_model),
        stream_usage: !view.disable_stream_usage,
        identity: AccountIdentity {
            upstream_id: view.upstream_id,
            email: view.email,
            plan: view.plan,
        },
    })
}

impl From<&AccountState> for spb::ViewAccountState {
    fn from(state: &AccountState) -> Self {
        let windows = state.windows.iter().map(spb::WindowReading::from).collect();
        let Some(health) = state.health else {
            return spb::ViewAccountState {
                account_id: state.account_id,
                unknown: true,
                inflight: -1,
                windows,
                ..spb::ViewAccountState::default()
            };
        };
        let (breaker, breaker_open_ms) = match health.breaker {
            Breaker::Closed => (spb::BreakerState::Closed, 0),
            Breaker::Open(ms) => (spb::BreakerState::Open, ms),
            Breaker::HalfOpen => (spb::BreakerState::HalfOpen, 0),
        };
        spb::ViewAccountState {
            account_id: state.account_id,
            unknown: false,
            inflight: health
                .inflight
                .map_or(-1, |n| i32::try_from(n).unwrap_or(i32::MAX)),
            hard_block_ms: health.hard_block_ms,
            soft_block_ms: health.soft_block_ms,
            breaker: breaker as i32,
            breaker_open_ms,
            failures: health.failures,
            confirming: state.confirming,
            windows,
        }
    }
}

impl TryFrom<spb::ViewAccountState> for AccountState {
    type Error = ConvertError;

    fn try_from(state: spb::ViewAccountState) -> Result<Self, ConvertError> {
        if state.account_id <= 0 {
            return Err(ConvertError::new("account_id", "must be positive"));
        }
        let windows = state
            .windows
            .into_iter()
            .map(poolgate_core::windows::WindowReading::try_from)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| error.within("windows"))?;
        let health = if state.unknown {
            None
        } else {
            let breaker = match spb::BreakerState::try_from(state.breaker) {
                Ok(spb::BreakerState::Closed) => Breaker::Closed,
                Ok(spb::BreakerState::Open) => Breaker::Open(state.breaker_open_ms),
                Ok(spb::BreakerState::HalfOpen) => Breaker::HalfOpen,
                _ => {
                    return Err(ConvertError::new(
                        "breaker",
                        format!("must be closed, open or half-open, got {}", state.breaker),
                    ));
                }
            };
            Some(AccountHealth {
                inflight: u32::try_from(state.inflight).ok(),
                hard_block_ms: state.hard_block_ms,
                soft_block_ms: state.soft_block_ms,
                breaker,
                failures: state.failures,
            })
        };
        Ok(AccountState {
            account_id: state.account_id,
            health,
            confirming: state.confirming,
            windows,
        })
    }
}
