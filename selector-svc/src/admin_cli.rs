//! `selector-svc admin …`: the operator CLI against a running selector's admin gRPC API. The read
//! and repair verbs (accounts, blocks, windows, restore, clear-block, usage, keys, disable-key,
//! enable-key) are `poolgate-operator`'s, the same verbs and output as `relay-svc admin`; the
//! configuration verbs (accounts and client keys, statuses, bindings, load) are the selector's
//! own, since its configuration lives behind these RPCs (a standalone relay's lives in its YAML
//! file).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgMatches, Args, Subcommand, ValueEnum};
use poolgate_core::account::{CredentialKind, Platform, default_oauth_token_url};
use poolgate_core::keys::{Endpoint, parse_endpoints};
use poolgate_core::lease::KeyLimits;
use poolgate_operator::grpc::{AdminClient, SelectorAdmin, account_row, api_key_row};
use poolgate_operator::instant::parse_instant;
use poolgate_operator::verb::{account_line, key_line};
use poolgate_operator::{OperatorError, Verb};
use poolgate_proto::convert::keys::{KeyUpdate, budget_micros, endpoint_names, set_new_key_limits};
use poolgate_proto::selector::v1 as pb;
use poolgate_runtime::secret_flags::SecretFlag;

use crate::cli::given;

const PROGRAM: &str = "selector-svc admin";

#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Selector gRPC endpoint.
    #[arg(
        long,
        env = "SELECTOR_ENDPOINT",
        default_value = "http://127.0.0.1:50062"
    )]
    endpoint: String,
    /// The admin token. On the command line it is visible to every local user: prefer
    /// --admin-token-file.
    #[arg(long, env = "SELECTOR_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// A file holding the admin token (a trailing newline is ignored).
    #[arg(long, env = "SELECTOR_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// The service token the selector requires of every caller. On the command line it is
    /// visible to every local user: prefer --service-token-file.
    #[arg(long, env = "POOLGATE_SERVICE_TOKEN", hide_env_values = true)]
    service_token: Option<String>,
    /// A file holding the service token (a trailing newline is ignored).
    #[arg(long, env = "POOLGATE_SERVICE_TOKEN_FILE")]
    service_token_file: Option<PathBuf>,
    /// `--admin-token` came from the command line (set from the parse, not a flag).
    #[arg(skip)]
    admin_token_on_command_line: bool,
    /// `--service-token` came from the command line.
    #[arg(skip)]
    service_token_on_command_line: bool,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    #[command(flatten)]
    Verb(Verb),
    #[command(flatten)]
    SignIn(poolgate_operator::signin::SignInVerb),
    #[command(flatten)]
    Configure(ConfigVerb),
}

