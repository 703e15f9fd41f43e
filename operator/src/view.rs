//! What operators see, the same in both modes: the rows the read and repair verbs show, and the
//! JSON envelopes the standalone relay's admin endpoint answers with (the CLI's `--output json`
//! prints the same envelopes, whichever endpoint answered).

use poolgate_core::account::{
    AccountIdentity, ApiKeyRecord, CredentialKind, ImportedSettings, Platform, Price, Secret,
    SignIn,
};
use poolgate_core::keys::{PeriodUsage, UsagePeriod};
use poolgate_core::money::micros_to_usd;
use poolgate_core::price::ListedPrice;
use poolgate_core::status::{AccountStanding, AdmissionPolicy, BlockNote, StatusReport};
use poolgate_core::windows::{MinuteLimit, Scope, WindowKind, WindowReading, WindowStatus};
use poolgate_proto::convert::keys::{endpoint_names, key_status};
use serde::{Deserialize, Serialize};

/// An account as operators see it: the credential masked, never whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccountRow {
    pub id: i64,
    pub name: String,
    pub group: String,
    /// `anthropic` or `openai`.
    pub platform: String,
    /// `api_key`, `oauth` or `chatgpt_oauth`.
    pub credential_kind: String,
    pub credential_masked: String,
    /// `active`, `disabled`, `error` or `retired`.
    pub status: String,
    pub status_reason: String,
    /// Lower is tried first.
    #[serde(default)]
    pub priority: i32,
    /// Its relative share within its priority tier.
    #[serde(default)]
    pub weight: i32,
    /// Requests in flight at once; 0: no limit.
    #[serde(default)]
    pub concurrency_limit: i32,
    /// Requests per minute; 0: no limit.
    #[serde(default)]
    pub rpm_limit: i32,
    /// Spend per session window, USD; 0: no limit.
    #[serde(default)]
    pub session_window_limit_usd: f64,
    /// Who the upstream says the account is (`<user>/<organisation>` ids, email, plan), when it
    /// was signed in or imported; empty: not known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub upstream_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub email: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub plan: String,
    /// OAuth: when the access token expires (ms since the epoch; 0: unknown), and whether a
    /// refresh token keeps it alive (without one the account is signed in again before then).
    #[serde(default)]
    pub token_expires_at_ms: u64,
    #[serde(default)]
    pub refreshable: bool,
    /// Its own `serves` list (`chat`, `embeddings`, `rerank`); empty: everything its platform and
    /// credential serve.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serves: Vec<String>,
}

/// A sign-in or an import as the standalone relay's admin endpoint takes it
/// (`POST /admin/accounts/sign-in`): [`SignIn`]'s fields, tokens in clear (the endpoint is
/// behind the admin token; nothing answers them back).
#[derive(Clone, Serialize, Deserialize)]
pub struct SignInBody {
    pub platform: String,
    pub kind: String,
    pub access_token: String,
    #[serde(default)]
    pub refresh_token: String,
    #[serde(default)]
    pub expires_at_ms: i64,
    #[serde(default)]
    pub token_url: String,
    #[serde(default)]
    pub client_id: String,
    pub upstream_id: String,
    #[serde(default)]
    pub email: String,
    #[serde(default)]
    pub plan: String,
    #[serde(default)]
    pub account_id: Option<i64>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub base_url: Option<String>,
    #[serde(default)]
    pub priority: Option<i32>,
    #[serde(default)]
    pub concurrency_limit: Option<i32>,
    #[serde(default)]
    pub rpm_limit: Option<i32>,
    #[serde(default)]
    pub proxy_url: Option<String>,
    #[serde(default)]
    pub model_mapping: Option<std::collections::HashMap<String, String>>,
}

impl std::fmt::Debug for SignInBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignInBody")
            .field("platform", &self.platform)
            .field("kind", &self.kind)
            .field("upstream_id", &self.upstream_id)
            .finish_non_exhaustive()
    }
}

