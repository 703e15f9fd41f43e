//! Ordering eligible accounts (docs/DESIGN.md §5), as a pure function: the sticky account first (if
//! eligible, not soft-blocked and not shed for every session), then priority tiers (lower first);
//! within a tier by usage-window standing (capacity that would expire first, then headroom;
//! unknown in between; above the shed threshold, in overage or soft-blocked last), and among
//! accounts of equal standing a weighted random order by `weight × headroom`. Nothing is
//! excluded here. No per-process round-robin state: any replica gives equally good answers.

use std::collections::HashMap;
use std::sync::Arc;

use crate::AccountId;
use crate::account::Account;
use crate::health::AccountHealth;
use crate::windows::{Assessment, Shed};

/// Why a plan is empty. The relay decides its answer from it (404 for a model no account
/// allows, 503 otherwise; planning again a moment later for `Confirming`), so it is an enum on
/// the wire, not a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NoneReason {
    /// No active account of the group serves the platform (or the group is unknown).
    NoAccounts,
    /// No account of the group allows the model.
    ModelNotAllowed,
    /// Every account is out: hard-blocked, or (some of them) behind an open breaker.
    AllBlocked,
    /// Every account that would serve was excluded (already tried).
    AllExcluded,
    /// Every account's circuit breaker is open.
    BreakerOpen,
    /// Every account is out, and one of them only while the selector confirms a suspicious
    /// answer (its hard block is the "confirming" one), or its block was lifted since the
    /// selector's reading (a verdict, most often): it may serve at any moment, so the plan's
    /// retry hint is short ([`CONFIRMING_RETRY_MS`]) and the relay plans again within the
    /// request's deadline instead of refusing it (docs/DESIGN.md §6).
    Confirming,
}

/// The retry hint of a plan empty because of a confirmation: how often a waiting request asks
/// again (a confirmation's verdict is one probe away, and its block lasts until the verdict).
pub const CONFIRMING_RETRY_MS: u64 = 250;

impl NoneReason {
    /// Stable lowercase name: metric labels, logs, and the deprecated string field.
    pub fn as_str(self) -> &'static str {
        match self {
            NoneReason::NoAccounts => "no_accounts",
            NoneReason::ModelNotAllowed => "model_not_allowed",
            NoneReason::AllBlocked => "all_blocked",
            NoneReason::AllExcluded => "all_excluded",
            NoneReason::BreakerOpen => "breaker_open",
            NoneReason::Confirming => "confirming",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [
            NoneReason::NoAccounts,
            NoneReason::ModelNotAllowed,
            NoneReason::AllBlocked,
            NoneReason::AllExcluded,
            NoneReason::BreakerOpen,
            NoneReason::Confirming,
        ]
        .into_iter()
        .find(|reason| reason.as_str() == text)
    }
}

/// An account that passed every eligibility check, with what the oracle knows of it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub account: Arc<Account>,
    /// `None`: unreadable (unknown load).
    pub health: Option<AccountHealth>,
    /// Where the account stands across its usage windows (`crate::windows::assess`); `None`:
    /// not read, which orders as unknown.
    pub windows: Option<Assessment>,
}

impl Candidate {
    pub fn soft_blocked(&self) -> bool {
        self.health.is_some_and(|h| h.soft_block_ms > 0)
    }

    /// Free share of the account's concurrency, 0..=1; 1 for unlimited accounts, 0.5 when the
    /// load is unknown (neither preferred nor avoided).
    pub fn headroom(&self) -> f64 {
        let limit = self.account.concurrency_limit;
        match self.health.and_then(|h| h.inflight) {
            None => 0.5,
            Some(_) if limit <= 0 => 1.0,
            Some(inflight) => (f64::from(limit) - f64::from(inflight)).max(0.0) / f64::from(limit),
        }
    }

    /// How far its usage windows shed it (none when unknown).
    pub fn shed(&self) -> Shed {
        self.windows.as_ref().map_or(Shed::None, |w| w.shed)
    }

