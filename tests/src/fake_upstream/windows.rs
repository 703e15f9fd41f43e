//! Usage windows per credential, opt-in: a 5-hour-like and a weekly-like budget (counted in
//! requests or in tokens) and a per-minute request limit, reported on every model answer in the
//! headers the real upstreams send and enforced with their 429s. A credential without budgets
//! gets none of it: no headers, no refusals.
//!
//! The fake's choices, stated once:
//! - **When a window runs.** The 5-hour-like window starts at the first model request after it
//!   was set (or after its last period ended) and resets `length` later, fixed from that first
//!   use. The weekly-like window does the same, unless `weekly_anchor` is set: then its periods
//!   follow a fixed schedule, `anchor + k·length` (as a plan's weekly reset does). The
//!   per-minute limit runs like the 5-hour one.
//! - **What counts.** The answers the fake serves (a 200 head: normal, delayed, streamed, cut
//!   short): 1 each in [`WindowUnit::Requests`], the normal answer's input + output tokens in
//!   [`WindowUnit::Tokens`] (`bodies::INPUT_TOKENS + OUTPUT_TOKENS`). Error answers (scripted
//!   or the account's refusals) count nothing. The per-minute limit counts every request it
//!   does not refuse.
//! - **When it refuses.** A request is refused once any window's usage has reached its capacity
//!   (while under it, a request is served: a token budget can overshoot by one answer, as
//!   upstream). The refusing window is the exhausted one that resets last.
//! - **Statuses.** Per window `allowed` below [`WARNING_AT`] (80 %) of its capacity,
//!   `allowed_warning` from there (utilization after this answer), `rejected` only on a refusal;
//!   the overall status is the worst, the representative claim the binding window (the refusing
//!   one, else the most used; ties go to the 5-hour).
//! - **Precedence.** Scripted answers win over windows (the test asked for them; their own
//!   headers win over these) and are not refused; an account's own refusals (revoked,
//!   Claude-Code-only) come before the windows, billing and unknown model after.
//! - **Dialects.** Anthropic Messages: `anthropic-ratelimit-unified-*` and
//!   `anthropic-ratelimit-requests-*`. OpenAI chat, Responses and the ChatGPT backend:
//!   `x-codex-{primary,secondary}-*` and `x-ratelimit-*-requests` (the platform API has no such
//!   windows, so the fake speaks the ChatGPT backend's dialect there too).
//! - **Model-scoped limits** (`WindowBudgets::models`, opt-in): a weekly-like budget of one
//!   model family, counted by the answers served for the models it covers (the upstream model's
//!   name, lowercased, contains the family's token), besides the account's windows. A request
//!   for a covered model on a used-up one gets the upstream's model-scoped 429, after the
//!   account's own refusal and before the per-minute one; every other model is served as
//!   before. As the sources show them (/tmp notes folded into docs/SUBSCRIPTIONS.md):
//!   Anthropic answers `anthropic-ratelimit-unified-status: rejected` with the scoped
//!   `-representative-claim` (`seven_day_opus`, `seven_day_sonnet`,
//!   `seven_day_overage_included`) and the scoped `-reset`, the account's own 5h/7d families as
//!   they stand (`allowed`); only the Fable bucket has a family of its own
//!   (`anthropic-ratelimit-unified-7d_oi-{utilization,reset,status}`), sent on Fable answers.
//!   Codex answers the named family `x-codex-<header>-primary-*` at 100 % with its
//!   `x-codex-<header>-limit-name`, `x-codex-active-limit: codex_<header>` and the
//!   `usage_limit_reached` body; the family is sent on the covered models' answers.
//! - **Rounding.** Resets are rounded up to whole seconds (no client that waits for one comes
//!   back early); `window-minutes` is rounded up, at least 1.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::response::Response;
use serde_json::{Value, json};

use super::FakeState;
use super::bodies::{INPUT_TOKENS, OUTPUT_TOKENS};

/// From this fraction of any window's capacity an answer says `allowed_warning`.
pub const WARNING_AT: f64 = 0.8;

/// What a window's capacity counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WindowUnit {
    /// Answers served.
    #[default]
    Requests,
    /// Input + output tokens of the answers served.
    Tokens,
}