impl From<&SignIn> for SignInBody {
    fn from(sign_in: &SignIn) -> Self {
        let settings = &sign_in.settings;
        SignInBody {
            platform: sign_in.platform.as_str().to_owned(),
            kind: sign_in.kind.as_str().to_owned(),
            access_token: sign_in.access_token.expose().to_owned(),
            refresh_token: sign_in.refresh_token.expose().to_owned(),
            expires_at_ms: sign_in.expires_at_ms,
            token_url: sign_in.token_url.clone(),
            client_id: sign_in.client_id.clone(),
            upstream_id: sign_in.identity.upstream_id.clone(),
            email: sign_in.identity.email.clone(),
            plan: sign_in.identity.plan.clone(),
            account_id: sign_in.account_id,
            name: sign_in.name.clone(),
            group: sign_in.group.clone(),
            base_url: sign_in.base_url.clone(),
            priority: settings.priority,
            concurrency_limit: settings.concurrency_limit,
            rpm_limit: settings.rpm_limit,
            proxy_url: settings.proxy_url.clone(),
            model_mapping: settings.model_mapping.clone(),
        }
    }
}

impl SignInBody {
    /// The sign-in, or the first field it cannot be (named, never quoting a token).
    pub fn to_sign_in(self) -> Result<SignIn, (&'static str, String)> {
        let platform = Platform::parse(&self.platform)
            .ok_or(("platform", "must be anthropic or openai".to_owned()))?;
        let kind = CredentialKind::parse(&self.kind)
            .ok_or(("kind", "must be api_key, oauth or chatgpt_oauth".to_owned()))?;
        if self.account_id.is_some_and(|id| id <= 0) {
            return Err(("account_id", "must be positive".into()));
        }
        let sign_in = SignIn {
            platform,
            kind,
            access_token: Secret::new(self.access_token),
            refresh_token: Secret::new(self.refresh_token),
            expires_at_ms: self.expires_at_ms,
            token_url: self.token_url,
            client_id: self.client_id,
            identity: AccountIdentity {
                upstream_id: self.upstream_id,
                email: self.email,
                plan: self.plan,
            },
            account_id: self.account_id,
            name: self.name,
            group: self.group,
            base_url: self.base_url,
            settings: ImportedSettings {
                priority: self.priority,
                concurrency_limit: self.concurrency_limit,
                rpm_limit: self.rpm_limit,
                proxy_url: self.proxy_url,
                model_mapping: self.model_mapping,
            },
        };
        match sign_in.problem() {
            Some(problem) => Err(problem),
            None => Ok(sign_in),
        }
    }
}

/// What a sign-in did: the account after, and whether it is new or came back from `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignedInRow {
    pub account: AccountRow,
    pub created: bool,
    #[serde(default)]
    pub reactivated: bool,
}

/// One block on one account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockRow {
    pub account_id: i64,
    pub account_name: String,
    /// `hard`, `soft` or `breaker`.
    pub kind: String,
    /// The outcome class that caused it.
    pub class: String,
    /// The upstream's HTTP status (0 when none caused it).
    pub status: u16,
    pub reason: String,
    pub remaining_ms: u64,
}

