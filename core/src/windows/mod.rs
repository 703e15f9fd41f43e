//! Usage windows (docs/DESIGN.md §5, "Spending what expires first"): what each upstream answer
//! says about an account's rolling limits (`headers`: reading them from an answer) and the
//! assessment selection orders by. Pure: the caller keeps the readings and passes the clock.

use std::collections::HashMap;

mod headers;
mod scoped;

pub use headers::read_windows;
pub use scoped::{RefusedBy, refused_by};

const MINUTE_MS: i64 = 60_000;
const HOUR_MS: i64 = 60 * MINUTE_MS;
const DAY_MS: i64 = 24 * HOUR_MS;

/// Which limit a reading is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum WindowKind {
    /// Anthropic's 5-hour window (`5h`, claim `five_hour`).
    FiveHour,
    /// Anthropic's 7-day window (`7d`, claim `seven_day`).
    SevenDay,
    /// "Seven day, overage included" (`7d_oi`, claim `seven_day_overage_included`): the weekly
    /// limit of the Fable models, scoped to them (docs/DESIGN.md §5, "Model-scoped limits").
    SevenDayOverageIncluded,
    /// A model-scoped weekly limit (claims `seven_day_opus`, `seven_day_sonnet`); the reading's
    /// scope names the models.
    SevenDayModel,
    /// Extra usage the account pays for past its plan (`overage`): never headroom.
    Overage,
    /// Codex's primary window (5 hours on today's plans); a named limit's reading is scoped to
    /// the models its limit name names.
    CodexPrimary,
    /// Codex's secondary window (weekly on today's plans).
    CodexSecondary,
    /// An API key's per-minute limit: feeds headroom only.
    PerMinute(MinuteLimit),
}

/// What a per-minute API-key limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum MinuteLimit {
    Requests,
    Tokens,
    InputTokens,
    OutputTokens,
}

impl WindowKind {
    /// A subscription's plan window: what "within plan" and "expiring capacity" are about.
    pub fn is_plan(self) -> bool {
        !matches!(self, WindowKind::Overage | WindowKind::PerMinute(_))
    }

    /// A stable name after the upstreams' own (`anthropic-ratelimit-unified-5h-*`, `7d_oi`):
    /// metric labels and the operator's `windows` view; scripts match them.
    pub fn label(self) -> &'static str {
        match self {
            WindowKind::FiveHour => "5h",
            WindowKind::SevenDay => "7d",
            WindowKind::SevenDayOverageIncluded => "7d_oi",
            WindowKind::SevenDayModel => "7d_model",
            WindowKind::Overage => "overage",
            WindowKind::CodexPrimary => "codex_primary",
            WindowKind::CodexSecondary => "codex_secondary",
            WindowKind::PerMinute(MinuteLimit::Requests) => "per_minute_requests",
            WindowKind::PerMinute(MinuteLimit::Tokens) => "per_minute_tokens",
            WindowKind::PerMinute(MinuteLimit::InputTokens) => "per_minute_input_tokens",
            WindowKind::PerMinute(MinuteLimit::OutputTokens) => "per_minute_output_tokens",
        }
    }

    /// The window's length when the upstream does not say it.
    fn default_length_ms(self) -> Option<i64> {
        match self {
            WindowKind::FiveHour => Some(5 * HOUR_MS),
            WindowKind::SevenDay
            | WindowKind::SevenDayOverageIncluded
            | WindowKind::SevenDayModel => Some(7 * DAY_MS),
            WindowKind::PerMinute(_) => Some(MINUTE_MS),
            WindowKind::Overage | WindowKind::CodexPrimary | WindowKind::CodexSecondary => None,
        }
    }
}

/// Whom a window limits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Scope {
    /// Every request the account serves.
    Account,
    /// Only upstream models whose name contains this lowercase token (`opus`, `sonnet`,
    /// `fable`, a Codex limit's name such as `gpt-5.3-codex-spark`), `_` read as `-`.
    Models(String),
}