/// One window: how long it runs and how much it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub length: Duration,
    pub capacity: u64,
}

impl Window {
    pub fn new(length: Duration, capacity: u64) -> Self {
        Window { length, capacity }
    }
}

/// A model family with a limit of its own, named as the upstream names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelFamily {
    /// Anthropic's weekly Opus limit: claim `seven_day_opus`, no header family of its own.
    Opus,
    /// Anthropic's weekly Sonnet limit: claim `seven_day_sonnet`.
    Sonnet,
    /// Anthropic's `7d_oi` bucket (claim `seven_day_overage_included`): the Fable models.
    Fable,
    /// A Codex named limit: headers `x-codex-<header>-*` (`bengalfox`), limit id
    /// `codex_<header>`, covering the models whose name contains `name` lowercased
    /// (`GPT-5.3-Codex-Spark` covers `gpt-5.3-codex-spark`).
    Codex { header: String, name: String },
}

impl ModelFamily {
    fn token(&self) -> String {
        match self {
            ModelFamily::Opus => "opus".into(),
            ModelFamily::Sonnet => "sonnet".into(),
            ModelFamily::Fable => "fable".into(),
            ModelFamily::Codex { name, .. } => name.to_ascii_lowercase().replace(' ', "-"),
        }
    }

    fn dialect(&self) -> Dialect {
        match self {
            ModelFamily::Codex { .. } => Dialect::Codex,
            _ => Dialect::Anthropic,
        }
    }

    fn covers(&self, dialect: Dialect, model: &str) -> bool {
        self.dialect() == dialect && model.to_ascii_lowercase().contains(&self.token())
    }
}

/// A model family's own weekly-like limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelWindow {
    pub family: ModelFamily,
    pub window: Window,
}

/// A credential's usage windows (see the module's documentation for how they run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowBudgets {
    /// What `five_hour` and `weekly` count.
    pub unit: WindowUnit,
    /// Anthropic `5h`, Codex `primary`.
    pub five_hour: Option<Window>,
    /// Anthropic `7d`, Codex `secondary`.
    pub weekly: Option<Window>,
    /// The weekly window's fixed schedule (periods start at `anchor + k·length`); `None`: from
    /// first use.
    pub weekly_anchor: Option<SystemTime>,
    /// An API key's per-minute request limit (`capacity` requests per `length`, normally 60 s).
    pub per_minute: Option<Window>,
    /// Model-scoped limits, each counting only the answers for the models it covers.
    pub models: Vec<ModelWindow>,
}

impl WindowBudgets {
    pub(super) fn is_empty(&self) -> bool {
        self.five_hour.is_none()
            && self.weekly.is_none()
            && self.per_minute.is_none()
            && self.models.is_empty()
    }
}

/// Which upstream's headers and refusals an answer speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    Anthropic,
    Codex,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    FiveHour,
    Weekly,
}

#[derive(Debug, Clone, Copy)]
struct Period {
    start_ms: i64,
    used: u64,
}

/// One credential's budgets and where it stands in each window.
#[derive(Debug, Default)]
pub(super) struct Account {
    budgets: WindowBudgets,
    five_hour: Option<Period>,
    weekly: Option<Period>,
    minute: Option<Period>,
    /// One per `budgets.models`, in order.
    models: Vec<Option<Period>>,
}

/// Where one window stands, for the headers.
struct Standing {
    kind: Kind,
    utilization: f64,
    reset_ms: i64,
    length_ms: i64,
    exhausted: bool,
}

/// Where one model-scoped limit stands, for the headers.
struct ModelStanding {
    index: usize,
    family: ModelFamily,
    utilization: f64,
    reset_ms: i64,
    length_ms: i64,
    exhausted: bool,
}