/// The selector's configuration verbs (and its own reads: keys, load).
#[derive(Debug, Subcommand)]
enum ConfigVerb {
    /// Create or update an account.
    UpsertAccount(Box<UpsertAccount>),
    /// Set an account's status.
    SetStatus {
        account_id: i64,
        #[arg(value_enum)]
        status: Status,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Create a client API key (shown once).
    CreateKey {
        #[arg(long)]
        user: String,
        #[arg(long)]
        group: String,
        /// Requests per minute of the key's user (0: no limit).
        #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(0..))]
        user_rpm: i32,
        #[arg(long, default_value = "")]
        name: String,
        /// When the key stops working: RFC 3339 (2026-12-31T23:59:59Z), a date (midnight UTC)
        /// or seconds since the epoch. None: never.
        #[arg(long, value_parser = parse_instant)]
        expires_at: Option<i64>,
        /// The models the key may ask for, comma-separated patterns (`*` for any run: `claude-*,gpt-4o`).
        /// None: every model.
        #[arg(long, value_delimiter = ',')]
        models: Vec<String>,
        /// The endpoints the key may call, comma-separated (messages, count_tokens,
        /// chat_completions, responses, models). None: every endpoint.
        #[arg(long, value_delimiter = ',', value_parser = endpoint)]
        endpoints: Vec<Endpoint>,
        #[command(flatten)]
        limits: NewKeyLimits,
    },
    /// Change a client key's disable, expiry, lists or limits (only what is given).
    UpdateKey(UpdateKey),
    /// Revoke a client API key (for good; `disable-key` can be undone).
    RevokeKey { id: i64 },
    /// Drop a sticky binding. Bindings are scoped to the client key: the session is
    /// `k<api key id>:<session hash>` (as `admin keys` lists keys).
    DropBinding { group: String, session_hash: String },
    /// Live leases per account.
    Load,
}

/// A new key's own limits, counted by admission (docs/DESIGN.md §4); 0: none.
#[derive(Debug, Args)]
struct NewKeyLimits {
    /// Requests of the key in flight at once.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(0..))]
    concurrency: i32,
    /// Input + output tokens over a rolling minute.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(0..))]
    tpm: i64,
    /// Spend budget in USD, in total.
    #[arg(long, value_name = "USD", default_value = "0", allow_negative_numbers = true, value_parser = budget)]
    budget_total: i64,
    /// Spend budget in USD per calendar day (the deployment's time zone).
    #[arg(long, value_name = "USD", default_value = "0", allow_negative_numbers = true, value_parser = budget)]
    budget_day: i64,
    /// Spend budget in USD per calendar week (the deployment's week start).
    #[arg(long, value_name = "USD", default_value = "0", allow_negative_numbers = true, value_parser = budget)]
    budget_week: i64,
    /// Spend budget in USD per calendar month.
    #[arg(long, value_name = "USD", default_value = "0", allow_negative_numbers = true, value_parser = budget)]
    budget_month: i64,
}

impl NewKeyLimits {
    fn limits(&self) -> KeyLimits {
        KeyLimits {
            api_key_id: 0,
            concurrency_limit: self.concurrency,
            tpm_limit: self.tpm,
            budget_total_micros: self.budget_total,
            budget_day_micros: self.budget_day,
            budget_week_micros: self.budget_week,
            budget_month_micros: self.budget_month,
        }
    }
}

/// A session window's limit in USD: a finite amount, 0 or more (0: none).
fn window_usd(usd: &str) -> Result<f64, String> {
    match usd.parse::<f64>() {
        Ok(usd) if usd.is_finite() && usd >= 0.0 => Ok(usd),
        _ => Err(format!("{usd:?} is not an amount in USD, 0 or more")),
    }
}

/// A budget in USD as micro-USD: a finite amount in [0, 1e6] (0: none).
fn budget(usd: &str) -> Result<i64, String> {
    let usd: f64 = usd
        .parse()
        .map_err(|_| format!("{usd:?} is not an amount in USD"))?;
    budget_micros("budget", usd).map_err(|e| e.problem)
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("change").required(true).multiple(true)))]
struct UpdateKey {
    #[arg(value_parser = clap::value_parser!(i64).range(1..))]
    id: i64,
    /// Refuse the key until `--enable` (or `enable-key`).
    #[arg(long, group = "change", conflicts_with = "enable")]
    disable: bool,
    #[arg(long, group = "change")]
    enable: bool,
    /// The new expiry: RFC 3339, a date (midnight UTC) or seconds since the epoch.
    #[arg(long, group = "change", value_parser = parse_instant, conflicts_with = "no_expiry")]
    expires_at: Option<i64>,
    /// Clear the expiry.
    #[arg(long, group = "change")]
    no_expiry: bool,
    /// The new model list, comma-separated patterns, `*` for any run (replaces the old one).
    #[arg(
        long,
        group = "change",
        value_delimiter = ',',
        conflicts_with = "any_model"
    )]
    models: Option<Vec<String>>,
    /// Clear the model list: every model.
    #[arg(long, group = "change")]
    any_model: bool,
    /// The new endpoint list, comma-separated (replaces the old one).
    #[arg(
        long,
        group = "change",
        value_delimiter = ',',
        value_parser = endpoint,
        conflicts_with = "any_endpoint"
    )]
    endpoints: Option<Vec<Endpoint>>,
    /// Clear the endpoint list: every endpoint.
    #[arg(long, group = "change")]
    any_endpoint: bool,
    /// Requests of the key in flight at once (0: no limit).
    #[arg(long, group = "change", allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(0..))]
    concurrency: Option<i32>,
    /// Input + output tokens over a rolling minute (0: no limit).
    #[arg(long, group = "change", allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(0..))]
    tpm: Option<i64>,
    /// Spend budget in USD, in total (0: none).
    #[arg(long, group = "change", value_name = "USD", allow_negative_numbers = true, value_parser = budget)]
    budget_total: Option<i64>,
    /// Spend budget in USD per calendar day (0: none).
    #[arg(long, group = "change", value_name = "USD", allow_negative_numbers = true, value_parser = budget)]
    budget_day: Option<i64>,
    /// Spend budget in USD per calendar week (0: none).
    #[arg(long, group = "change", value_name = "USD", allow_negative_numbers = true, value_parser = budget)]
    budget_week: Option<i64>,
    /// Spend budget in USD per calendar month (0: none).
    #[arg(long, group = "change", value_name = "USD", allow_negative_numbers = true, value_parser = budget)]
    budget_month: Option<i64>,
}