impl Scope {
    /// Whether the window applies to `upstream_model` (the model after mapping).
    pub fn covers(&self, upstream_model: &str) -> bool {
        match self {
            Scope::Account => true,
            Scope::Models(token) => upstream_model
                .to_ascii_lowercase()
                .replace('_', "-")
                .contains(token.as_str()),
        }
    }
}

/// The upstream's own verdict on a window.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum WindowStatus {
    /// Not stated (Codex and per-minute limits state none), or a value we do not know.
    Unknown,
    Allowed,
    /// Past one of the upstream's warning thresholds: counts as above the shed threshold.
    AllowedWarning,
    Rejected,
}

impl WindowStatus {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "allowed" => Some(WindowStatus::Allowed),
            "allowed_warning" => Some(WindowStatus::AllowedWarning),
            "rejected" => Some(WindowStatus::Rejected),
            _ => None,
        }
    }
}

/// One window as one answer reported it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WindowReading {
    pub kind: WindowKind,
    pub scope: Scope,
    /// Share used, 0..=1 (an upstream figure past the cap reads as 1); `None` when the upstream
    /// stated only a status (a representative claim without its family).
    pub utilization: Option<f64>,
    /// When the window resets, ms since the epoch.
    pub reset_at_ms: i64,
    /// The window's length when stated (Codex `window-minutes`), else its kind's known length.
    pub length_ms: Option<i64>,
    pub status: WindowStatus,
    pub observed_at_ms: i64,
}

impl WindowReading {
    /// Share left, when known: a rejected window has none, whatever its figure says.
    fn left(&self) -> Option<f64> {
        if self.status == WindowStatus::Rejected {
            return Some(0.0);
        }
        self.utilization.map(|used| 1.0 - used)
    }

    fn full(&self) -> bool {
        self.left().is_some_and(|left| left <= 0.0)
    }

    fn fresh(&self, now_ms: i64) -> bool {
        self.reset_at_ms > now_ms && self.observed_at_ms <= now_ms
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Above this share of any plan window an account orders last for new sessions.
    pub shed: f64,
    /// Above this share sticky sessions move too.
    pub move_sessions: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            shed: 0.9,
            move_sessions: 0.97,
        }
    }
}

impl Thresholds {
    /// Checked thresholds: each a share in (0, 1], the shed threshold at most the move one. The
    /// error says which is wrong.
    pub fn new(shed: f64, move_sessions: f64) -> Result<Thresholds, &'static str> {
        let share = |value: f64| value.is_finite() && value > 0.0 && value <= 1.0;
        if !share(shed) {
            return Err("the shed threshold must be a share in (0, 1]");
        }
        if !share(move_sessions) {
            return Err("the move threshold must be a share in (0, 1]");
        }
        if shed > move_sessions {
            return Err("the shed threshold must not exceed the move threshold");
        }
        Ok(Thresholds {
            shed,
            move_sessions,
        })
    }

    /// These thresholds with a group's own values where it sets them. A group that raises only
    /// its shed threshold past the deployment's move threshold moves sessions at its shed one.
    pub fn overridden(self, shed: Option<f64>, move_sessions: Option<f64>) -> Thresholds {
        let shed = shed.unwrap_or(self.shed);
        Thresholds {
            shed,
            move_sessions: move_sessions.unwrap_or(self.move_sessions).max(shed),
        }
    }
}

/// How far shedding goes for an account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Shed {
    None,
    /// Last for new sessions; its sticky sessions stay.
    NewSessions,
    /// Last for every session: sticky sessions move.
    AllSessions,
}

/// A model-scoped window that is full: the account serves no model it covers until `until_ms`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelBlock {
    pub scope: Scope,
    pub until_ms: i64,
}

