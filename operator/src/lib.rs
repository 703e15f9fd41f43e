//! poolgate-operator: one operator CLI for both modes. The read and repair verbs (`accounts`,
//! `blocks`, `windows`, `restore ID`, `clear-block ID`, `usage`, `keys`, `disable-key ID`,
//! `enable-key ID`, `status`, and the prices: `prices`, `set-price`, `remove-price`) are one clap
//! subcommand enum
//! ([`Verb`]), run by one [`execute`] against an [`AdminEndpoint`], and print the same output
//! whichever endpoint answered: the selector's admin gRPC API ([`grpc::SelectorAdmin`],
//! distributed) or the standalone relay's admin HTTP endpoint ([`http::HttpAdmin`]). Both serve
//! the one implementation over the selection engine, [`engine::EngineAdmin`]: the relay's admin
//! routes ([`http::router`]) and both modes' status pages ([`page`]) take it as their
//! `AdminEndpoint`, the selector's admin gRPC service calls its domain methods. A verb is one
//! trait method, one engine implementation, one gRPC encode/decode ([`grpc`]'s rows) and one
//! route. The rows and the JSON envelopes are [`view`]'s. Configuration verbs stay where
//! configuration lives: the selector's admin RPCs (`selector-svc admin upsert-account …`), the
//! standalone relay's YAML file; [`instant`] reads the instants both write (a key's expiry).

pub mod engine;
pub mod grpc;
pub mod http;
pub mod instant;
pub mod page;
pub mod signin;
pub mod verb;
pub mod view;

use std::process::ExitCode;

use async_trait::async_trait;
use poolgate_core::account::SignIn;

pub use verb::{Format, Output, Verb};
pub use view::{
    AccountRow, AccountStatusRow, BlockRow, KeyRow, ModelUsageRow, PriceList, PriceRow, ReplicaRow,
    SignedInRow, StatusView, UsageReport, UsageRow, WindowRow,
};

/// An admin endpoint the read and repair verbs run against.
#[async_trait]
pub trait AdminEndpoint: Send + Sync {
    /// Accounts sorted by id, only `group`'s when given.
    async fn accounts(&self, group: Option<&str>) -> Result<Vec<AccountRow>, OperatorError>;
    /// Every block on every account.
    async fn blocks(&self) -> Result<Vec<BlockRow>, OperatorError>;
    /// The usage windows the selector keeps, as [`view::window_rows`] orders them: only
    /// `account_id`'s, only `group`'s accounts, when given (an unknown account is not found).
    async fn windows(
        &self,
        account_id: Option<i64>,
        group: Option<&str>,
    ) -> Result<Vec<WindowRow>, OperatorError>;
    /// Back to `active` (from retired, error or disabled), blocks cleared; the account after.
    async fn restore(&self, account_id: i64) -> Result<AccountRow, OperatorError>;
    /// Clears the account's blocks and breaker.
    async fn clear_block(&self, account_id: i64) -> Result<(), OperatorError>;
    /// Usage per client key between two instants (ms since the epoch), only `api_key_id`'s when
    /// given.
    async fn usage(
        &self,
        from_ms: i64,
        to_ms: i64,
        api_key_id: Option<i64>,
    ) -> Result<UsageReport, OperatorError>;
    /// Client keys ascending by id (the selector's revoked ones too).
    async fn keys(&self) -> Result<Vec<KeyRow>, OperatorError>;
    /// Disables (`true`) or enables a client key; the key after. A revoked or unknown key is not
    /// found.
    async fn set_key_disabled(
        &self,
        api_key_id: i64,
        disabled: bool,
    ) -> Result<KeyRow, OperatorError>;
    /// The pool at a glance: every account's live state, load and windows, and admission's state
    /// (the `status` verb and the status page).
    async fn status(&self) -> Result<StatusView, OperatorError>;
    /// Puts a sign-in's or an import's tokens into the pool (docs/DESIGN.md §5, "Signing
    /// accounts in"): the account named, or the one with its identity, or a new one.
    async fn sign_in(&self, sign_in: &SignIn) -> Result<SignedInRow, OperatorError>;
    /// Every operator and catalogue price, ascending by model, each with its source
    /// (docs/DESIGN.md §6, "Prices").
    async fn prices(&self) -> Result<PriceList, OperatorError>;
    /// Sets the operator's price of `model` (over the catalogue's); the model's price after. A
    /// price that is not one (negative, NaN, …) or a bad model name is invalid, naming the
    /// field, and nothing changes.
    async fn set_price(
        &self,
        model: &str,
        price: poolgate_core::account::Price,
    ) -> Result<PriceRow, OperatorError>;
    /// Removes the operator's price of `model`; the model's price after (the catalogue's, or
    /// none). A model without an operator price is not found.
    async fn remove_price(&self, model: &str) -> Result<PriceRow, OperatorError>;
}