impl UpdateKey {
    fn update(&self) -> KeyUpdate {
        KeyUpdate {
            disabled: match (self.disable, self.enable) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            expires_at_ms: match (self.expires_at, self.no_expiry) {
                (Some(at), _) => Some(Some(at)),
                (None, true) => Some(None),
                (None, false) => None,
            },
            allowed_models: replacement(&self.models, self.any_model),
            allowed_endpoints: replacement(&self.endpoints, self.any_endpoint),
            concurrency_limit: self.concurrency,
            tpm_limit: self.tpm,
            budget_total_micros: self.budget_total,
            budget_day_micros: self.budget_day,
            budget_week_micros: self.budget_week,
            budget_month_micros: self.budget_month,
        }
    }
}

/// A list's replacement: the one given, or an empty one (no limit) when `clear`.
fn replacement<T: Clone>(given: &Option<Vec<T>>, clear: bool) -> Option<Vec<T>> {
    given.clone().or_else(|| clear.then(Vec::new))
}

/// An endpoint name, the error listing the known ones.
fn endpoint(name: &str) -> Result<Endpoint, String> {
    parse_endpoints(&[name.to_owned()]).map(|endpoints| endpoints[0])
}

#[derive(Debug, Args)]
struct UpsertAccount {
    #[arg(long)]
    name: String,
    #[arg(long)]
    group: String,
    #[arg(long, value_enum)]
    platform: PlatformArg,
    #[arg(long)]
    base_url: String,
    /// `oauth`: a Claude subscription; `chatgpt_oauth`: a ChatGPT subscription (platform openai).
    #[arg(long, value_enum, default_value_t = KindArg::ApiKey)]
    credential_kind: KindArg,
    /// The credential; read from the ACCOUNT_CREDENTIAL env var when absent.
    #[arg(
        long,
        env = "ACCOUNT_CREDENTIAL",
        hide_env_values = true,
        default_value = ""
    )]
    credential: String,
    /// Lower first; negative is allowed.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(0..))]
    weight: i32,
    /// Requests in flight at once (0: no limit).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(0..))]
    concurrency: i32,
    /// Requests per minute (0: no limit).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(0..))]
    rpm: i32,
    /// Spend per 5-hour session window in USD (0: no limit).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = window_usd)]
    session_window_usd: f64,
    /// OAuth accounts: the refresh token (read from ACCOUNT_REFRESH_TOKEN when absent).
    #[arg(
        long,
        env = "ACCOUNT_REFRESH_TOKEN",
        hide_env_values = true,
        default_value = ""
    )]
    refresh_token: String,
    /// OAuth accounts: access token expiry, ms since the epoch.
    #[arg(long, default_value_t = 0)]
    expires_at_ms: u64,
    // OAuth accounts: the token endpoint URL (help: `token_url_help`).
    #[arg(long, default_value = "", help = token_url_help())]
    token_url: String,
    /// OAuth accounts: the client id of refresh requests (none: the platform's default).
    #[arg(long, default_value = "")]
    oauth_client_id: String,
    /// Models the account may serve (repeatable; none: every model).
    #[arg(long = "model")]
    models: Vec<String>,
    /// Per-account proxy URL.
    #[arg(long, default_value = "")]
    proxy_url: String,
    /// The model the confirmation probe asks for (none: the selector's platform default).
    #[arg(long, default_value = "")]
    probe_model: String,
    /// OpenAI chat streams: do not ask the upstream for usage when the client did not (for
    /// upstreams that reject `stream_options`).
    #[arg(long)]
    no_stream_usage: bool,
    /// What the upstream answers, when less than its platform can (repeatable: `chat`,
    /// `embeddings`, `rerank`; none: all it can). `--serves chat` for an OpenAI-compatible
    /// upstream without embeddings, `--serves embeddings` for an embeddings server.
    #[arg(long = "serves", value_enum)]
    serves: Vec<ServiceArg>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum PlatformArg {
    Anthropic,
    Openai,
    /// A rerank API in Cohere's format (Cohere, Jina, vLLM); API keys.
    Rerank,
}