/// Where an account stands across its windows at one instant: what selection orders by.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    /// Some window of the account's was read since its last reset; otherwise nothing below
    /// says "empty" or "full": the account is unknown.
    pub known: bool,
    /// Least share left across the account-wide windows (plan and per-minute; overage is not
    /// headroom); `None` when unknown.
    pub headroom: Option<f64>,
    /// The window with least left.
    pub binding: Option<WindowKind>,
    /// Share of the account's longest plan window that would expire at an even pace before its
    /// reset: `max(0, left − time to reset / length)`. Only plan windows feed it.
    pub expiring: f64,
    /// `left / (time to reset / length)` of that window: above 1, capacity is expiring; the
    /// higher, the sooner it must be spent.
    pub urgency: f64,
    /// A plan window is used up and the account bills extra to keep serving.
    pub in_overage: bool,
    pub shed: Shed,
    /// A plan window is used up and nothing pays for more: until its reset.
    pub exhausted_until_ms: Option<i64>,
    pub model_blocks: Vec<ModelBlock>,
}

impl Assessment {
    /// An account nothing is known of.
    pub const UNKNOWN: Assessment = Assessment {
        known: false,
        headroom: None,
        binding: None,
        expiring: 0.0,
        urgency: 0.0,
        in_overage: false,
        shed: Shed::None,
        exhausted_until_ms: None,
        model_blocks: Vec::new(),
    };

    /// Whether a model-scoped window keeps the account from serving `upstream_model` (after
    /// mapping), and until when (the latest covering reset).
    pub fn blocked_for_model(&self, upstream_model: &str) -> Option<i64> {
        self.model_blocks
            .iter()
            .filter(|block| block.scope.covers(upstream_model))
            .map(|block| block.until_ms)
            .max()
    }
}

/// Whether `reading` should replace `kept`, a reading of the same window (kind and scope).
///
/// Answers arrive out of order: a long generation's 200 lands after later requests' answers, and
/// its headers describe the window as it stood when the upstream counted it. Within one period a
/// plan window's use only grows, so for plan windows and overage the reading of the later period
/// wins (its reset later by more than a tolerance: a tenth of the window, at most a minute, for
/// resets computed from `reset-after` seconds), and within the same period the one further along
/// (status, then utilization), whichever arrived last. A per-minute API-key limit refills
/// continuously: its reading observed last wins.
pub fn supersedes(reading: &WindowReading, kept: &WindowReading) -> bool {
    let observed_later = reading.observed_at_ms >= kept.observed_at_ms;
    if matches!(reading.kind, WindowKind::PerMinute(_)) {
        return observed_later;
    }
    let tolerance = reading
        .length_ms
        .or(reading.kind.default_length_ms())
        .map_or(MINUTE_MS, |length| (length / 10).clamp(0, MINUTE_MS));
    if reading.reset_at_ms > kept.reset_at_ms + tolerance {
        return true;
    }
    if reading.reset_at_ms + tolerance < kept.reset_at_ms {
        return false;
    }
    let progress = |r: &WindowReading| (r.status, r.utilization.unwrap_or(-1.0));
    let (new, old) = (progress(reading), progress(kept));
    match new.0.cmp(&old.0) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal if new.1 != old.1 => new.1 > old.1,
        std::cmp::Ordering::Equal => observed_later,
    }
}

/// Merges one answer's readings into those kept for an account: per window, [`supersedes`].
pub fn merge_readings(kept: &mut Vec<WindowReading>, incoming: &[WindowReading]) {
    for reading in incoming {
        match kept
            .iter_mut()
            .find(|k| k.kind == reading.kind && k.scope == reading.scope)
        {
            Some(slot) if supersedes(reading, slot) => *slot = reading.clone(),
            Some(_) => {}
            None => kept.push(reading.clone()),
        }
    }
}

/// The reading that stands per window (`supersedes`): a store may hold older ones next to newer.
fn newest(readings: &[WindowReading]) -> Vec<&WindowReading> {
    let mut by_window: HashMap<(WindowKind, &Scope), &WindowReading> = HashMap::new();
    for reading in readings {
        let slot = by_window
            .entry((reading.kind, &reading.scope))
            .or_insert(reading);
        if supersedes(reading, slot) {
            *slot = reading;
        }
    }
    by_window.into_values().collect()
}