/// One usage window of one account, as its upstream last reported it (docs/DESIGN.md §5).
/// Times are measured against the answering side's clock when it read the readings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowRow {
    pub account_id: i64,
    pub account_name: String,
    /// Which limit ([`window_kind_name`]): `5h`, `7d`, `7d_oi`, `7d_model`, `overage`,
    /// `codex_primary`, `codex_secondary`, `per_minute_requests`, `per_minute_tokens`,
    /// `per_minute_input_tokens` or `per_minute_output_tokens`.
    pub kind: String,
    /// Whom it limits: `account` (every request), or the token of the upstream models it covers
    /// (`opus`, `sonnet`, a Codex limit's name).
    pub scope: String,
    /// Share used, 0..=1; `null` when the upstream stated only a status.
    pub utilization: Option<f64>,
    /// The upstream's verdict: `allowed`, `allowed_warning`, `rejected` or `unknown` (not stated).
    pub status: String,
    /// When the window resets, ms since the epoch.
    pub reset_at_ms: i64,
    /// Time to the reset; 0: it has passed, and the window reads as empty in selection.
    pub remaining_ms: u64,
    /// The window's length when stated or known, ms.
    pub length_ms: Option<i64>,
    /// When the answer that reported it arrived, ms since the epoch.
    pub observed_at_ms: i64,
    /// How long ago that was.
    pub age_ms: u64,
}

/// The rank `windows` lists a kind at: plan windows shortest first, then overage, Codex's, the
/// per-minute limits. Its name is `WindowKind::label`.
fn window_kind(kind: WindowKind) -> (u8, &'static str) {
    let rank = match kind {
        WindowKind::FiveHour => 0,
        WindowKind::SevenDay => 1,
        WindowKind::SevenDayOverageIncluded => 2,
        WindowKind::SevenDayModel => 3,
        WindowKind::Overage => 4,
        WindowKind::CodexPrimary => 5,
        WindowKind::CodexSecondary => 6,
        WindowKind::PerMinute(MinuteLimit::Requests) => 7,
        WindowKind::PerMinute(MinuteLimit::Tokens) => 8,
        WindowKind::PerMinute(MinuteLimit::InputTokens) => 9,
        WindowKind::PerMinute(MinuteLimit::OutputTokens) => 10,
    };
    (rank, kind.label())
}

/// The name `windows` shows for a kind (see [`WindowRow::kind`]).
pub fn window_kind_name(kind: WindowKind) -> &'static str {
    window_kind(kind).1
}

/// The name `windows` shows for a status.
pub fn window_status_name(status: WindowStatus) -> &'static str {
    match status {
        WindowStatus::Unknown => "unknown",
        WindowStatus::Allowed => "allowed",
        WindowStatus::AllowedWarning => "allowed_warning",
        WindowStatus::Rejected => "rejected",
    }
}

/// The rows of accounts' stored readings, read at `now_ms`: the one place both endpoints build
/// them (the selector's answer in the CLI, the engine's readings in the standalone relay), so
/// both show the same. Ordered by account, then kind (as [`window_kind`] ranks them), then
/// scope (the account-wide one first).
pub fn window_rows<'a>(
    now_ms: i64,
    accounts: impl IntoIterator<Item = (i64, &'a str, &'a [WindowReading])>,
) -> Vec<WindowRow> {
    // Each row with what it sorts by: account, kind rank, model token (none: account-wide).
    type Ranked<'a> = ((i64, u8, Option<&'a str>), WindowRow);
    let mut ranked: Vec<Ranked<'a>> = accounts
        .into_iter()
        .flat_map(|(account_id, account_name, readings)| {
            readings.iter().map(move |reading| {
                let (rank, kind) = window_kind(reading.kind);
                let token = match &reading.scope {
                    Scope::Account => None,
                    Scope::Models(token) => Some(token.as_str()),
                };
                let row = WindowRow {
                    account_id,
                    account_name: account_name.to_owned(),
                    kind: kind.to_owned(),
                    scope: token.unwrap_or("account").to_owned(),
                    utilization: reading.utilization,
                    status: window_status_name(reading.status).to_owned(),
                    reset_at_ms: reading.reset_at_ms,
                    remaining_ms: reading.reset_at_ms.saturating_sub(now_ms).max(0) as u64,
                    length_ms: reading.length_ms,
                    observed_at_ms: reading.observed_at_ms,
                    age_ms: now_ms.saturating_sub(reading.observed_at_ms).max(0) as u64,
                };
                ((account_id, rank, token), row)
            })
        })
        .collect();
    ranked.sort_by(|a, b| a.0.cmp(&b.0));
    ranked.into_iter().map(|(_, row)| row).collect()
}