    /// Where the account's windows put it within its tier: a class (lower first) and a standing
    /// within the class (higher first), coarse on purpose so that accounts of about equal
    /// standing share the load by the weighted draw. `None`: unknown.
    fn standing(&self) -> Option<(u8, i64)> {
        if self.soft_blocked() {
            return Some((STANDING_SOFT_BLOCKED, 0));
        }
        let windows = self.windows.as_ref().filter(|w| w.known)?;
        let headroom = windows.headroom.unwrap_or(UNKNOWN_HEADROOM);
        Some(if windows.in_overage {
            (STANDING_OVERAGE, bucket(headroom, HEADROOM_STEPS))
        } else if windows.shed == Shed::AllSessions {
            (STANDING_SHED_ALL, bucket(headroom, HEADROOM_STEPS))
        } else if windows.shed == Shed::NewSessions {
            (STANDING_SHED_NEW, bucket(headroom, HEADROOM_STEPS))
        } else if windows.expiring > 0.0 {
            (STANDING_EXPIRING, bucket(windows.urgency, URGENCY_STEPS))
        } else {
            (STANDING_WITHIN_PLAN, bucket(headroom, HEADROOM_STEPS))
        })
    }
}

/// Classes within a tier, in order.
const STANDING_EXPIRING: u8 = 0;
const STANDING_WITHIN_PLAN: u8 = 1;
const STANDING_SHED_NEW: u8 = 2;
const STANDING_SHED_ALL: u8 = 3;
const STANDING_OVERAGE: u8 = 4;
const STANDING_SOFT_BLOCKED: u8 = 5;
/// An unknown account's headroom: between an emptier and a fuller known account.
const UNKNOWN_HEADROOM: f64 = 0.5;
/// Headroom in tenths; urgency (`left / time share`, above 1) in quarters.
const HEADROOM_STEPS: f64 = 10.0;
const URGENCY_STEPS: f64 = 4.0;

fn bucket(value: f64, steps: f64) -> i64 {
    (value.clamp(0.0, 1e6) * steps).floor() as i64
}

/// Orders candidates; returns them with whether the first is the sticky account.
pub fn order(
    candidates: Vec<Candidate>,
    sticky: Option<AccountId>,
    rng: &mut fastrand::Rng,
) -> (Vec<Candidate>, bool) {
    order_first(candidates, sticky, rng, usize::MAX)
}