/// The share left in each account-wide window of one account's readings at `now_ms`: the
/// newest reading per window, only those read since their last reset and stating a utilization
/// (what the selector's headroom gauges sum per group).
pub fn left_by_window(readings: &[WindowReading], now_ms: i64) -> Vec<(WindowKind, f64)> {
    newest(readings)
        .into_iter()
        .filter(|r| r.fresh(now_ms) && r.scope == Scope::Account)
        .filter_map(|r| {
            r.utilization
                .map(|used| (r.kind, (1.0 - used).clamp(0.0, 1.0)))
        })
        .collect()
}

/// An account's readings at `now_ms`. A window whose reset has passed reads as empty; readings
/// that are all past their reset (or none at all) make the account unknown.
pub fn assess(readings: &[WindowReading], now_ms: i64, thresholds: Thresholds) -> Assessment {
    let newest = newest(readings);
    let fresh: Vec<&WindowReading> = newest.into_iter().filter(|r| r.fresh(now_ms)).collect();
    let mut assessment = Assessment::UNKNOWN;
    assessment.model_blocks = fresh
        .iter()
        .filter(|r| matches!(r.scope, Scope::Models(_)) && r.full())
        .map(|r| ModelBlock {
            scope: r.scope.clone(),
            until_ms: r.reset_at_ms,
        })
        .collect();
    let account: Vec<&WindowReading> = fresh
        .into_iter()
        .filter(|r| r.scope == Scope::Account)
        .collect();
    if account.is_empty() {
        return assessment;
    }
    assessment.known = true;

    let plan: Vec<&WindowReading> = account
        .iter()
        .copied()
        .filter(|r| r.kind.is_plan())
        .collect();
    let exhausted: Vec<&WindowReading> = plan.iter().copied().filter(|r| r.full()).collect();
    let overage_pays = account.iter().any(|r| {
        r.kind == WindowKind::Overage
            && matches!(
                r.status,
                WindowStatus::Allowed | WindowStatus::AllowedWarning
            )
            && !r.full()
    });
    if !exhausted.is_empty() {
        if overage_pays {
            assessment.in_overage = true;
        } else {
            assessment.exhausted_until_ms = exhausted.iter().map(|r| r.reset_at_ms).max();
        }
    }

    // Headroom: the binding window, overage excluded (it is money, not plan).
    let mut headroom = 1.0;
    for reading in account.iter().filter(|r| r.kind != WindowKind::Overage) {
        if let Some(left) = reading.left()
            && (assessment.binding.is_none() || left < headroom)
        {
            headroom = left.clamp(0.0, 1.0);
            assessment.binding = Some(reading.kind);
        }
    }
    assessment.headroom = Some(headroom);

    // Expiring capacity: the longest plan window only. A shorter window's leftover comes back
    // within hours; spending it ahead of the weekly reset would only borrow from the week.
    let length = |r: &WindowReading| r.length_ms.or_else(|| r.kind.default_length_ms());
    let longest = plan.iter().filter_map(|r| length(r)).max();
    let mut expiring_windows: Vec<&WindowReading> = Vec::new();
    for reading in plan
        .iter()
        .filter(|r| longest.is_some() && length(r) == longest)
    {
        let (Some(left), Some(length)) = (reading.left(), length(reading)) else {
            continue;
        };
        let time_share = ((reading.reset_at_ms - now_ms) as f64 / length as f64).clamp(1e-6, 1.0);
        let expiring = (left - time_share).max(0.0);
        if expiring > 0.0 {
            expiring_windows.push(reading);
        }
        if expiring > assessment.expiring {
            assessment.expiring = expiring;
            assessment.urgency = left / time_share;
        }
    }

    // Shedding keeps an almost full account for the sessions it has. A window whose leftover
    // would expire anyway is no reason to: its last share is worth more spent than kept (a
    // threshold there left 3–10 % of every week unused in the simulation, docs/BENCHMARKS.md).
    let sheds = |r: &&&WindowReading| !expiring_windows.iter().any(|e| std::ptr::eq(*e, **r));
    let used = plan
        .iter()
        .filter(sheds)
        .filter_map(|r| r.utilization)
        .fold(0.0_f64, f64::max);
    let warned = plan
        .iter()
        .filter(sheds)
        .any(|r| r.status == WindowStatus::AllowedWarning);
    assessment.shed = if !exhausted.is_empty() || used >= thresholds.move_sessions {
        Shed::AllSessions
    } else if warned || used >= thresholds.shed {
        Shed::NewSessions
    } else {
        Shed::None
    };
    assessment
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_770_000_000_000;

    fn reading(kind: WindowKind, used: f64, reset_in_ms: i64) -> WindowReading {
        WindowReading {
            kind,
            scope: Scope::Account,
            utilization: Some(used),
            reset_at_ms: NOW + reset_in_ms,
            length_ms: kind.default_length_ms(),
            status: WindowStatus::Allowed,
            observed_at_ms: NOW - 1_000,
        }
    }

    #[test]
    fn an_account_never_observed_or_observed_before_its_reset_is_unknown() {
        let t = Thresholds::default();
        assert_eq!(assess(&[], NOW, t), Assessment::UNKNOWN);
        // A full week that has since reset: neither full nor empty, unknown.
        let stale = [reading(WindowKind::SevenDay, 1.0, -1)];
        let assessment = assess(&stale, NOW, t);
        assert!(!assessment.known);
        assert_eq!(assessment.headroom, None);
        assert_eq!(assessment.exhausted_until_ms, None);
        assert_eq!(assessment.shed, Shed::None);
    }

    #[test]
    fn a_window_past_its_reset_reads_as_empty_next_to_a_fresh_one() {
        let readings = [
            reading(WindowKind::FiveHour, 1.0, -1),
            reading(WindowKind::SevenDay, 0.5, 3 * DAY_MS),
        ];
        let assessment = assess(&readings, NOW, Thresholds::default());
        assert!(assessment.known);
        assert_eq!(assessment.headroom, Some(0.5));
        assert_eq!(assessment.binding, Some(WindowKind::SevenDay));
        assert_eq!(assessment.shed, Shed::None);
        assert_eq!(assessment.exhausted_until_ms, None);
    }

    #[test]
    fn expiring_capacity_is_much_left_with_little_time_on_the_longest_window() {
        let t = Thresholds::default();
        // 40 % left of a week resetting in a day: 40 % − 1/7 would expire at an even pace.
        let soon = assess(&[reading(WindowKind::SevenDay, 0.6, DAY_MS)], NOW, t);
        assert!((soon.expiring - (0.4 - 1.0 / 7.0)).abs() < 1e-9, "{soon:?}");
        assert!((soon.urgency - 2.8).abs() < 1e-9);
        // A full week left with the whole week to go: nothing expires.
        let fresh = assess(&[reading(WindowKind::SevenDay, 0.0, 7 * DAY_MS)], NOW, t);
        assert_eq!(fresh.expiring, 0.0);
        // A 5-hour window about to reset half empty does not count next to a weekly one.
        let short = assess(
            &[
                reading(WindowKind::FiveHour, 0.5, HOUR_MS / 2),
                reading(WindowKind::SevenDay, 0.0, 7 * DAY_MS),
            ],
            NOW,
            t,
        );
        assert_eq!(short.expiring, 0.0);
        // Per-minute limits feed headroom only.
        let minute = assess(
            &[reading(
                WindowKind::PerMinute(MinuteLimit::Requests),
                0.1,
                1_000,
            )],
            NOW,
            t,
        );
        assert_eq!((minute.expiring, minute.headroom), (0.0, Some(0.9)));
    }

    #[test]
    fn thresholds_are_checked_and_a_group_overrides_them() {
        assert!(Thresholds::new(0.8, 0.95).is_ok());
        assert!(Thresholds::new(0.0, 0.95).is_err());
        assert!(Thresholds::new(0.8, 1.5).is_err());
        assert!(Thresholds::new(f64::NAN, 0.95).is_err());
        assert!(Thresholds::new(0.96, 0.95).is_err());
        let group = Thresholds::default().overridden(Some(0.8), None);
        assert_eq!((group.shed, group.move_sessions), (0.8, 0.97));
        // Raising only the shed threshold past the deployment's move one moves at it.
        let raised = Thresholds::default().overridden(Some(0.99), None);
        assert_eq!((raised.shed, raised.move_sessions), (0.99, 0.99));
        // The same reading sheds under the lower group threshold only.
        let r = reading(WindowKind::SevenDay, 0.85, 3 * DAY_MS);
        assert_eq!(
            assess(std::slice::from_ref(&r), NOW, Thresholds::default()).shed,
            Shed::None
        );
        assert_eq!(assess(&[r], NOW, group).shed, Shed::NewSessions);
    }

    #[test]
    fn a_late_answer_never_rolls_a_window_back_and_a_new_period_replaces_the_old() {
        let kept = reading(WindowKind::SevenDay, 0.6, 3 * DAY_MS);
        // An earlier request's answer arriving later: less used, same reset.
        let late = WindowReading {
            utilization: Some(0.5),
            observed_at_ms: kept.observed_at_ms + 500,
            ..kept.clone()
        };
        assert!(!supersedes(&late, &kept));
        // Further along in the same period, its reset a few seconds off (computed from
        // reset-after seconds): replaces, whenever it was observed.
        let further = WindowReading {
            utilization: Some(0.7),
            reset_at_ms: kept.reset_at_ms - 3_000,
            observed_at_ms: kept.observed_at_ms - 100,
            ..kept.clone()
        };
        assert!(supersedes(&further, &kept));
        // Rejected is further along than any allowed figure.
        let rejected = WindowReading {
            status: WindowStatus::Rejected,
            utilization: None,
            ..kept.clone()
        };
        assert!(supersedes(&rejected, &kept));
        // The next period: replaces, though it is less used; the previous period never returns.
        let next = reading(WindowKind::SevenDay, 0.05, 10 * DAY_MS);
        assert!(supersedes(&next, &kept));
        assert!(!supersedes(&kept, &next));
        // The same figures: the one observed last.
        let again = WindowReading {
            observed_at_ms: kept.observed_at_ms + 1,
            ..kept.clone()
        };
        assert!(supersedes(&again, &kept));
        // A per-minute limit refills: the last observed wins even when less used.
        let minute = reading(WindowKind::PerMinute(MinuteLimit::Tokens), 0.8, 30_000);
        let refilled = WindowReading {
            utilization: Some(0.2),
            observed_at_ms: minute.observed_at_ms + 1_000,
            ..minute.clone()
        };
        assert!(supersedes(&refilled, &minute));
        let mut stored = vec![kept.clone()];
        merge_readings(&mut stored, &[late, further.clone(), minute.clone()]);
        assert_eq!(stored, vec![further, minute]);
    }

    #[test]
    fn left_by_window_counts_fresh_account_windows_only() {
        let week = reading(WindowKind::SevenDay, 0.25, 3 * DAY_MS);
        let past = reading(WindowKind::FiveHour, 0.9, -HOUR_MS);
        let mut opus = reading(WindowKind::SevenDayModel, 0.5, 3 * DAY_MS);
        opus.scope = Scope::Models("opus".into());
        let left = left_by_window(&[week, past, opus], NOW);
        assert_eq!(left, vec![(WindowKind::SevenDay, 0.75)]);
    }

    #[test]
    fn shed_levels_follow_the_thresholds_and_warnings() {
        let t = Thresholds::default();
        let at = |used: f64, status| {
            let mut r = reading(WindowKind::FiveHour, used, HOUR_MS);
            r.status = status;
            // Next to a week that is on pace: the 5-hour window is not the one that expires.
            assess(&[r, reading(WindowKind::SevenDay, 0.5, 3 * DAY_MS)], NOW, t).shed
        };
        assert_eq!(at(0.89, WindowStatus::Allowed), Shed::None);
        assert_eq!(at(0.9, WindowStatus::Allowed), Shed::NewSessions);
        assert_eq!(at(0.5, WindowStatus::AllowedWarning), Shed::NewSessions);
        assert_eq!(at(0.97, WindowStatus::Allowed), Shed::AllSessions);
        assert_eq!(at(0.2, WindowStatus::Rejected), Shed::AllSessions);
    }

    #[test]
    fn a_window_whose_leftover_would_expire_sheds_nothing_until_it_is_used_up() {
        let t = Thresholds::default();
        // 5 % of the week left and 6 hours to its reset: spent, not kept.
        let week = reading(WindowKind::SevenDay, 0.95, 6 * HOUR_MS);
        let assessment = assess(std::slice::from_ref(&week), NOW, t);
        assert!(assessment.expiring > 0.0);
        assert_eq!(assessment.shed, Shed::None);
        // The same figure with four days to go sheds as usual.
        let far = reading(WindowKind::SevenDay, 0.95, 4 * DAY_MS);
        assert_eq!(assess(&[far], NOW, t).shed, Shed::NewSessions);
        // A shorter window near full still sheds the account.
        let five = reading(WindowKind::FiveHour, 0.98, HOUR_MS);
        assert_eq!(assess(&[week, five], NOW, t).shed, Shed::AllSessions);
        // Used up is used up.
        let full = reading(WindowKind::SevenDay, 1.0, 6 * HOUR_MS);
        assert_eq!(assess(&[full], NOW, t).shed, Shed::AllSessions);
    }

    #[test]
    fn overage_is_not_headroom_and_a_used_up_plan_without_it_is_exhausted() {
        let t = Thresholds::default();
        let week = reading(WindowKind::SevenDay, 1.0, DAY_MS);
        let mut overage = reading(WindowKind::Overage, 0.1, 20 * DAY_MS);
        overage.length_ms = None;
        let paid = assess(&[week.clone(), overage.clone()], NOW, t);
        assert!(paid.in_overage);
        assert_eq!(paid.headroom, Some(0.0));
        assert_eq!(paid.exhausted_until_ms, None);
        overage.status = WindowStatus::Rejected;
        let unpaid = assess(&[week, overage], NOW, t);
        assert!(!unpaid.in_overage);
        assert_eq!(unpaid.exhausted_until_ms, Some(NOW + DAY_MS));
    }

    #[test]
    fn a_full_model_scoped_window_blocks_only_the_models_it_covers_until_its_reset() {
        let t = Thresholds::default();
        let mut opus = reading(WindowKind::SevenDayModel, 0.0, 2 * DAY_MS);
        opus.scope = Scope::Models("opus".into());
        opus.utilization = None;
        opus.status = WindowStatus::Rejected;
        let readings = [opus.clone(), reading(WindowKind::SevenDay, 0.3, 3 * DAY_MS)];
        let assessment = assess(&readings, NOW, t);
        assert_eq!(
            assessment.blocked_for_model("claude-opus-4-1-20250805"),
            Some(NOW + 2 * DAY_MS)
        );
        assert_eq!(assessment.blocked_for_model("claude-sonnet-4-5"), None);
        // The rest of the account keeps serving: nothing account-wide is shed or exhausted.
        assert_eq!(assessment.shed, Shed::None);
        assert_eq!(assessment.headroom, Some(0.7));
        // Past its reset the block is gone.
        assert_eq!(
            assess(&[opus], NOW + 3 * DAY_MS, t).blocked_for_model("claude-opus-4-1"),
            None
        );
    }

    #[test]
    fn the_reading_that_stands_is_the_later_period_or_further_along() {
        let old = reading(WindowKind::SevenDay, 0.95, DAY_MS);
        // Observed later, the same period, less used: a late answer, not a refill.
        let mut late = reading(WindowKind::SevenDay, 0.2, DAY_MS);
        late.observed_at_ms = NOW - 10;
        let assessment = assess(&[late, old.clone()], NOW, Thresholds::default());
        assert!((assessment.headroom.unwrap_or(1.0) - 0.05).abs() < 1e-9);
        // The next period stands over the last.
        let next = reading(WindowKind::SevenDay, 0.2, 8 * DAY_MS);
        let assessment = assess(&[old, next], NOW, Thresholds::default());
        assert_eq!(assessment.headroom, Some(0.8));
    }
}