/// One client key's usage over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageRow {
    pub api_key_id: i64,
    pub user: String,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
    /// The same usage per model and the price it was charged at (docs/DESIGN.md §6, "Prices"),
    /// ascending by model; empty from an endpoint that does not say.
    #[serde(default)]
    pub models: Vec<ModelUsageRow>,
}

/// One model's usage under one price source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelUsageRow {
    pub model: String,
    /// `operator`, `catalogue`, `fallback` or `none`; `unknown` for records that did not say (an
    /// older relay's).
    pub price_source: String,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
}

/// A model's price as operators see it (USD per million tokens; the cache write at the
/// provider's default TTL).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PriceRow {
    pub model: String,
    /// `operator`, `catalogue`, or `none` (neither prices it: the fallback or a refusal
    /// applies, docs/DESIGN.md §6).
    pub source: String,
    /// `None` when `source` is `none`.
    pub price: Option<PriceColumns>,
    /// An operator's price over a catalogue model: the catalogue's, which applies again when
    /// the operator's is removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalogue: Option<PriceColumns>,
}

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PriceColumns {
    pub input: f64,
    pub output: f64,
    pub cache_write: f64,
    pub cache_read: f64,
    /// USD per search unit (rerank).
    #[serde(default)]
    pub search_unit: f64,
}

impl From<Price> for PriceColumns {
    fn from(price: Price) -> Self {
        PriceColumns {
            input: price.input_per_mtok,
            output: price.output_per_mtok,
            cache_write: price.cache_write_per_mtok,
            cache_read: price.cache_read_per_mtok,
            search_unit: price.per_search_unit,
        }
    }
}

/// A listed price as its row.
pub fn price_row(listed: &ListedPrice) -> PriceRow {
    PriceRow {
        model: listed.model.clone(),
        source: listed.source.as_str().to_owned(),
        price: listed.price.map(PriceColumns::from),
        catalogue: listed.catalogue.map(PriceColumns::from),
    }
}

/// `prices`: `{"prices": [...], "catalogue_as_of": "YYYY-MM-DD"}`, ascending by model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PriceList {
    pub prices: Vec<PriceRow>,
    pub catalogue_as_of: String,
}

/// `set-price`, `remove-price`: the model's price after, `{"price": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PriceChanged {
    pub price: PriceRow,
}

/// A client key as operators see it (its hash never; the first characters of the key only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRow {
    pub id: i64,
    pub name: String,
    pub prefix: String,
    pub user: String,
    pub group: String,
    /// Per-user requests per minute; 0: no limit.
    pub user_rpm_limit: i32,
    /// `active`, `disabled` or `revoked`, as stored (an expired key keeps its status: see
    /// `expires_at_ms`).
    pub status: String,
    /// When the key stops working, ms since the epoch; `null`: never.
    pub expires_at_ms: Option<i64>,
    /// Glob patterns on the model a client asks for; empty: every model.
    pub allowed_models: Vec<String>,
    /// Endpoint names; empty: every endpoint.
    pub allowed_endpoints: Vec<String>,
    /// The key's own limits, counted by admission (0: none; absent from an older relay's
    /// answer: none).
    #[serde(default)]
    pub concurrency_limit: i32,
    /// Tokens per rolling minute.
    #[serde(default)]
    pub tpm_limit: i64,
    /// Spend budgets in USD: in total and per calendar day, week and month.
    #[serde(default)]
    pub budget_total_usd: f64,
    #[serde(default)]
    pub budget_day_usd: f64,
    #[serde(default)]
    pub budget_week_usd: f64,
    #[serde(default)]
    pub budget_month_usd: f64,
    /// The key's usage per period (`day`, `week`, `month`, `total`) of the deployment's budget
    /// calendar, the periods admission counts its budgets in; empty when the endpoint did not
    /// report it (an older one).
    #[serde(default)]
    pub usage: Vec<KeyUsageRow>,
}