/// The first `count` accounts of [`order`]'s answer, the same ones in the same order from the
/// same random draws, without sorting the rest: a plan lists a few accounts of a pool that may
/// hold thousands.
pub fn order_first(
    mut candidates: Vec<Candidate>,
    sticky: Option<AccountId>,
    rng: &mut fastrand::Rng,
    count: usize,
) -> (Vec<Candidate>, bool) {
    let mut ordered = Vec::with_capacity(candidates.len());
    let mut is_sticky = false;
    if let Some(sticky) = sticky
        && let Some(index) = candidates.iter().position(|c| {
            c.account.id == sticky && !c.soft_blocked() && c.shed() < Shed::AllSessions
        })
    {
        ordered.push(candidates.swap_remove(index));
        is_sticky = true;
    }
    // Efraimidis–Spirakis: key = u^(1/w), descending, is a weighted draw without replacement.
    // A full account keeps a tiny weight, so it is still listed (the relay may wait on it).
    let keys: Vec<f64> = candidates
        .iter()
        .map(|candidate| {
            let weight =
                (f64::from(candidate.account.weight.max(1)) * candidate.headroom()).max(1e-6);
            rng.f64().max(f64::MIN_POSITIVE).powf(1.0 / weight)
        })
        .collect();
    let standings: Vec<Option<(u8, i64)>> = candidates.iter().map(Candidate::standing).collect();
    // An unknown account (never read, or read only before its windows reset) takes the standing
    // of a known peer of its tier drawn at random: on average the middle, neither preferred as
    // empty nor avoided as full, and still asked now and then so that it becomes known (ranked
    // below every known account, it would never be read again).
    // The known peers of each tier, gathered once (not once per unknown account: a pool of a
    // thousand unknown accounts made that a million steps a select).
    let mut peers: HashMap<i32, Vec<(u8, i64)>> = HashMap::new();
    for (candidate, standing) in candidates.iter().zip(&standings) {
        if let Some(standing) = standing.filter(|(class, _)| *class <= STANDING_WITHIN_PLAN) {
            peers
                .entry(candidate.account.priority)
                .or_default()
                .push(standing);
        }
    }
    let resolved: Vec<(u8, i64)> = (0..candidates.len())
        .map(|index| {
            standings[index].unwrap_or_else(|| {
                match peers.get(&candidates[index].account.priority) {
                    Some(peers) if !peers.is_empty() => peers[rng.usize(..peers.len())],
                    _ => (
                        STANDING_WITHIN_PLAN,
                        bucket(UNKNOWN_HEADROOM, HEADROOM_STEPS),
                    ),
                }
            })
        })
        .collect();
    // The candidate's index breaks every tie (full accounts' keys underflow to 0), so the order
    // is total and the first `count` are the same whether the rest is sorted or not.
    // (priority tier, standing, draw key, index, candidate)
    type Keyed = (i32, (u8, i64), f64, usize, Candidate);
    let mut keyed: Vec<Keyed> = candidates
        .into_iter()
        .zip(resolved)
        .zip(keys)
        .enumerate()
        .map(|(index, ((candidate, standing), key))| {
            (candidate.account.priority, standing, key, index, candidate)
        })
        .collect();
    let before = |a: &Keyed, b: &Keyed| {
        a.0.cmp(&b.0)
            .then(a.1.0.cmp(&b.1.0))
            .then(b.1.1.cmp(&a.1.1))
            .then(b.2.partial_cmp(&a.2).unwrap_or(std::cmp::Ordering::Equal))
            .then(a.3.cmp(&b.3))
    };
    let wanted = count.saturating_sub(ordered.len());
    if wanted == 0 {
        keyed.clear();
    } else if wanted < keyed.len() {
        keyed.select_nth_unstable_by(wanted - 1, before);
        keyed.truncate(wanted);
    }
    keyed.sort_unstable_by(before);
    ordered.extend(keyed.into_iter().map(|(_, _, _, _, candidate)| candidate));
    ordered.truncate(count);
    (ordered, is_sticky)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::account::{AccountStatus, CredentialKind, Platform, Secret};
    use crate::health::Breaker;
    use crate::windows::{Scope, Thresholds, WindowKind, WindowReading, WindowStatus, assess};

    fn account(id: AccountId, priority: i32, weight: i32, limit: i32) -> Arc<Account> {
        Arc::new(Account {
            serves: Vec::new(),
            id,
            name: format!("a{id}"),
            group: "g".into(),
            platform: Platform::Anthropic,
            base_url: "http://127.0.0.1".into(),
            credential_kind: CredentialKind::ApiKey,
            credential: Secret::new("k"),
            oauth: None,
            status: AccountStatus::Active,
            status_reason: String::new(),
            priority,
            weight,
            concurrency_limit: limit,
            rpm_limit: 0,
            session_window_limit_usd: 0.0,
            allowed_models: vec![],
            model_mapping: HashMap::new(),
            proxy_url: None,
            probe_model: None,
            stream_usage: true,
            identity: Default::default(),
        })
    }

    fn healthy(inflight: u32, soft: u64) -> Option<AccountHealth> {
        Some(AccountHealth {
            inflight: Some(inflight),
            hard_block_ms: 0,
            soft_block_ms: soft,
            breaker: Breaker::Closed,
            failures: 0,
        })
    }

    fn ids(candidates: &[Candidate]) -> Vec<AccountId> {
        candidates.iter().map(|c| c.account.id).collect()
    }

    #[test]
    fn none_reasons_parse_their_own_names_only() {
        for reason in [
            NoneReason::NoAccounts,
            NoneReason::ModelNotAllowed,
            NoneReason::AllBlocked,
            NoneReason::AllExcluded,
            NoneReason::BreakerOpen,
        ] {
            assert_eq!(NoneReason::parse(reason.as_str()), Some(reason));
        }
        assert_eq!(NoneReason::parse(""), None);
        assert_eq!(NoneReason::parse("All_Blocked"), None);
    }

    #[test]
    fn tiers_then_soft_blocked_last_and_sticky_first() {
        let mut rng = fastrand::Rng::with_seed(7);
        let candidates = vec![
            Candidate {
                account: account(1, 1, 1, 0),
                health: healthy(0, 0),
                windows: None,
            },
            Candidate {
                account: account(2, 0, 1, 0),
                health: healthy(0, 5_000),
                windows: None,
            },
            Candidate {
                account: account(3, 0, 1, 0),
                health: healthy(0, 0),
                windows: None,
            },
        ];
        let (ordered, sticky) = order(candidates.clone(), None, &mut rng);
        assert_eq!(ids(&ordered), vec![3, 2, 1]);
        assert!(!sticky);
        let (ordered, sticky) = order(candidates.clone(), Some(1), &mut rng);
        assert_eq!(ids(&ordered), vec![1, 3, 2]);
        assert!(sticky);
        // A soft-blocked sticky account is not put first.
        let (ordered, sticky) = order(candidates, Some(2), &mut rng);
        assert_eq!(ids(&ordered), vec![3, 2, 1]);
        assert!(!sticky);
    }

    #[test]
    fn full_accounts_are_listed_after_those_with_room() {
        let mut rng = fastrand::Rng::with_seed(1);
        for _ in 0..100 {
            let candidates = vec![
                Candidate {
                    account: account(1, 0, 10, 2),
                    health: healthy(2, 0),
                    windows: None,
                },
                Candidate {
                    account: account(2, 0, 1, 2),
                    health: healthy(1, 0),
                    windows: None,
                },
            ];
            let (ordered, _) = order(candidates, None, &mut rng);
            assert_eq!(ids(&ordered), vec![2, 1]);
        }
    }

    #[test]
    fn the_first_few_are_the_full_orders_first_few() {
        let mut seeds = fastrand::Rng::with_seed(11);
        for round in 0..300 {
            let size = seeds.usize(0..40);
            let candidates: Vec<Candidate> = (0..size)
                .map(|n| {
                    let limit = seeds.i32(0..4);
                    Candidate {
                        account: account(
                            n as AccountId + 1,
                            seeds.i32(0..3),
                            seeds.i32(0..5),
                            limit,
                        ),
                        // Full, busy, soft-blocked and unknown accounts, so ties happen.
                        health: match seeds.u8(0..4) {
                            0 => None,
                            1 => healthy(limit.max(0) as u32, 0),
                            2 => healthy(0, 5_000),
                            _ => healthy(seeds.u32(0..4), 0),
                        },
                        windows: None,
                    }
                })
                .collect();
            let sticky = (seeds.bool() && size > 0).then(|| seeds.usize(0..size) as AccountId + 1);
            let seed = seeds.u64(..);
            let (all, all_sticky) = order(
                candidates.clone(),
                sticky,
                &mut fastrand::Rng::with_seed(seed),
            );
            for count in [0, 1, 2, 4, size, size + 3] {
                let (first, first_sticky) = order_first(
                    candidates.clone(),
                    sticky,
                    &mut fastrand::Rng::with_seed(seed),
                    count,
                );
                assert_eq!(first_sticky, all_sticky, "round {round}");
                assert_eq!(
                    ids(&first),
                    ids(&all[..count.min(all.len())]),
                    "round {round}, first {count} of {size}"
                );
            }
        }
    }

    #[test]
    fn first_picks_follow_weights() {
        let mut rng = fastrand::Rng::with_seed(3);
        let mut firsts = HashMap::new();
        for _ in 0..20_000 {
            let candidates = vec![
                Candidate {
                    account: account(1, 0, 1, 0),
                    health: healthy(0, 0),
                    windows: None,
                },
                Candidate {
                    account: account(2, 0, 3, 0),
                    health: healthy(0, 0),
                    windows: None,
                },
            ];
            let (ordered, _) = order(candidates, None, &mut rng);
            *firsts.entry(ordered[0].account.id).or_insert(0u32) += 1;
        }
        let share = f64::from(firsts[&2]) / 20_000.0;
        assert!(
            (share - 0.75).abs() < 0.02,
            "weight 3 of 4 → 75 %, got {share}"
        );
    }

    const NOW: i64 = 1_770_000_000_000;
    const DAY: i64 = 86_400_000;

    fn week(used: f64, reset_in_ms: i64) -> WindowReading {
        WindowReading {
            kind: WindowKind::SevenDay,
            scope: Scope::Account,
            utilization: Some(used),
            reset_at_ms: NOW + reset_in_ms,
            length_ms: Some(7 * DAY),
            status: WindowStatus::Allowed,
            observed_at_ms: NOW - 60_000,
        }
    }

    fn five_hour(used: f64) -> WindowReading {
        WindowReading {
            kind: WindowKind::FiveHour,
            length_ms: Some(5 * 3_600_000),
            reset_at_ms: NOW + 3_600_000,
            ..week(used, 0)
        }
    }

    /// An account of tier `priority` whose windows read `readings` now.
    fn reading(id: AccountId, priority: i32, readings: &[WindowReading]) -> Candidate {
        Candidate {
            account: account(id, priority, 1, 0),
            health: healthy(0, 0),
            windows: Some(assess(readings, NOW, Thresholds::default())),
        }
    }

    /// The order, the same for every draw of the random keys.
    fn always(candidates: &[Candidate], sticky: Option<AccountId>) -> (Vec<AccountId>, bool) {
        let mut rng = fastrand::Rng::with_seed(11);
        let (first, first_sticky) = order(candidates.to_vec(), sticky, &mut rng);
        for _ in 0..200 {
            let (again, again_sticky) = order(candidates.to_vec(), sticky, &mut rng);
            assert_eq!(
                (ids(&again), again_sticky),
                (ids(&first), first_sticky),
                "the order depends on the draw"
            );
        }
        (ids(&first), first_sticky)
    }

    #[test]
    fn capacity_that_would_expire_is_spent_first() {
        // The starting point of the usage-window scenario: 60 % used with the reset tomorrow,
        // 30 % in three days, 10 % in five, nothing used with the whole week to go.
        let candidates = [
            reading(4, 0, &[week(0.0, 7 * DAY)]),
            reading(3, 0, &[week(0.1, 5 * DAY)]),
            reading(1, 0, &[week(0.6, DAY)]),
            reading(2, 0, &[week(0.3, 3 * DAY)]),
        ];
        assert_eq!(always(&candidates, None), (vec![1, 2, 3, 4], false));
    }

    #[test]
    fn an_unknown_account_is_neither_empty_nor_full() {
        let unread = Candidate {
            account: account(4, 0, 1, 0),
            health: healthy(0, 0),
            windows: None,
        };
        for unknown in [reading(2, 0, &[]), unread] {
            let candidates = [
                reading(1, 0, &[week(0.8, 7 * DAY)]),
                unknown.clone(),
                reading(3, 0, &[week(0.1, 7 * DAY)]),
            ];
            let id = unknown.account.id;
            let mut rng = fastrand::Rng::with_seed(5);
            let mut places = [0; 3];
            for _ in 0..1_000 {
                let (ordered, _) = order_of(&candidates, &mut rng);
                places[ordered.iter().position(|&a| a == id).unwrap_or(3)] += 1;
                // The known accounts keep their order: the emptier first.
                let known: Vec<_> = ordered.into_iter().filter(|&a| a != id).collect();
                assert_eq!(known, vec![3, 1]);
            }
            // Sometimes first (it gets read), sometimes last, never always either.
            assert!(places.iter().all(|&n| n > 100), "{places:?}");
            assert!(places[0] < 600 && places[2] < 600, "{places:?}");
        }
    }

    fn order_of(candidates: &[Candidate], rng: &mut fastrand::Rng) -> (Vec<AccountId>, bool) {
        let (ordered, sticky) = order(candidates.to_vec(), None, rng);
        (ids(&ordered), sticky)
    }

    #[test]
    fn a_reading_from_before_the_last_reset_is_unknown_not_full() {
        // Full when read, but its week has reset since: the account is not avoided as full
        // (nor preferred as empty): a stale full reading would keep it out for a week.
        let stale = reading(1, 0, &[week(1.0, -1)]);
        assert!(!stale.windows.as_ref().is_some_and(|w| w.known));
        let candidates = [
            reading(2, 0, &[week(0.95, 6 * DAY)]),
            stale,
            reading(3, 0, &[week(0.2, 7 * DAY)]),
        ];
        let mut rng = fastrand::Rng::with_seed(2);
        let mut first = 0;
        for _ in 0..1_000 {
            let (ordered, _) = order_of(&candidates, &mut rng);
            assert_eq!(ordered[2], 2, "the shed account stays last");
            first += u32::from(ordered[0] == 1);
        }
        assert!((300..700).contains(&first), "first {first} times of 1000");
    }

    #[test]
    fn an_account_in_overage_orders_after_every_account_within_plan() {
        let mut overage = week(0.05, 20 * DAY);
        overage.kind = WindowKind::Overage;
        overage.length_ms = None;
        let candidates = [
            reading(1, 0, &[week(1.0, 2 * DAY), overage]),
            reading(2, 0, &[week(0.95, 6 * DAY)]),
            reading(3, 0, &[week(0.5, 7 * DAY)]),
        ];
        assert_eq!(always(&candidates, None), (vec![3, 2, 1], false));
    }

    #[test]
    fn priority_tiers_come_before_any_window_standing() {
        let candidates = [
            reading(1, 1, &[week(0.1, DAY / 2)]),
            reading(2, 0, &[week(0.95, 7 * DAY)]),
        ];
        assert_eq!(always(&candidates, None), (vec![2, 1], false));
    }

    #[test]
    fn a_sticky_session_stays_until_the_higher_threshold() {
        let candidates = [
            reading(1, 0, &[week(0.1, DAY)]),
            reading(2, 0, &[five_hour(0.93), week(0.2, 7 * DAY)]),
            reading(3, 0, &[five_hour(0.98), week(0.2, 7 * DAY)]),
        ];
        // Above the shed threshold: last for new sessions, but its own sessions stay.
        assert_eq!(always(&candidates, None), (vec![1, 2, 3], false));
        assert_eq!(always(&candidates, Some(2)), (vec![2, 1, 3], true));
        // Above the higher threshold the session moves.
        assert_eq!(always(&candidates, Some(3)), (vec![1, 2, 3], false));
        // Stickiness wins over expiring capacity elsewhere.
        assert_eq!(
            always(&candidates[..2], Some(2)),
            (vec![2, 1], true),
            "a sticky account below the higher threshold stays first"
        );
    }

    #[test]
    fn shedding_orders_and_never_excludes() {
        let mut warned = week(0.5, 7 * DAY);
        warned.status = WindowStatus::AllowedWarning;
        let mut rejected = five_hour(1.0);
        rejected.status = WindowStatus::Rejected;
        let candidates = [
            reading(1, 0, &[warned]),
            reading(2, 0, &[rejected]),
            reading(3, 0, &[week(0.92, 7 * DAY)]),
            reading(4, 0, &[week(0.7, 7 * DAY)]),
        ];
        let (order, _) = always(&candidates, None);
        assert_eq!(order.len(), 4, "every account is still listed");
        assert_eq!(order[0], 4);
        assert_eq!(order[3], 2, "the used-up account is last, not gone");
        // Every account shed: still all listed.
        let (order, _) = always(&candidates[..3], None);
        assert_eq!(order.len(), 3);
    }

    #[test]
    fn a_model_scoped_block_does_not_shed_the_account_for_other_models() {
        let mut opus = week(0.0, 2 * DAY);
        opus.kind = WindowKind::SevenDayModel;
        opus.scope = Scope::Models("opus".into());
        opus.status = WindowStatus::Rejected;
        let blocked = reading(1, 0, &[opus, week(0.1, 2 * DAY)]);
        let windows = blocked.windows.clone().expect("assessed");
        assert_eq!(
            windows.blocked_for_model("claude-opus-4-1"),
            Some(NOW + 2 * DAY)
        );
        assert_eq!(windows.blocked_for_model("claude-sonnet-4-5"), None);
        let candidates = [blocked, reading(2, 0, &[week(0.1, 7 * DAY)])];
        // Its week still expires sooner: it still comes first for the models it serves.
        assert_eq!(always(&candidates, None), (vec![1, 2], false));
    }

    #[test]
    fn equal_window_standing_keeps_the_concurrency_weighting() {
        let mut rng = fastrand::Rng::with_seed(9);
        for _ in 0..100 {
            let candidates = vec![
                Candidate {
                    account: account(1, 0, 10, 2),
                    health: healthy(2, 0),
                    windows: Some(assess(&[week(0.31, 7 * DAY)], NOW, Thresholds::default())),
                },
                Candidate {
                    account: account(2, 0, 1, 2),
                    health: healthy(1, 0),
                    windows: Some(assess(&[week(0.35, 7 * DAY)], NOW, Thresholds::default())),
                },
            ];
            let (ordered, _) = order(candidates, None, &mut rng);
            assert_eq!(ids(&ordered), vec![2, 1]);
        }
    }
}