impl From<PlatformArg> for Platform {
    fn from(platform: PlatformArg) -> Self {
        match platform {
            PlatformArg::Anthropic => Platform::Anthropic,
            PlatformArg::Openai => Platform::OpenAi,
            PlatformArg::Rerank => Platform::Rerank,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ServiceArg {
    Chat,
    Embeddings,
    Rerank,
}

impl From<ServiceArg> for pb::Service {
    fn from(service: ServiceArg) -> Self {
        match service {
            ServiceArg::Chat => pb::Service::Chat,
            ServiceArg::Embeddings => pb::Service::Embeddings,
            ServiceArg::Rerank => pb::Service::Rerank,
        }
    }
}

impl From<KindArg> for CredentialKind {
    fn from(kind: KindArg) -> Self {
        match kind {
            KindArg::ApiKey => CredentialKind::ApiKey,
            KindArg::OAuth => CredentialKind::OAuth,
            KindArg::ChatGptOAuth => CredentialKind::ChatGptOAuth,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum KindArg {
    #[value(name = "api_key")]
    ApiKey,
    #[value(name = "oauth")]
    OAuth,
    #[value(name = "chatgpt_oauth")]
    ChatGptOAuth,
}

/// The statuses an operator sets (`retired` is set by quota outcomes only).
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Status {
    Active,
    Disabled,
    Error,
}

/// `--token-url`'s help: unset stores none, and reads give the platform's default, named here
/// from `default_oauth_token_url` so the help follows it.
fn token_url_help() -> String {
    format!(
        "OAuth accounts: the token endpoint URL. None: the platform's default, applied when the \
         account is read ({} for anthropic, {} for openai); an update without it keeps the \
         stored URL",
        default_oauth_token_url(Platform::Anthropic),
        default_oauth_token_url(Platform::OpenAi),
    )
}

impl AdminArgs {
    pub fn note_command_line(&mut self, matches: &ArgMatches) {
        self.admin_token_on_command_line = given(matches, "admin_token");
        self.service_token_on_command_line = given(matches, "service_token");
    }

    /// The admin token (required) and the service token.
    fn tokens(&self) -> Result<(String, Option<String>), String> {
        let admin = secret(
            "--admin-token",
            self.admin_token.as_deref(),
            self.admin_token_on_command_line,
            self.admin_token_file.as_deref(),
        )?
        .ok_or("--admin-token-file (or SELECTOR_ADMIN_TOKEN) is required")?;
        let service = secret(
            "--service-token",
            self.service_token.as_deref(),
            self.service_token_on_command_line,
            self.service_token_file.as_deref(),
        )?;
        Ok((admin, service))
    }
}

/// A token flag, with the warning a value on the command line earns printed to stderr (no
/// telemetry here: the answer is the output).
fn secret(
    flag: &str,
    value: Option<&str>,
    on_command_line: bool,
    file: Option<&std::path::Path>,
) -> Result<Option<String>, String> {
    let flag = SecretFlag {
        flag,
        value,
        on_command_line,
        file,
    };
    if let Some(warning) = flag.warning() {
        eprintln!("{PROGRAM}: warning: {warning}");
    }
    flag.read()
}

/// Runs one admin command. Exit status 2 for missing or unreadable tokens, 1 when the selector
/// refused the call or could not be reached.
pub async fn run(args: &AdminArgs) -> ExitCode {
    let (admin_token, service_token) = match args.tokens() {
        Ok(tokens) => tokens,
        Err(message) => {
            eprintln!("{PROGRAM}: {message}");
            return ExitCode::from(2);
        }
    };
    // A flag the service would refuse is refused before anything is sent.
    if let AdminCommand::Configure(ConfigVerb::UpsertAccount(account)) = &args.command
        && let Some(problem) = poolgate_select::probe::probe_model_refusal(
            account.platform.into(),
            account.credential_kind.into(),
            &account.probe_model,
        )
    {
        eprintln!("{PROGRAM}: --probe-model: {problem}");
        return ExitCode::from(2);
    }
    let admin = match SelectorAdmin::connect(&args.endpoint, &admin_token, service_token.as_deref())
        .await
    {
        Ok(admin) => admin,
        Err(error) => {
            eprintln!("{PROGRAM}: {error}");
            // A malformed endpoint or token is the flags' fault; an unreachable one is not.
            let flags = matches!(error, OperatorError::Invalid(_));
            return ExitCode::from(if flags { 2 } else { 1 });
        }
    };
    let verb = match &args.command {
        AdminCommand::Verb(verb) => return poolgate_operator::run(PROGRAM, &admin, verb).await,
        AdminCommand::SignIn(verb) => {
            let mut terminal = poolgate_operator::signin::Terminal;
            return poolgate_operator::signin::run(PROGRAM, &admin, verb, &mut terminal).await;
        }
        AdminCommand::Configure(verb) => verb,
    };
    match configure(admin.client(), verb).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{PROGRAM}: {error}");
            // A refusal of the operator's input exits 2, as a bad flag does.
            ExitCode::from(error.exit_code())
        }
    }
}

/// An account as the configuration verbs print it: the shared row, limits included, the line
/// `admin accounts` prints.
fn print_account(view: &pb::AccountView) -> Result<(), OperatorError> {
    println!("{}", account_line(&account_row(view)?));
    Ok(())
}

async fn configure(mut client: AdminClient, verb: &ConfigVerb) -> Result<(), OperatorError> {
    match verb {
        ConfigVerb::UpsertAccount(account) => {
            let platform = Platform::from(account.platform);
            let kind = CredentialKind::from(account.credential_kind);
            let answer = client
                .upsert_account(pb::UpsertAccountRequest {
                    name: account.name.clone(),
                    group: account.group.clone(),
                    platform: pb::Platform::from(platform) as i32,
                    base_url: account.base_url.clone(),
                    kind: pb::CredentialKind::from(kind) as i32,
                    credential: account.credential.clone(),
                    priority: account.priority,
                    weight: account.weight,
                    concurrency_limit: account.concurrency,
                    rpm_limit: account.rpm,
                    session_window_limit_usd: account.session_window_usd,
                    refresh_token: account.refresh_token.clone(),
                    expires_at_ms: account.expires_at_ms,
                    token_url: account.token_url.clone(),
                    oauth_client_id: account.oauth_client_id.clone(),
                    allowed_models: account.models.clone(),
                    proxy_url: account.proxy_url.clone(),
                    probe_model: account.probe_model.clone(),
                    disable_stream_usage: account.no_stream_usage,
                    serves: account
                        .serves
                        .iter()
                        .map(|service| pb::Service::from(*service) as i32)
                        .collect(),
                    ..Default::default()
                })
                .await?;
            print_account(answer.get_ref())?;
        }
        ConfigVerb::SetStatus {
            account_id,
            status,
            reason,
        } => {
            let status = match status {
                Status::Active => "active",
                Status::Disabled => "disabled",
                Status::Error => "error",
            };
            let answer = client
                .set_account_status(pb::SetAccountStatusRequest {
                    account_id: *account_id,
                    status: status.to_owned(),
                    reason: reason.clone(),
                })
                .await?;
            print_account(answer.get_ref())?;
        }
        ConfigVerb::CreateKey {
            user,
            group,
            user_rpm,
            name,
            expires_at,
            models,
            endpoints,
            limits,
        } => {
            let mut request = pb::CreateApiKeyRequest {
                user: user.clone(),
                group: group.clone(),
                user_rpm_limit: *user_rpm,
                name: name.clone(),
                expires_at_ms: *expires_at,
                allowed_models: models.clone(),
                allowed_endpoints: endpoint_names(endpoints),
                ..Default::default()
            };
            set_new_key_limits(&mut request, &limits.limits());
            let answer = client.create_api_key(request).await?;
            // The one time the key is shown: printing it is the point of the command.
            println!(
                "id={}\napi_key={}\n(shown once: store it now)",
                answer.get_ref().id,
                answer.get_ref().api_key
            );
        }
        ConfigVerb::UpdateKey(update) => {
            let request = pb::UpdateApiKeyRequest::from((update.id, &update.update()));
            let answer = client.update_api_key(request).await?;
            let row = api_key_row(answer.into_inner())?;
            println!("{}", key_line(&row, poolgate_core::now_ms()));
        }
        ConfigVerb::RevokeKey { id } => {
            client
                .revoke_api_key(pb::RevokeApiKeyRequest { id: *id })
                .await?;
            println!("revoked {id}");
        }
        ConfigVerb::DropBinding {
            group,
            session_hash,
        } => {
            let answer = client
                .drop_binding(pb::DropBindingRequest {
                    group: group.clone(),
                    session_hash: session_hash.clone(),
                })
                .await?;
            println!("dropped={}", answer.get_ref().dropped);
        }
        ConfigVerb::Load => {
            let answer = client
                .read_load(pb::ReadLoadRequest {
                    account_ids: vec![],
                })
                .await?;
            for a in &answer.get_ref().accounts {
                println!(
                    "{}\tinflight={}\tlimit={}",
                    a.account_id, a.inflight, a.concurrency_limit
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