/// One key's usage over one budget period, against the period's budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyUsageRow {
    /// `day`, `week`, `month` or `total`.
    pub period: String,
    /// When the period began (local midnight in the deployment's time zone), ms since the
    /// epoch; `total`: 0.
    pub from_ms: i64,
    pub requests: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    /// The period's spend, USD: what its budget has counted.
    pub cost_usd: f64,
    /// The budget less the spend, at least 0; `null`: no budget for the period.
    pub remaining_usd: Option<f64>,
}

impl KeyRow {
    /// The key's budget for `period` (`day`, `week`, `month`, `total`), USD; 0: none.
    pub fn budget_usd(&self, period: &str) -> f64 {
        match period {
            "total" => self.budget_total_usd,
            "day" => self.budget_day_usd,
            "week" => self.budget_week_usd,
            "month" => self.budget_month_usd,
            _ => 0.0,
        }
    }

    /// The key's usage over `period`, when the endpoint reported it.
    pub fn usage_in(&self, period: &str) -> Option<&KeyUsageRow> {
        self.usage.iter().find(|usage| usage.period == period)
    }
}

/// The row of a key with its usage per period (`usage`, as `Selector::key_usage` answers it;
/// empty: not known), the one place both endpoints build it (the selector's answer read back
/// into a record in the CLI, the engine's record in the standalone relay).
pub fn key_row(record: &ApiKeyRecord, usage: &[(UsagePeriod, i64, PeriodUsage)]) -> KeyRow {
    let mut row = KeyRow {
        id: record.id,
        name: record.name.clone(),
        prefix: record.prefix.clone(),
        user: record.user.clone(),
        group: record.group.clone(),
        user_rpm_limit: record.user_rpm_limit,
        status: key_status(record).to_owned(),
        expires_at_ms: record.access.expires_at_ms,
        allowed_models: record.access.allowed_models.clone(),
        allowed_endpoints: endpoint_names(&record.access.allowed_endpoints),
        concurrency_limit: record.limits.concurrency_limit.max(0),
        tpm_limit: record.limits.tpm_limit.max(0),
        budget_total_usd: micros_to_usd(record.limits.budget_total_micros.max(0)),
        budget_day_usd: micros_to_usd(record.limits.budget_day_micros.max(0)),
        budget_week_usd: micros_to_usd(record.limits.budget_week_micros.max(0)),
        budget_month_usd: micros_to_usd(record.limits.budget_month_micros.max(0)),
        usage: Vec::new(),
    };
    row.usage = usage
        .iter()
        .map(|(period, from_ms, usage)| {
            let budget = row.budget_usd(period.as_str());
            KeyUsageRow {
                period: period.as_str().to_owned(),
                from_ms: *from_ms,
                requests: usage.requests,
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cost_usd: usage.cost_usd,
                remaining_usd: (budget > 0.0).then(|| (budget - usage.cost_usd).max(0.0)),
            }
        })
        .collect();
    row
}

/// `keys`: `{"keys": [...]}`, ascending by id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyList {
    pub keys: Vec<KeyRow>,
}

/// `disable-key`, `enable-key`: the key as it is now, `{"key": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyChanged {
    pub key: KeyRow,
}

/// `accounts`: `{"accounts": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccountList {
    pub accounts: Vec<AccountRow>,
}

/// `blocks`: `{"blocks": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockList {
    pub blocks: Vec<BlockRow>,
}

/// `windows`: `{"windows": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowList {
    pub windows: Vec<WindowRow>,
}

/// `restore`: the account as it is now, `{"account": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Restored {
    pub account: AccountRow,
}

/// `clear-block`: `{"cleared": <account id>}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cleared {
    pub cleared: i64,
}

