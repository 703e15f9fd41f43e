//! `window-sim`: the usage-window scenario in virtual time (docs/BENCHMARKS.md,
//! "Usage windows"). Deterministic: every seed draws the same sessions for both policies, which
//! differ only in what `poolgate_core::select::order` is given: today's (priority + concurrency
//! headroom; an account that answers 429 with an exhausted window is blocked until its reset)
//! and the same plus each account's window assessment, read from the answers it gave.
//!
//! `window-sim [--quick] [--scenario FILE]`

use std::collections::VecDeque;
use std::sync::Arc;

use poolgate_core::AccountId;
use poolgate_core::account::{Account, AccountStatus, CredentialKind, Platform, Secret};
use poolgate_core::health::AccountHealth;
use poolgate_core::select::{Candidate, order};
use poolgate_core::windows::{Scope, Thresholds, WindowKind, WindowReading, WindowStatus, assess};
use serde_json::Value;

const SECOND: i64 = 1_000;
const HOUR: i64 = 3_600 * SECOND;
const DAY: i64 = 24 * HOUR;
/// Monday 2026-01-05 00:00 UTC: readings carry epoch times like the real headers.
const START_MS: i64 = 1_767_571_200_000;
const QUICK_SEEDS: u64 = 4;

fn main() {
    let mut quick = false;
    let mut path = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/usage_windows.json").to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--scenario" => match args.next() {
                Some(value) => path = value,
                None => exit("--scenario needs a file"),
            },
            other => exit(&format!(
                "unknown argument {other:?}; usage: window-sim [--quick] [--scenario FILE]"
            )),
        }
    }
    let scenario = match std::fs::read_to_string(&path)
        .map_err(|e| format!("{path}: {e}"))
        .and_then(|text| Scenario::parse(&text).map_err(|e| format!("{path}: {e}")))
    {
        Ok(scenario) => scenario,
        Err(error) => exit(&error),
    };
    let seeds = if quick {
        QUICK_SEEDS.min(scenario.seeds)
    } else {
        scenario.seeds
    };
    let started = std::time::Instant::now();
    let report = run_all(&scenario, seeds);
    print!("{}", report.render(&scenario, seeds));
    println!("({:.2} s of wall time)", started.elapsed().as_secs_f64());
}

fn exit(message: &str) -> ! {
    eprintln!("window-sim: {message}");
    std::process::exit(2)
}

/// The scenario file (`bench/scenarios/usage_windows.json`).
#[derive(Debug, Clone)]
struct Scenario {
    days: i64,
    seeds: u64,
    first_seed: u64,
    accounts: Vec<AccountSpec>,
    requests_min: u32,
    requests_max: u32,
    weekday_rate: f64,
    weekend_rate: f64,
    gap_seconds: (i64, i64),
    request_ms: i64,
    concurrency_limit: i32,
    failures_per_request: u32,
}

#[derive(Debug, Clone)]
struct AccountSpec {
    five_hour: i64,
    seven_day: i64,
    reset_day: i64,
    start_utilization: f64,
}