/// What the windows say about one request: the headers its answer carries, and the refusal
/// (status, body) when it may not be served.
pub(super) struct Verdict {
    pub headers: Vec<(String, String)>,
    pub refusal: Option<(u16, Value)>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn length_ms(window: &Window) -> i64 {
    i64::try_from(window.length.as_millis())
        .unwrap_or(i64::MAX / 4)
        .clamp(1, i64::MAX / 4)
}

/// Ms since the epoch rounded up to whole seconds.
fn ceil_seconds(ms: i64) -> i64 {
    ms.div_euclid(1000) + i64::from(ms.rem_euclid(1000) > 0)
}

/// Starts a period when none runs (or the last one ended), or moves to the anchored schedule's
/// current one; usage starts again at nothing.
fn roll(period: &mut Option<Period>, length: i64, anchor_ms: Option<i64>, now: i64) {
    let start = match (anchor_ms, *period) {
        (Some(anchor), _) => {
            anchor.saturating_add(now.saturating_sub(anchor).div_euclid(length) * length)
        }
        (None, Some(p)) if now < p.start_ms.saturating_add(length) => return,
        (None, _) => now,
    };
    if period.is_none_or(|p| p.start_ms != start) {
        *period = Some(Period {
            start_ms: start,
            used: 0,
        });
    }
}

impl Account {
    fn roll(&mut self, now: i64) {
        let anchor_ms = self.budgets.weekly_anchor.map(|at| {
            at.duration_since(UNIX_EPOCH)
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4))
                .unwrap_or(0)
        });
        if let Some(window) = &self.budgets.five_hour {
            roll(&mut self.five_hour, length_ms(window), None, now);
        }
        if let Some(window) = &self.budgets.weekly {
            roll(&mut self.weekly, length_ms(window), anchor_ms, now);
        }
        if let Some(window) = &self.budgets.per_minute {
            roll(&mut self.minute, length_ms(window), None, now);
        }
        self.models.resize(self.budgets.models.len(), None);
        for (limit, period) in self.budgets.models.iter().zip(&mut self.models) {
            roll(period, length_ms(&limit.window), None, now);
        }
    }

    /// Where each model-scoped limit covering `model` stands: (its index, utilization, reset,
    /// length, used up).
    fn model_standings(&self, dialect: Dialect, model: &str) -> Vec<ModelStanding> {
        self.budgets
            .models
            .iter()
            .zip(&self.models)
            .enumerate()
            .filter(|(_, (limit, _))| limit.family.covers(dialect, model))
            .filter_map(|(index, (limit, period))| {
                let period = (*period)?;
                let exhausted = period.used >= limit.window.capacity;
                Some(ModelStanding {
                    index,
                    family: limit.family.clone(),
                    utilization: if exhausted {
                        1.0
                    } else {
                        period.used as f64 / limit.window.capacity as f64
                    },
                    reset_ms: period.start_ms.saturating_add(length_ms(&limit.window)),
                    length_ms: length_ms(&limit.window),
                    exhausted,
                })
            })
            .collect()
    }

    fn standings(&self) -> Vec<Standing> {
        [
            (Kind::FiveHour, self.budgets.five_hour, self.five_hour),
            (Kind::Weekly, self.budgets.weekly, self.weekly),
        ]
        .into_iter()
        .filter_map(|(kind, window, period)| {
            let (window, period) = (window?, period?);
            let exhausted = period.used >= window.capacity;
            let utilization = if exhausted {
                1.0
            } else {
                period.used as f64 / window.capacity as f64
            };
            Some(Standing {
                kind,
                utilization,
                reset_ms: period.start_ms.saturating_add(length_ms(&window)),
                length_ms: length_ms(&window),
                exhausted,
            })
        })
        .collect()
    }

    /// The per-minute limit and its running period, when it has one.
    fn minute(&self) -> Option<(Window, Period)> {
        Some((self.budgets.per_minute?, self.minute?))
    }

    fn charge(&mut self, serves: bool, covering: &[usize]) {
        if let Some(minute) = &mut self.minute {
            minute.used = minute.used.saturating_add(1);
        }
        if !serves {
            return;
        }
        let cost = match self.budgets.unit {
            WindowUnit::Requests => 1,
            WindowUnit::Tokens => INPUT_TOKENS + OUTPUT_TOKENS,
        };
        let models = self
            .models
            .iter_mut()
            .enumerate()
            .filter(|(index, _)| covering.contains(index))
            .map(|(_, period)| period);
        for period in [&mut self.five_hour, &mut self.weekly]
            .into_iter()
            .chain(models)
            .flatten()
        {
            period.used = period.used.saturating_add(cost);
        }
    }
}