/// `usage`: every client key's usage (or one key's) between two instants, ms since the epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageReport {
    pub from_ms: i64,
    pub to_ms: i64,
    pub keys: Vec<UsageRow>,
}

/// `status`: the pool at a glance, `{"status": {...}}` ([`StatusAnswer`]): every account's live
/// state, load and usage windows, and admission's state, read at `generated_at_ms`. The one view
/// the operator CLI's `status` and the status page show.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusView {
    /// When the answering side read it, ms since the epoch (its clock).
    pub generated_at_ms: i64,
    /// Admission's Redis failure policy: `open`, `divided`, `closed`, `memory` (standalone: the
    /// in-process lease engine, no Redis), or `unknown` (no admission replica reported it
    /// recently, or the replicas disagree; see `admission_replicas`).
    pub failure_policy: String,
    /// Admission as a whole: `ok` (every replica that reported recently serves from Redis),
    /// `degraded` (at least one serves from its fallback), or `unknown` (none reported recently,
    /// or the registry could not be read).
    pub admission: String,
    /// Each admission replica the registry lists, by id; empty when not known (standalone, or the
    /// registry could not be read).
    #[serde(default)]
    pub admission_replicas: Vec<ReplicaRow>,
    /// Every account, ascending by id.
    pub accounts: Vec<AccountStatusRow>,
}

/// One admission replica as it last reported itself in the replica registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaRow {
    /// The replica's registry id.
    pub id: String,
    /// `ok`, `degraded`, or `unknown` (its last report is stale, or it is a replica that does not
    /// report its state).
    pub state: String,
    /// Its failure policy (`open`, `divided`, `closed`), or `unknown` when it did not say.
    pub failure_policy: String,
    /// How long ago it last reported, ms; `null` when not known.
    pub report_age_ms: Option<u64>,
}

/// One account on the status view: who it is, its live state, its load against its limits, its
/// usage windows and its block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccountStatusRow {
    pub id: i64,
    pub name: String,
    pub group: String,
    /// `anthropic` or `openai`.
    pub platform: String,
    /// Never more than the credential's last four characters ([`AccountRow::credential_masked`]).
    pub credential_masked: String,
    /// The one live state, most severe first: `retired`, `error`, `disabled` (stored), then
    /// `confirming` (a probe is checking a suspicious answer), `hard_blocked`, `breaker_open`,
    /// `soft_blocked`, else `active`.
    pub status: String,
    /// The stored status's reason (set for `retired`, `error`, `disabled`), else empty.
    pub status_reason: String,
    /// Live leases; `null` when unknown (the store could not be read).
    pub leases: Option<u32>,
    /// Requests in flight at once; 0: no limit.
    pub concurrency_limit: i32,
    /// Requests admitted in the current minute; `null` when unknown or not counted (no RPM limit).
    pub rpm_used: Option<u32>,
    /// Requests per minute; 0: no limit.
    pub rpm_limit: i32,
    /// Spend in the current session window, USD; `null` when unknown or not counted (no limit).
    pub session_spend_usd: Option<f64>,
    /// Spend per session window, USD; 0: no limit.
    pub session_window_limit_usd: f64,
    /// The account's usage windows, as `windows` shows them (utilization, reset, reading age).
    pub windows: Vec<WindowRow>,
    /// The block in force, `hard`'s over the breaker's over `soft`'s, as `<kind> <class>[
    /// <upstream status>]: <reason>` (what `blocks` shows of it); empty when none.
    pub block_reason: String,
    /// Time left on that block, ms; 0 when none (or a half-open breaker waiting for its probe).
    pub block_left_ms: u64,
    /// `api_key`, `oauth` or `chatgpt_oauth`; empty when the endpoint did not say.
    #[serde(default)]
    pub credential_kind: String,
    /// Who the upstream says it is; empty: not known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub email: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub plan: String,
    /// OAuth: the access token's expiry (ms since the epoch; 0: unknown) and whether a refresh
    /// token keeps it alive; the page warns ahead of an expiry nothing will refresh.
    #[serde(default)]
    pub token_expires_at_ms: i64,
    #[serde(default)]
    pub refreshable: bool,
    /// What it serves (`chat`, `embeddings`, `rerank`): its own list, or what its platform and
    /// credential serve when it names none; empty: not said (an older selector).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serves: Vec<String>,
}