impl Scenario {
    fn parse(text: &str) -> Result<Self, String> {
        let json: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let number = |value: &Value, path: &str| -> Result<f64, String> {
            path.split('.')
                .try_fold(value, |v, key| v.get(key))
                .and_then(Value::as_f64)
                .ok_or_else(|| format!("missing number {path}"))
        };
        let whole = |value: &Value, path: &str| -> Result<i64, String> {
            let n = number(value, path)?;
            (n.fract() == 0.0 && n >= 0.0)
                .then_some(n as i64)
                .ok_or_else(|| format!("{path} is not a whole number"))
        };
        let accounts = json
            .get("accounts")
            .and_then(Value::as_array)
            .ok_or("missing accounts")?
            .iter()
            .map(|a| {
                Ok(AccountSpec {
                    five_hour: whole(a, "five_hour_requests")?,
                    seven_day: whole(a, "seven_day_requests")?,
                    reset_day: whole(a, "seven_day_reset_day")?,
                    start_utilization: number(a, "seven_day_start_utilization")?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let gap = json
            .pointer("/assumptions/request_gap_seconds")
            .and_then(Value::as_array)
            .and_then(|pair| Some((pair.first()?.as_i64()?, pair.get(1)?.as_i64()?)))
            .ok_or("missing assumptions.request_gap_seconds")?;
        let scenario = Scenario {
            days: whole(&json, "days")?,
            seeds: whole(&json, "seeds")? as u64,
            first_seed: whole(&json, "first_seed")? as u64,
            accounts,
            requests_min: whole(&json, "sessions.requests_min")? as u32,
            requests_max: whole(&json, "sessions.requests_max")? as u32,
            weekday_rate: number(&json, "sessions.weekday_rate_of_sustainable")?,
            weekend_rate: number(&json, "sessions.weekend_rate_of_sustainable")?,
            gap_seconds: gap,
            request_ms: whole(&json, "assumptions.request_seconds")? * SECOND,
            concurrency_limit: whole(&json, "assumptions.concurrency_limit")? as i32,
            failures_per_request: whole(&json, "assumptions.upstream_failures_per_request")? as u32,
        };
        if scenario.accounts.is_empty()
            || scenario.requests_min == 0
            || scenario.requests_min > scenario.requests_max
            || scenario.gap_seconds.0 > scenario.gap_seconds.1
            || scenario.days == 0
        {
            return Err("an empty or inverted range".into());
        }
        Ok(scenario)
    }

    /// The pool's 7-day capacity spread evenly, in requests per ms.
    fn sustainable_per_ms(&self) -> f64 {
        self.accounts
            .iter()
            .map(|a| a.seven_day as f64)
            .sum::<f64>()
            / (7 * DAY) as f64
    }

    fn rate_factor(&self, day: i64) -> f64 {
        // Day 0 is a Monday.
        if day.rem_euclid(7) >= 5 {
            self.weekend_rate
        } else {
            self.weekday_rate
        }
    }
}

/// One request of one session, at a virtual time (ms from the start).
#[derive(Debug, Clone, Copy)]
struct Request {
    at: i64,
    session: usize,
}

/// The sessions of one seed, as requests in time order: the same for both policies.
fn arrivals(scenario: &Scenario, seed: u64) -> (Vec<Request>, usize) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let end = scenario.days * DAY;
    let mean_length = f64::from(scenario.requests_min + scenario.requests_max) / 2.0;
    let mut requests = Vec::new();
    let mut sessions = 0;
    let mut t = 0_i64;
    while t < end {
        let day = t / DAY;
        let per_ms = scenario.sustainable_per_ms() * scenario.rate_factor(day) / mean_length;
        let wait = -(1.0 - rng.f64()).ln() / per_ms;
        let next_day = (day + 1) * DAY;
        if (t as f64 + wait) >= next_day as f64 {
            // Poisson arrivals are memoryless: start over at the rate change.
            t = next_day;
            continue;
        }
        t += wait.max(1.0) as i64;
        let length = rng.u32(scenario.requests_min..=scenario.requests_max);
        let mut at = t;
        for _ in 0..length {
            if at >= end {
                break;
            }
            requests.push(Request {
                at,
                session: sessions,
            });
            at += rng.i64(scenario.gap_seconds.0..=scenario.gap_seconds.1) * SECOND;
        }
        sessions += 1;
    }
    requests.sort_by_key(|r| (r.at, r.session));
    (requests, sessions)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// Priority + concurrency headroom, blocked on a 429 until the reset (the policy before usage windows were read).
    Today,
    /// The same, given each account's window assessment.
    Windows,
}

/// One account as the upstream keeps it, and what the relay last read of it.
struct Upstream {
    account: Arc<Account>,
    five_limit: i64,
    seven_limit: i64,
    five_used: i64,
    /// The running 5-hour window's end; `None`: no window running.
    five_end: Option<i64>,
    seven_used: i64,
    seven_reset: i64,
    expired: i64,
    blocked_until: i64,
    running: VecDeque<i64>,
    readings: Vec<WindowReading>,
}

impl Upstream {
    fn new(id: AccountId, spec: &AccountSpec, concurrency_limit: i32) -> Self {
        Upstream {
            account: Arc::new(Account {
                serves: Vec::new(),
                id,
                name: format!("sim-{id}"),
                group: "sim".into(),
                platform: Platform::Anthropic,
                base_url: "http://sim.invalid".into(),
                credential_kind: CredentialKind::OAuth,
                credential: Secret::new("sim"),
                oauth: None,
                status: AccountStatus::Active,
                status_reason: String::new(),
                priority: 0,
                weight: 1,
                concurrency_limit,
                rpm_limit: 0,
                session_window_limit_usd: 0.0,
                allowed_models: vec![],
                model_mapping: Default::default(),
                proxy_url: None,
                probe_model: None,
                stream_usage: true,
                identity: Default::default(),
            }),
            five_limit: spec.five_hour,
            seven_limit: spec.seven_day,
            five_used: 0,
            five_end: None,
            seven_used: (spec.start_utilization * spec.seven_day as f64).round() as i64,
            seven_reset: spec.reset_day * DAY,
            expired: 0,
            blocked_until: 0,
            running: VecDeque::new(),
            readings: Vec::new(),
        }
    }

    /// Moves the upstream's windows to `now`: resets at or before it happen, and what the week
    /// left unused expires.
    fn advance(&mut self, now: i64) {
        while self.seven_reset <= now {
            self.expired += (self.seven_limit - self.seven_used).max(0);
            self.seven_used = 0;
            self.seven_reset += 7 * DAY;
        }
        if self.five_end.is_some_and(|end| end <= now) {
            self.five_used = 0;
            self.five_end = None;
        }
        while self.running.front().is_some_and(|&end| end <= now) {
            self.running.pop_front();
        }
    }

    fn has_room(&self) -> bool {
        self.five_used < self.five_limit && self.seven_used < self.seven_limit
    }

    /// What the answer's headers say, as `read_windows` would read them.
    fn read(&mut self, now: i64, rejected: bool) {
        let reading = |kind, used: i64, limit: i64, reset: i64, length: i64| WindowReading {
            kind,
            scope: Scope::Account,
            utilization: Some((used as f64 / limit as f64).min(1.0)),
            reset_at_ms: START_MS + reset,
            length_ms: Some(length),
            status: if rejected && used >= limit {
                WindowStatus::Rejected
            } else {
                WindowStatus::Allowed
            },
            observed_at_ms: START_MS + now,
        };
        self.readings.clear();
        if let Some(end) = self.five_end {
            self.readings.push(reading(
                WindowKind::FiveHour,
                self.five_used,
                self.five_limit,
                end,
                5 * HOUR,
            ));
        }
        self.readings.push(reading(
            WindowKind::SevenDay,
            self.seven_used,
            self.seven_limit,
            self.seven_reset,
            7 * DAY,
        ));
    }
}

/// One run's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Outcome {
    requests: u64,
    served: u64,
    refused: u64,
    refused_with_headroom: u64,
    expired: i64,
    moved: u64,
    waited: u64,
}

impl Outcome {
    fn moved_percent(&self) -> f64 {
        100.0 * self.moved as f64 / self.requests.max(1) as f64
    }
}

fn simulate(scenario: &Scenario, seed: u64, policy: Policy) -> Outcome {
    let (requests, sessions) = arrivals(scenario, seed);
    let mut upstreams: Vec<Upstream> = scenario
        .accounts
        .iter()
        .enumerate()
        .map(|(i, spec)| Upstream::new(i as AccountId + 1, spec, scenario.concurrency_limit))
        .collect();
    let mut sticky: Vec<Option<AccountId>> = vec![None; sessions];
    let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let thresholds = Thresholds::default();
    let mut outcome = Outcome::default();
    for request in requests {
        let now = request.at;
        outcome.requests += 1;
        for upstream in &mut upstreams {
            upstream.advance(now);
        }
        let candidates: Vec<Candidate> = upstreams
            .iter()
            .filter(|u| u.blocked_until <= now)
            .map(|u| Candidate {
                account: u.account.clone(),
                health: Some(AccountHealth {
                    inflight: Some(u.running.len() as u32),
                    ..AccountHealth::HEALTHY
                }),
                windows: (policy == Policy::Windows)
                    .then(|| assess(&u.readings, START_MS + now, thresholds)),
            })
            .collect();
        let (ordered, _) = order(candidates, sticky[request.session], &mut rng);
        let mut served = None;
        let mut failures = 0;
        // A full account is skipped at no cost (admission's local limit); when every one is
        // full the relay waits for a slot, modelled as a second pass that ignores the limit.
        for pass in 0..2 {
            for candidate in &ordered {
                let index = (candidate.account.id - 1) as usize;
                let upstream = &mut upstreams[index];
                if upstream.blocked_until > now {
                    continue;
                }
                if pass == 0 && upstream.running.len() as i32 >= scenario.concurrency_limit {
                    continue;
                }
                if !upstream.has_room() {
                    // 429, window exhausted: hard-blocked until the exhausted window resets.
                    let mut until = now;
                    if upstream.five_used >= upstream.five_limit {
                        until = until.max(upstream.five_end.unwrap_or(now));
                    }
                    if upstream.seven_used >= upstream.seven_limit {
                        until = until.max(upstream.seven_reset);
                    }
                    upstream.blocked_until = until;
                    upstream.read(now, true);
                    failures += 1;
                    if failures >= scenario.failures_per_request {
                        break;
                    }
                    continue;
                }
                if upstream.five_end.is_none() {
                    upstream.five_end = Some(now + 5 * HOUR);
                }
                upstream.five_used += 1;
                upstream.seven_used += 1;
                upstream.running.push_back(now + scenario.request_ms);
                upstream.read(now, false);
                served = Some(candidate.account.id);
                outcome.waited += u64::from(pass == 1);
                break;
            }
            if served.is_some() || failures >= scenario.failures_per_request {
                break;
            }
        }
        match served {
            Some(id) => {
                outcome.served += 1;
                if sticky[request.session].is_some_and(|previous| previous != id) {
                    outcome.moved += 1;
                }
                sticky[request.session] = Some(id);
            }
            None => {
                outcome.refused += 1;
                if upstreams.iter().any(Upstream::has_room) {
                    outcome.refused_with_headroom += 1;
                }
            }
        }
    }
    // Resets at the end of the last day still count.
    for upstream in &mut upstreams {
        upstream.advance(scenario.days * DAY);
        outcome.expired += upstream.expired;
    }
    outcome
}

/// One figure of a run, as a number.
type Figure = fn(&Outcome) -> f64;

struct Report {
    today: Vec<Outcome>,
    windows: Vec<Outcome>,
}

fn run_all(scenario: &Scenario, seeds: u64) -> Report {
    let seeds: Vec<u64> = (0..seeds).map(|i| scenario.first_seed + i).collect();
    Report {
        today: seeds
            .iter()
            .map(|&s| simulate(scenario, s, Policy::Today))
            .collect(),
        windows: seeds
            .iter()
            .map(|&s| simulate(scenario, s, Policy::Windows))
            .collect(),
    }
}

/// Median and range of one figure over the seeds.
fn spread(values: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return (0.0, 0.0, 0.0);
    }
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    (median, values[0], values[n - 1])
}

impl Report {
    fn render(&self, scenario: &Scenario, seeds: u64) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "usage-window scenario: {} accounts, {} days, seeds {}..={}",
            scenario.accounts.len(),
            scenario.days,
            scenario.first_seed,
            scenario.first_seed + seeds - 1
        );
        let _ = writeln!(
            out,
            "{:<30} {:>26} {:>26}",
            "median [min–max] over seeds", "today", "windows"
        );
        let figures: [(&str, Figure); 7] = [
            ("requests", |o| o.requests as f64),
            ("served", |o| o.served as f64),
            ("client-visible refusals", |o| o.refused as f64),
            ("… while an account had room", |o| {
                o.refused_with_headroom as f64
            }),
            ("7-day capacity expired unused", |o| o.expired as f64),
            ("sessions moved", |o| o.moved as f64),
            ("sessions moved, % of requests", Outcome::moved_percent),
        ];
        for (name, figure) in figures {
            let cell = |outcomes: &[Outcome]| {
                let (median, low, high) = spread(outcomes.iter().map(figure));
                if name.contains('%') {
                    format!("{median:.2} [{low:.2}–{high:.2}]")
                } else {
                    format!("{median:.0} [{low:.0}–{high:.0}]")
                }
            };
            let _ = writeln!(
                out,
                "{name:<30} {:>26} {:>26}",
                cell(&self.today),
                cell(&self.windows)
            );
        }
        let median = |outcomes: &[Outcome], figure: Figure| spread(outcomes.iter().map(figure)).0;
        let served_ratio =
            median(&self.windows, |o| o.served as f64) / median(&self.today, |o| o.served as f64);
        let expired_ratio = median(&self.windows, |o| o.expired as f64)
            / median(&self.today, |o| o.expired as f64).max(1.0);
        let ceiling =
            median(&self.today, |o| o.requests as f64) / median(&self.today, |o| o.served as f64);
        let refused_with_room: u64 = self.windows.iter().map(|o| o.refused_with_headroom).sum();
        let worst_moved = spread(self.windows.iter().map(Outcome::moved_percent)).2;
        let verdict = |met: bool| if met { "met" } else { "NOT met" };
        let _ = writeln!(out, "goals (windows against today):");
        let _ = writeln!(
            out,
            "  served >= 1.2x today's (medians): {served_ratio:.3}x: {}",
            verdict(served_ratio >= 1.2)
        );
        let _ = writeln!(
            out,
            "    (serving every request would be {ceiling:.3}x: the most any ordering can reach)"
        );
        let _ = writeln!(
            out,
            "  expired capacity <= half of today's (medians): {expired_ratio:.3}x: {}",
            verdict(expired_ratio <= 0.5)
        );
        let _ = writeln!(
            out,
            "  no refusal while an account had room (every seed): {refused_with_room}: {}",
            verdict(refused_with_room == 0)
        );
        let _ = writeln!(
            out,
            "  sessions moved < 2 % of requests (worst seed): {worst_moved:.2} %: {}",
            verdict(worst_moved < 2.0)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario() -> Scenario {
        let text = include_str!("../scenarios/usage_windows.json");
        Scenario::parse(text).expect("the committed scenario parses")
    }

    #[test]
    fn a_seed_replays_to_the_same_figures_and_every_request_is_counted_once() {
        let scenario = scenario();
        for policy in [Policy::Today, Policy::Windows] {
            let first = simulate(&scenario, 1, policy);
            assert_eq!(first, simulate(&scenario, 1, policy));
            assert_eq!(first.served + first.refused, first.requests);
            assert!(first.requests > 10_000, "{first:?}");
        }
    }

    #[test]
    fn both_policies_see_the_same_sessions() {
        let scenario = scenario();
        let today = simulate(&scenario, 3, Policy::Today);
        let windows = simulate(&scenario, 3, Policy::Windows);
        assert_eq!(today.requests, windows.requests);
    }
}