/// Why a verb did not run. The detail keeps the transport's own code (`401 Unauthorized`,
/// `NotFound`), so an operator can tell a refusal from an outage.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OperatorError {
    #[error("the admin token was refused ({0})")]
    Unauthenticated(String),
    #[error("not found ({0})")]
    NotFound(String),
    #[error("invalid request ({0})")]
    Invalid(String),
    #[error("unavailable ({0})")]
    Unavailable(String),
    #[error("cannot reach the admin endpoint: {0}")]
    Unreachable(String),
    #[error("unreadable answer: {0}")]
    Unreadable(String),
    #[error("failed ({0})")]
    Failed(String),
}

impl OperatorError {
    /// The exit status of a verb that ended with this error: 2 for a request the endpoint
    /// refused as invalid (the operator's input, as a bad flag is), 1 for any other failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            OperatorError::Invalid(_) => 2,
            _ => 1,
        }
    }

    /// What went wrong without the kind's words around it (`no account 7`): the message an
    /// answer carries next to its status.
    pub fn detail(&self) -> &str {
        match self {
            OperatorError::Unauthenticated(detail)
            | OperatorError::NotFound(detail)
            | OperatorError::Invalid(detail)
            | OperatorError::Unavailable(detail)
            | OperatorError::Unreachable(detail)
            | OperatorError::Unreadable(detail)
            | OperatorError::Failed(detail) => detail,
        }
    }
}

/// Runs one verb and renders its answer as the verb's `--output` asks: one tab-separated line
/// per row (nothing for an empty list), or the endpoint's JSON envelope.
pub async fn execute(endpoint: &dyn AdminEndpoint, verb: &Verb) -> Result<String, OperatorError> {
    let answer = match verb {
        Verb::Accounts { group, .. } => verb::Answer::Accounts(view::AccountList {
            accounts: endpoint.accounts(group.as_deref()).await?,
        }),
        Verb::Blocks { .. } => verb::Answer::Blocks(view::BlockList {
            blocks: endpoint.blocks().await?,
        }),
        Verb::Windows {
            account_id, group, ..
        } => verb::Answer::Windows(view::WindowList {
            windows: endpoint.windows(*account_id, group.as_deref()).await?,
        }),
        Verb::Restore { account_id, .. } => verb::Answer::Restored(view::Restored {
            account: endpoint.restore(*account_id).await?,
        }),
        Verb::ClearBlock { account_id, .. } => {
            endpoint.clear_block(*account_id).await?;
            verb::Answer::Cleared(view::Cleared {
                cleared: *account_id,
            })
        }
        Verb::Usage {
            api_key_id, hours, ..
        } => {
            let to_ms = poolgate_core::now_ms() + 1;
            let from_ms = to_ms - i64::from(*hours) * 3_600_000;
            verb::Answer::Usage(endpoint.usage(from_ms, to_ms, *api_key_id).await?)
        }
        Verb::Keys { .. } => verb::Answer::Keys(view::KeyList {
            keys: endpoint.keys().await?,
        }),
        Verb::DisableKey { api_key_id, .. } => verb::Answer::Key(view::KeyChanged {
            key: endpoint.set_key_disabled(*api_key_id, true).await?,
        }),
        Verb::EnableKey { api_key_id, .. } => verb::Answer::Key(view::KeyChanged {
            key: endpoint.set_key_disabled(*api_key_id, false).await?,
        }),
        Verb::Status { .. } => verb::Answer::Status(view::StatusAnswer {
            status: endpoint.status().await?,
        }),
        Verb::Prices { .. } => verb::Answer::Prices(endpoint.prices().await?),
        Verb::SetPrice { model, price, .. } => {
            let price = price.price();
            // Refused before anything is sent, naming the field (a NaN does not survive JSON).
            poolgate_core::price::check_price(model, &price).map_err(|(field, problem)| {
                let flag = if field == "model" {
                    "model".to_owned()
                } else {
                    format!("--{}-usd", field.replace('_', "-"))
                };
                OperatorError::Invalid(format!("invalid {flag}: {problem}"))
            })?;
            verb::Answer::Price(view::PriceChanged {
                price: endpoint.set_price(model, price).await?,
            })
        }
        Verb::RemovePrice { model, .. } => {
            if model.is_empty() {
                return Err(OperatorError::Invalid(
                    "invalid model: must not be empty".into(),
                ));
            }
            verb::Answer::Price(view::PriceChanged {
                price: endpoint.remove_price(model).await?,
            })
        }
    };
    answer.render(verb.output())
}

/// [`execute`], printed: the answer on stdout, an error on stderr as `<program>: <error>` with
/// [`OperatorError::exit_code`]'s status (2 for a request refused as invalid, as clap's 2 for a
/// bad flag before this runs; 1 for a call that failed).
pub async fn run(program: &str, endpoint: &dyn AdminEndpoint, verb: &Verb) -> ExitCode {
    match execute(endpoint, verb).await {
        Ok(text) => {
            if !text.is_empty() {
                println!("{text}");
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{program}: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