/// Where one of a credential's windows stands now, as its usage endpoint shows it.
pub(super) struct Shown {
    /// The 5-hour-like window (else the weekly-like one).
    pub five_hour: bool,
    /// Percent used, 0–100.
    pub percent: f64,
    /// Its reset, ms since the epoch; `None` while no period runs (not used since its last
    /// reset), as the real endpoints show a window not started.
    pub reset_ms: Option<i64>,
    pub length_ms: i64,
}

/// `credential`'s windows as they stand now (`None`: it has none), read without starting a
/// period: what the usage endpoints show (`usage_api`).
pub(super) fn shown(state: &FakeState, credential: &str) -> Option<Vec<Shown>> {
    let accounts = state.windows.lock().unwrap_or_else(|p| p.into_inner());
    let account = accounts.get(credential)?;
    let now = now_ms();
    let windows = [
        (true, account.budgets.five_hour, account.five_hour),
        (false, account.budgets.weekly, account.weekly),
    ];
    Some(
        windows
            .into_iter()
            .filter_map(|(five_hour, window, period)| {
                let window = window?;
                let length = length_ms(&window);
                let running = period.filter(|p| now < p.start_ms.saturating_add(length));
                let used = running.map_or(0, |p| p.used);
                Some(Shown {
                    five_hour,
                    percent: (used.min(window.capacity) as f64 * 100.0
                        / window.capacity.max(1) as f64)
                        .min(100.0),
                    reset_ms: running.map(|p| ceil_seconds(p.start_ms + length) * 1000),
                    length_ms: length,
                })
            })
            .collect(),
    )
}

/// Gives `credential` these budgets, usage back to nothing; budgets with no window clear them.
pub(super) fn set(state: &FakeState, credential: &str, budgets: WindowBudgets) {
    let mut accounts = state.windows.lock().unwrap_or_else(|p| p.into_inner());
    if budgets.is_empty() {
        accounts.remove(credential);
    } else {
        accounts.insert(
            credential.to_owned(),
            Account {
                budgets,
                ..Account::default()
            },
        );
    }
}

/// Takes one model request with `credential` for upstream `model` through its windows: `None`
/// when it has none. `enforce`: the request may be refused (nothing scripted or refused it
/// first); `serves`: its answer is one the windows count. A refused request counts nowhere.
pub(super) fn admit(
    state: &FakeState,
    credential: &str,
    dialect: Dialect,
    model: &str,
    enforce: bool,
    serves: bool,
) -> Option<Verdict> {
    let now = now_ms();
    let mut accounts = state.windows.lock().unwrap_or_else(|p| p.into_inner());
    let account = accounts.get_mut(credential)?;
    account.roll(now);
    let standings = account.standings();
    let refusing = standings
        .iter()
        .filter(|s| s.exhausted)
        .max_by_key(|s| s.reset_ms)
        .map(|s| s.kind);
    if enforce && let Some(kind) = refusing {
        let mut headers = window_headers(dialect, &standings, Some(kind), now);
        headers.extend(minute_headers(dialect, account.minute(), now));
        let refusal = window_refusal(dialect, &standings, kind, now, &mut headers);
        return Some(Verdict {
            headers,
            refusal: Some(refusal),
        });
    }
    let models = account.model_standings(dialect, model);
    if enforce
        && let Some(limit) = models
            .iter()
            .filter(|m| m.exhausted)
            .max_by_key(|m| m.reset_ms)
    {
        let mut headers = window_headers(dialect, &standings, None, now);
        headers.extend(minute_headers(dialect, account.minute(), now));
        let refusal = model_refusal(dialect, limit, now, &mut headers);
        return Some(Verdict {
            headers,
            refusal: Some(refusal),
        });
    }
    if enforce
        && let Some((window, period)) = account.minute()
        && period.used >= window.capacity
    {
        let mut headers = window_headers(dialect, &standings, None, now);
        headers.extend(minute_headers(dialect, Some((window, period)), now));
        let refusal = minute_refusal(dialect, window, period, now, &mut headers);
        return Some(Verdict {
            headers,
            refusal: Some(refusal),
        });
    }
    let covering: Vec<usize> = models.iter().map(|m| m.index).collect();
    account.charge(serves, &covering);
    let mut headers = window_headers(dialect, &account.standings(), None, now);
    headers.extend(minute_headers(dialect, account.minute(), now));
    for limit in account.model_standings(dialect, model) {
        headers.extend(model_headers(&limit, None, now));
    }
    Some(Verdict {
        headers,
        refusal: None,
    })
}