/// `status`: `{"status": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusAnswer {
    pub status: StatusView,
}

/// The status view of a report: the one place both endpoints build it (the selector's
/// `ReadStatus` answer in the CLI, the engine's report in the standalone relay), so both show the
/// same. Window rows as [`window_rows`] builds them, read at the report's clock.
pub fn status_view(report: &StatusReport) -> StatusView {
    let admission = &report.admission;
    StatusView {
        generated_at_ms: report.now_ms,
        failure_policy: policy_name(admission.policy).to_owned(),
        admission: admission.state.as_str().to_owned(),
        admission_replicas: admission
            .replicas
            .iter()
            .map(|replica| ReplicaRow {
                id: replica.id.clone(),
                state: replica.state.as_str().to_owned(),
                failure_policy: policy_name(replica.policy).to_owned(),
                report_age_ms: replica.report_age_ms,
            })
            .collect(),
        accounts: report
            .accounts
            .iter()
            .map(|account| account_status_row(report.now_ms, account))
            .collect(),
    }
}

fn policy_name(policy: Option<AdmissionPolicy>) -> &'static str {
    policy.map_or("unknown", AdmissionPolicy::as_str)
}

fn account_status_row(now_ms: i64, account: &AccountStanding) -> AccountStatusRow {
    let (block_reason, block_left_ms) = match &account.block {
        Some(block) => (block_reason(block), block.remaining_ms),
        None => (String::new(), 0),
    };
    AccountStatusRow {
        id: account.id,
        name: account.name.clone(),
        group: account.group.clone(),
        platform: account.platform.as_str().to_owned(),
        credential_masked: account.credential_masked.clone(),
        status: account.status.label().to_owned(),
        status_reason: account.status_reason.clone(),
        leases: account.leases,
        concurrency_limit: account.concurrency_limit,
        rpm_used: account.rpm_used,
        rpm_limit: account.rpm_limit,
        session_spend_usd: account.session_spend_usd,
        session_window_limit_usd: account.session_window_limit_usd,
        windows: window_rows(
            now_ms,
            [(
                account.id,
                account.name.as_str(),
                account.windows.as_slice(),
            )],
        ),
        block_reason,
        block_left_ms,
        credential_kind: account
            .kind
            .map(|kind| kind.as_str().to_owned())
            .unwrap_or_default(),
        email: account.email.clone(),
        plan: account.plan.clone(),
        token_expires_at_ms: account.token_expires_at_ms,
        refreshable: account.refreshable,
        serves: account
            .serves
            .iter()
            .map(|service| service.as_str().to_owned())
            .collect(),
    }
}

/// `<kind> <class>[ <status>]: <reason>` (`hard quota_gone 402: credit balance too low`).
fn block_reason(block: &BlockNote) -> String {
    let mut text = format!("{} {}", block.kind.as_str(), block.class);
    if block.status > 0 {
        text.push_str(&format!(" {}", block.status));
    }
    if !block.reason.is_empty() {
        text.push_str(&format!(": {}", block.reason));
    }
    text
}

/// An error answer: `{"error": {"type": ..., "message": ...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// `authentication_error`, `not_found`, `invalid_request` or `unavailable`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

impl ErrorBody {
    pub fn new(kind: &str, message: impl std::fmt::Display) -> Self {
        ErrorBody {
            error: ErrorDetail {
                kind: kind.to_owned(),
                message: message.to_string(),
            },
        }
    }
}