/// Adds the windows' headers to an answer, leaving any it already has (a scripted answer's).
pub(super) fn stamp(mut response: Response, headers: &[(String, String)]) -> Response {
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) && !response.headers().contains_key(&name)
        {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// A number as upstream prints it: at most 4 decimals, no trailing zeros.
fn decimal(value: f64) -> String {
    let text = format!("{value:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text.is_empty() || text == "-" {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}

fn status_of(standing: &Standing, rejected: Option<Kind>) -> &'static str {
    if rejected == Some(standing.kind) {
        "rejected"
    } else if standing.utilization >= WARNING_AT {
        "allowed_warning"
    } else {
        "allowed"
    }
}

/// The binding window: the refusing one, else the most used (ties to the 5-hour, listed first).
fn binding(standings: &[Standing], rejected: Option<Kind>) -> Option<&Standing> {
    if let Some(kind) = rejected {
        return standings.iter().find(|s| s.kind == kind);
    }
    standings.iter().reduce(|best, s| {
        if s.utilization > best.utilization {
            s
        } else {
            best
        }
    })
}

fn window_headers(
    dialect: Dialect,
    standings: &[Standing],
    rejected: Option<Kind>,
    now: i64,
) -> Vec<(String, String)> {
    let mut headers = Vec::new();
    let Some(bind) = binding(standings, rejected) else {
        return headers;
    };
    match dialect {
        Dialect::Anthropic => {
            for s in standings {
                let tag = match s.kind {
                    Kind::FiveHour => "5h",
                    Kind::Weekly => "7d",
                };
                let name = |field: &str| format!("anthropic-ratelimit-unified-{tag}-{field}");
                headers.push((name("utilization"), decimal(s.utilization)));
                headers.push((name("reset"), ceil_seconds(s.reset_ms).to_string()));
                headers.push((name("status"), status_of(s, rejected).to_owned()));
            }
            let overall = if rejected.is_some() {
                "rejected"
            } else if standings.iter().any(|s| s.utilization >= WARNING_AT) {
                "allowed_warning"
            } else {
                "allowed"
            };
            let claim = match bind.kind {
                Kind::FiveHour => "five_hour",
                Kind::Weekly => "seven_day",
            };
            headers.push(("anthropic-ratelimit-unified-status".into(), overall.into()));
            headers.push((
                "anthropic-ratelimit-unified-representative-claim".into(),
                claim.into(),
            ));
            headers.push((
                "anthropic-ratelimit-unified-reset".into(),
                ceil_seconds(bind.reset_ms).to_string(),
            ));
        }
        Dialect::Codex => {
            for s in standings {
                let side = match s.kind {
                    Kind::FiveHour => "primary",
                    Kind::Weekly => "secondary",
                };
                let name = |field: &str| format!("x-codex-{side}-{field}");
                let minutes = (s.length_ms + 59_999) / 60_000;
                headers.push((name("used-percent"), decimal(s.utilization * 100.0)));
                headers.push((name("window-minutes"), minutes.max(1).to_string()));
                headers.push((
                    name("reset-after-seconds"),
                    ceil_seconds(s.reset_ms - now).max(0).to_string(),
                ));
                headers.push((name("reset-at"), ceil_seconds(s.reset_ms).to_string()));
            }
        }
    }
    headers
}

/// A model-scoped limit's own header family, where the upstream has one: Anthropic's `7d_oi`
/// bucket and a Codex named limit (Opus and Sonnet have none: they show only as the claim of a
/// refusal). `rejected`: this answer is its refusal.
fn model_headers(limit: &ModelStanding, rejected: Option<()>, now: i64) -> Vec<(String, String)> {
    let status = if rejected.is_some() {
        "rejected"
    } else if limit.utilization >= WARNING_AT {
        "allowed_warning"
    } else {
        "allowed"
    };
    match &limit.family {
        ModelFamily::Opus | ModelFamily::Sonnet => Vec::new(),
        ModelFamily::Fable => {
            let name = |field: &str| format!("anthropic-ratelimit-unified-7d_oi-{field}");
            vec![
                (name("utilization"), decimal(limit.utilization)),
                (name("reset"), ceil_seconds(limit.reset_ms).to_string()),
                (name("status"), status.to_owned()),
            ]
        }
        ModelFamily::Codex { header, name } => {
            let field = |suffix: &str| format!("x-codex-{header}-primary-{suffix}");
            let minutes = (limit.length_ms + 59_999) / 60_000;
            vec![
                (field("used-percent"), decimal(limit.utilization * 100.0)),
                (field("window-minutes"), minutes.max(1).to_string()),
                (
                    field("reset-after-seconds"),
                    ceil_seconds(limit.reset_ms - now).max(0).to_string(),
                ),
                (field("reset-at"), ceil_seconds(limit.reset_ms).to_string()),
                (format!("x-codex-{header}-limit-name"), name.clone()),
            ]
        }
    }
}

/// The upstream's 429 of a used-up model-scoped limit: the overall status and claim say the
/// scoped limit (replacing the account's), the account's own families stay as they stand.
fn model_refusal(
    dialect: Dialect,
    limit: &ModelStanding,
    now: i64,
    headers: &mut Vec<(String, String)>,
) -> (u16, Value) {
    let after = ceil_seconds(limit.reset_ms - now).max(1);
    let reset = ceil_seconds(limit.reset_ms).to_string();
    headers.retain(|(name, _)| {
        !matches!(
            name.as_str(),
            "anthropic-ratelimit-unified-status"
                | "anthropic-ratelimit-unified-representative-claim"
                | "anthropic-ratelimit-unified-reset"
        )
    });
    headers.extend(model_headers(limit, Some(()), now));
    match (dialect, &limit.family) {
        (Dialect::Codex, ModelFamily::Codex { header, .. }) => {
            headers.push(("x-codex-active-limit".into(), format!("codex_{header}")));
            (
                429,
                json!({"error": {"type": "usage_limit_reached", "message": "The usage limit has been reached", "plan_type": "pro", "resets_at": ceil_seconds(limit.reset_ms), "resets_in_seconds": after}}),
            )
        }
        (_, family) => {
            let claim = match family {
                ModelFamily::Opus => "seven_day_opus",
                ModelFamily::Sonnet => "seven_day_sonnet",
                _ => "seven_day_overage_included",
            };
            headers.push((
                "anthropic-ratelimit-unified-status".into(),
                "rejected".into(),
            ));
            headers.push((
                "anthropic-ratelimit-unified-representative-claim".into(),
                claim.into(),
            ));
            headers.push(("anthropic-ratelimit-unified-reset".into(), reset));
            headers.push(("retry-after".into(), after.to_string()));
            (
                429,
                json!({"type": "error", "error": {"type": "rate_limit_error", "message": "This request would exceed your account's rate limit. Please try again later."}}),
            )
        }
    }
}

fn minute_headers(
    dialect: Dialect,
    minute: Option<(Window, Period)>,
    now: i64,
) -> Vec<(String, String)> {
    let Some((window, period)) = minute else {
        return Vec::new();
    };
    let limit = window.capacity.to_string();
    let remaining = window.capacity.saturating_sub(period.used).to_string();
    let reset_ms = period.start_ms.saturating_add(length_ms(&window));
    match dialect {
        Dialect::Anthropic => vec![
            ("anthropic-ratelimit-requests-limit".into(), limit),
            ("anthropic-ratelimit-requests-remaining".into(), remaining),
            (
                "anthropic-ratelimit-requests-reset".into(),
                rfc3339(ceil_seconds(reset_ms)),
            ),
        ],
        Dialect::Codex => vec![
            ("x-ratelimit-limit-requests".into(), limit),
            ("x-ratelimit-remaining-requests".into(), remaining),
            (
                "x-ratelimit-reset-requests".into(),
                go_duration(reset_ms.saturating_sub(now).max(0)),
            ),
        ],
    }
}

/// The real 429 of an exhausted window; adds `retry-after` (Anthropic) to `headers`.
fn window_refusal(
    dialect: Dialect,
    standings: &[Standing],
    kind: Kind,
    now: i64,
    headers: &mut Vec<(String, String)>,
) -> (u16, Value) {
    let reset_ms = standings
        .iter()
        .find(|s| s.kind == kind)
        .map_or(now, |s| s.reset_ms);
    let after = ceil_seconds(reset_ms - now).max(1);
    match dialect {
        Dialect::Anthropic => {
            headers.push(("retry-after".into(), after.to_string()));
            (
                429,
                json!({"type": "error", "error": {"type": "rate_limit_error", "message": "This request would exceed your account's rate limit. Please try again later."}}),
            )
        }
        // The body the Codex CLI reads (`UsageErrorBody`: `type`, `plan_type`, `resets_at`),
        // with the `resets_in_seconds` the backend also sends.
        Dialect::Codex => (
            429,
            json!({"error": {"type": "usage_limit_reached", "message": "The usage limit has been reached", "plan_type": "plus", "resets_at": ceil_seconds(reset_ms), "resets_in_seconds": after}}),
        ),
    }
}

/// The real 429 of a per-minute request limit (no window says `rejected`: it is busy, not
/// exhausted); adds `retry-after` (Anthropic) to `headers`.
fn minute_refusal(
    dialect: Dialect,
    window: Window,
    period: Period,
    now: i64,
    headers: &mut Vec<(String, String)>,
) -> (u16, Value) {
    let reset_ms = period.start_ms.saturating_add(length_ms(&window));
    let capacity = window.capacity;
    match dialect {
        Dialect::Anthropic => {
            let after = ceil_seconds(reset_ms - now).max(1);
            headers.push(("retry-after".into(), after.to_string()));
            (
                429,
                json!({"type": "error", "error": {"type": "rate_limit_error", "message": format!("This request would exceed the rate limit for your organization of {capacity} requests per minute.")}}),
            )
        }
        Dialect::Codex => (
            429,
            json!({"error": {"message": format!("Rate limit reached for requests per min (RPM): Limit {capacity}, Used {}, Requested 1. Please try again in {}.", period.used, go_duration(reset_ms.saturating_sub(now).max(0))), "type": "requests", "param": null, "code": "rate_limit_exceeded"}}),
        ),
    }
}

/// Epoch seconds as RFC 3339 (UTC), as Anthropic prints its per-minute resets.
fn rfc3339(seconds: i64) -> String {
    let (days, of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Days to a civil date (H. Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3_600,
        of_day % 3_600 / 60,
        of_day % 60
    )
}

/// Ms as a Go duration, as OpenAI prints its resets: `20ms`, `1.5s`, `6m0s`.
fn go_duration(ms: i64) -> String {
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let (minutes, seconds) = (ms / 60_000, (ms % 60_000) as f64 / 1_000.0);
    if minutes > 0 {
        format!("{minutes}m{}s", decimal(seconds))
    } else {
        format!("{}s", decimal(seconds))
    }
}

/// The control API's JSON form (see [`FakeUpstream::start_on`](super::FakeUpstream::start_on));
/// the error names the field.
pub(super) fn parse_budgets(request: &Value) -> Result<WindowBudgets, String> {
    let unit = match request.get("unit").and_then(Value::as_str) {
        None | Some("requests") => WindowUnit::Requests,
        Some("tokens") => WindowUnit::Tokens,
        Some(_) => return Err("unit: requests or tokens".into()),
    };
    let window = |name: &str, default_seconds: Option<f64>| -> Result<Option<Window>, String> {
        let Some(fields) = request.get(name).filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let seconds = fields
            .get("seconds")
            .and_then(Value::as_f64)
            .or_else(|| {
                fields
                    .get("ms")
                    .and_then(Value::as_f64)
                    .map(|ms| ms / 1_000.0)
            })
            .or(default_seconds)
            .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e10)
            .ok_or_else(|| format!("{name}.seconds: a positive number"))?;
        let capacity = fields
            .get("capacity")
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("{name}.capacity: a whole number"))?;
        Ok(Some(Window::new(
            Duration::from_secs_f64(seconds),
            capacity,
        )))
    };
    let weekly_anchor = match request.pointer("/weekly/start") {
        None | Some(Value::Null) => None,
        Some(start) => Some(
            start
                .as_f64()
                .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e11)
                .map(|s| UNIX_EPOCH + Duration::from_secs_f64(s))
                .ok_or("weekly.start: epoch seconds")?,
        ),
    };
    let mut models = Vec::new();
    for (index, limit) in request
        .get("models")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let field = |name: &str| limit.get(name).and_then(Value::as_str).map(str::to_owned);
        let family = match field("family").as_deref() {
            Some("opus") => ModelFamily::Opus,
            Some("sonnet") => ModelFamily::Sonnet,
            Some("fable") => ModelFamily::Fable,
            Some("codex") => ModelFamily::Codex {
                header: field("header")
                    .filter(|h| !h.is_empty())
                    .ok_or_else(|| format!("models[{index}].header: the family's header name"))?,
                name: field("name")
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| format!("models[{index}].name: the limit's name"))?,
            },
            _ => {
                return Err(format!(
                    "models[{index}].family: opus, sonnet, fable or codex"
                ));
            }
        };
        let seconds = limit
            .get("seconds")
            .and_then(Value::as_f64)
            .unwrap_or(7.0 * 86_400.0);
        if !(seconds.is_finite() && seconds > 0.0 && seconds < 1e10) {
            return Err(format!("models[{index}].seconds: a positive number"));
        }
        let capacity = limit
            .get("capacity")
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("models[{index}].capacity: a whole number"))?;
        models.push(ModelWindow {
            family,
            window: Window::new(Duration::from_secs_f64(seconds), capacity),
        });
    }
    Ok(WindowBudgets {
        unit,
        five_hour: window("five_hour", None)?,
        weekly: window("weekly", None)?,
        weekly_anchor,
        per_minute: window("per_minute", Some(60.0))?,
        models,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resets_print_as_the_upstreams_print_them() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(go_duration(20), "20ms");
        assert_eq!(go_duration(1_500), "1.5s");
        assert_eq!(go_duration(360_000), "6m0s");
        assert_eq!(decimal(0.0), "0");
        assert_eq!(decimal(2.0 / 3.0), "0.6667");
        assert_eq!(ceil_seconds(1_001), 2);
        assert_eq!(ceil_seconds(1_000), 1);
    }

    #[test]
    fn an_anchored_weekly_window_follows_its_schedule_and_a_free_one_its_first_use() {
        let mut period = None;
        roll(&mut period, 1_000, Some(10_500), 12_700);
        assert_eq!(period.map(|p| p.start_ms), Some(12_500));
        roll(&mut period, 1_000, Some(10_500), 9_900);
        assert_eq!(period.map(|p| p.start_ms), Some(9_500), "before the anchor");
        let mut period = None;
        roll(&mut period, 1_000, None, 5_123);
        if let Some(p) = &mut period {
            p.used = 3;
        }
        roll(&mut period, 1_000, None, 6_000);
        assert_eq!(period.map(|p| (p.start_ms, p.used)), Some((5_123, 3)));
        roll(&mut period, 1_000, None, 6_123);
        assert_eq!(period.map(|p| (p.start_ms, p.used)), Some((6_123, 0)));
    }

    #[test]
    fn the_control_form_parses_and_names_a_bad_field() {
        let budgets = parse_budgets(&json!({"unit": "tokens", "five_hour": {"seconds": 2, "capacity": 3}, "weekly": {"ms": 1500, "capacity": 9, "start": 1_700_000_000}, "per_minute": {"capacity": 5}}))
            .expect("parses");
        assert_eq!(budgets.unit, WindowUnit::Tokens);
        assert_eq!(
            budgets.five_hour,
            Some(Window::new(Duration::from_secs(2), 3))
        );
        assert_eq!(
            budgets.weekly,
            Some(Window::new(Duration::from_millis(1_500), 9))
        );
        assert_eq!(
            budgets.weekly_anchor,
            Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(
            budgets.per_minute,
            Some(Window::new(Duration::from_secs(60), 5))
        );
        assert!(parse_budgets(&json!({})).expect("parses").is_empty());
        let error = parse_budgets(&json!({"five_hour": {"seconds": 2}})).expect_err("no capacity");
        assert!(error.starts_with("five_hour.capacity"), "{error}");
        let error = parse_budgets(&json!({"unit": "bytes"})).expect_err("bad unit");
        assert!(error.starts_with("unit"), "{error}");
    }
}
