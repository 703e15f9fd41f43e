//! `window-stack`'s report: what each policy's run came to, from the tap's log of attempts and
//! the accounts' windows, printed as the figures docs/BENCHMARKS.md quotes.

use std::time::Duration;

use poolgate_bench::stats::Sample;
use poolgate_testkit::fake_upstream::FakeUpstream;

use super::*;

pub(super) fn report(
    setup: &Setup,
    upstream: &FakeUpstream,
    log: &[Attempt],
    sent: &[Sent],
    sessions: usize,
    start_ms: i64,
    run_end_ms: i64,
) {
    let run: Vec<&Attempt> = log.iter().filter(|a| a.at_ms >= start_ms).collect();
    let served_by = |seq: u64| {
        run.iter()
            .find(|a| a.seq == Some(seq) && a.status == 200)
            .and_then(|a| a.account)
    };
    let seconds = |ms: i64| (ms - start_ms) as f64 / 1000.0;

    // The first request of each session: where new sessions went.
    let mut firsts = std::collections::HashSet::new();
    let mut seen_sessions = std::collections::HashSet::new();
    for s in sent {
        if seen_sessions.insert(s.session) {
            firsts.insert(s.seq);
        }
    }

    // Timeline: requests served per account in each step, and where the upstream says each
    // account stands at the step's end (5-hour / weekly utilization; past a reset: 0).
    println!();
    println!(
        "timeline (per account: requests served in the step (of them, sessions' first requests), then the 5h/7d utilization the upstream last reported, at the step's end)"
    );
    println!(
        "  {:>11} | {:^19} | {:^19} | {:^19} | {:^19} | refused | upstream 429",
        "t (s)", "a", "b", "c", "d"
    );
    let step = setup.ms(STEP_S);
    let mut from = start_ms;
    while from < run_end_ms + step / 2 {
        let to = from + step;
        let mut cells = Vec::new();
        for index in 0..NAMES.len() {
            let here: Vec<u64> = run
                .iter()
                .filter(|a| {
                    a.account == Some(index) && a.status == 200 && (from..to).contains(&a.at_ms)
                })
                .filter_map(|a| a.seq)
                .collect();
            let new = here.iter().filter(|seq| firsts.contains(seq)).count();
            let (five, week) = used(log, index, to);
            cells.push(format!("{:>2} ({new:>2}) {five:.2}/{week:.2}", here.len()));
        }
        let refused = sent
            .iter()
            .filter(|s| s.status != 200 && (from..to).contains(&s.done_ms))
            .count();
        let limited = run
            .iter()
            .filter(|a| a.status == 429 && (from..to).contains(&a.at_ms))
            .count();
        println!(
            "  {:>5.1}–{:<5.1} | {} | {refused:>7} | {limited:>12}",
            seconds(from),
            seconds(to),
            cells.join(" | ")
        );
        from = to;
    }

    // Per account.
    println!();
    println!(
        "  account | served | upstream answers | upstream 429 | fake's count | last reported 5h / 7d | weekly capacity expired unused"
    );
    let mut total_expired = 0;
    for index in 0..NAMES.len() {
        let mine: Vec<&&Attempt> = run.iter().filter(|a| a.account == Some(index)).collect();
        let served = sent
            .iter()
            .filter(|s| s.status == 200 && served_by(s.seq) == Some(index))
            .count();
        let limited = mine.iter().filter(|a| a.status == 429).count();
        let last = mine.iter().rev().find(|a| a.has_reading());
        let shown = |r: Option<Reading>| {
            r.map_or("–".to_owned(), |r| {
                let note = if r.reset_ms <= run_end_ms {
                    " (reset since)"
                } else {
                    ""
                };
                format!("{:.3}{note}", r.used)
            })
        };
        let last_text = last.map_or("none".to_owned(), |a| {
            format!("{} / {}", shown(a.five), shown(a.week))
        });
        // Weekly periods that ended during the run: what was left of each at its reset.
        let mut expired = Vec::new();
        let mut reset = setup.anchor_ms(start_ms, index) + setup.ms(WEEK_S);
        let mut first = true;
        while reset <= run_end_ms {
            let used = log
                .iter()
                .rev()
                .filter(|a| a.account == Some(index) && a.at_ms < reset)
                .find_map(|a| a.week.filter(|w| (w.reset_ms - reset).abs() < 1_000))
                .map_or(if first { START_USED[index] } else { 0.0 }, |w| w.used);
            expired.push(((1.0 - used) * WEEK_CAPACITY as f64).round() as u64);
            reset += setup.ms(WEEK_S);
            first = false;
        }
        total_expired += expired.iter().sum::<u64>();
        println!(
            "  {:>7} | {served:>6} | {:>16} | {limited:>12} | {:>12} | {last_text:>21} | {}",
            NAMES[index],
            mine.len(),
            upstream.stats(&credential(index)).total,
            expired
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" + ")
        );
    }

    // Client side.
    let served = sent.iter().filter(|s| s.status == 200).count();
    let refused: Vec<&Sent> = sent.iter().filter(|s| s.status != 200).collect();
    let mut kinds: Vec<(u16, String, usize)> = Vec::new();
    for s in &refused {
        match kinds
            .iter_mut()
            .find(|(status, error, _)| *status == s.status && *error == s.error)
        {
            Some(kind) => kind.2 += 1,
            None => kinds.push((s.status, s.error.clone(), 1)),
        }
    }
    let with_room: Vec<(&Sent, Vec<(usize, u64)>)> = refused
        .iter()
        .map(|s| {
            let room: Vec<(usize, u64)> = (0..NAMES.len())
                .map(|i| (i, left(log, i, s.done_ms)))
                .filter(|(_, left)| *left > 0)
                .collect();
            (*s, room)
        })
        .filter(|(_, room)| !room.is_empty())
        .collect();
    let mut latency = Sample::new(
        sent.iter()
            .filter(|s| s.status == 200)
            .map(|s| u64::try_from(s.done_ms - s.started_ms).unwrap_or(0) * 1000)
            .collect(),
        0,
        Duration::ZERO,
    );
    println!();
    println!(
        "client: {} sessions, {} requests, {served} served, {} refused{}",
        sessions,
        sent.len(),
        refused.len(),
        if kinds.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                kinds
                    .iter()
                    .map(|(status, error, n)| format!("{n} × {status} {error}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
    println!(
        "  served latency p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        latency.percentile(0.5),
        latency.percentile(0.99),
        latency.percentile(1.0)
    );
    println!(
        "  refused while some account had room (the upstream's last word at the refusal): {}",
        with_room.len()
    );
    let mut again: Vec<i64> = refused
        .iter()
        .map(|s| room_again_in(log, s.done_ms))
        .collect();
    again.sort_unstable();
    if !again.is_empty() {
        let at = |q: f64| again[((again.len() as f64 - 1.0) * q).round() as usize] as f64 / 1000.0;
        println!(
            "  after a refusal, some account had room again (a used-up window reset) within: min {:.1} s, median {:.1} s, max {:.1} s",
            at(0.0),
            at(0.5),
            at(1.0)
        );
    }
    for (s, room) in with_room.iter().take(12) {
        println!(
            "    t={:.1} s (sent at {:.1} s): {} {}; left: {}",
            seconds(s.done_ms),
            seconds(s.started_ms),
            s.status,
            s.error,
            room.iter()
                .map(|(i, n)| format!("{} {n}", NAMES[*i]))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if with_room.len() > 12 {
        println!("    … and {} more", with_room.len() - 12);
    }

    // Sessions moved: a request served by another account than the session's previous one,
    // by where the previous account stood (the upstream's last word) when it moved.
    let mut moved = [0usize; 3];
    let mut moves = Vec::new();
    let mut last_served: std::collections::HashMap<usize, usize> = Default::default();
    for s in sent.iter().filter(|s| s.status == 200) {
        let Some(account) = served_by(s.seq) else {
            continue;
        };
        if let Some(previous) = last_served.insert(s.session, account)
            && previous != account
        {
            let (five, week) = used(log, previous, s.started_ms);
            let worst = five.max(week);
            moved[if worst >= 1.0 {
                0
            } else if worst >= 0.97 {
                1
            } else {
                2
            }] += 1;
            let tried = run
                .iter()
                .filter(|a| a.seq == Some(s.seq))
                .map(|a| format!("{} {}", a.account.map_or("?", |i| NAMES[i]), a.status))
                .collect::<Vec<_>>()
                .join(", ");
            moves.push(format!(
                "    t={:.1} s: {} -> {} ({} at 5h {five:.2} / 7d {week:.2}); upstream answers: {tried}",
                seconds(s.started_ms),
                NAMES[previous],
                NAMES[account],
                NAMES[previous],
            ));
        }
    }
    println!(
        "  sessions moved: {} ({:.1} % of requests served); previous account used up: {}, at >= 0.97: {}, below: {}",
        moved.iter().sum::<usize>(),
        100.0 * moved.iter().sum::<usize>() as f64 / served.max(1) as f64,
        moved[0],
        moved[1],
        moved[2]
    );
    for line in moves.iter().take(20) {
        println!("{line}");
    }
    if moves.len() > 20 {
        println!("    … and {} more", moves.len() - 20);
    }

    // Upstream 429s the relay could have seen coming: sent to an account whose last answer
    // (back before the request left) already said a window was used up and not yet reset.
    let mut foreseen = Vec::new();
    for (position, attempt) in run.iter().enumerate().filter(|(_, a)| a.status == 429) {
        let Some(index) = attempt.account else {
            continue;
        };
        let before = log
            .iter()
            .filter(|a| a.at_ms <= attempt.sent_ms && a.account == Some(index))
            .filter(|a| a.has_reading())
            .max_by_key(|a| a.sent_ms);
        if let Some(before) = before
            && [before.five, before.week]
                .into_iter()
                .flatten()
                .any(|r| r.used >= 1.0 && r.reset_ms > attempt.sent_ms)
        {
            foreseen.push((position, attempt.sent_ms - before.at_ms));
        }
    }
    foreseen.sort_by_key(|(_, lag)| *lag);
    let mut per_request: std::collections::HashMap<u64, usize> = Default::default();
    for attempt in run.iter().filter(|a| a.status == 429) {
        if let Some(seq) = attempt.seq {
            *per_request.entry(seq).or_default() += 1;
        }
    }
    let lag = |q: f64| {
        foreseen
            .get(((foreseen.len() as f64 - 1.0) * q).round() as usize)
            .map_or(0, |(_, lag)| *lag)
    };
    println!(
        "  upstream 429s sent to an account whose last answer already said a window was used up: {} of {} (that answer {}–{} ms old, median {} ms); requests with 429s before their answer: {} (at most {} each)",
        foreseen.len(),
        run.iter().filter(|a| a.status == 429).count(),
        lag(0.0),
        lag(1.0),
        lag(0.5),
        per_request.len(),
        per_request.values().max().copied().unwrap_or(0)
    );

    // Readings that arrive out of order: an answer admitted earlier (and so reporting less
    // used) arriving after a later one of the same window period. Kept by arrival, as the
    // relay keeps "the newest reading", it would roll that window back.
    let (mut rolled_back, mut from_used_up) = (0, 0);
    for index in 0..NAMES.len() {
        let mut newest: [Option<Reading>; 2] = [None, None];
        for attempt in run.iter().filter(|a| a.account == Some(index)) {
            for (slot, reading) in newest.iter_mut().zip([attempt.five, attempt.week]) {
                let Some(reading) = reading else {
                    continue;
                };
                if let Some(kept) = slot
                    && kept.reset_ms == reading.reset_ms
                    && reading.used < kept.used
                {
                    rolled_back += 1;
                    if kept.used >= 1.0 {
                        from_used_up += 1;
                    }
                }
                *slot = Some(reading);
            }
        }
    }
    println!(
        "  window readings arriving after a fresher one of the same period (lower utilization): {rolled_back}, {from_used_up} of them after one that said used up"
    );

    // Each upstream 429, next to the freshest answer of that account the relay had when it sent
    // the request.
    let refusals: Vec<&&Attempt> = run.iter().filter(|a| a.status == 429).collect();
    if !refusals.is_empty() {
        println!(
            "  upstream 429s (and the freshest answer of that account back before the request left):"
        );
    }
    for attempt in refusals.iter().take(20) {
        let Some(index) = attempt.account else {
            continue;
        };
        let before = log
            .iter()
            .filter(|a| a.at_ms <= attempt.sent_ms && a.account == Some(index))
            .filter(|a| a.has_reading())
            .max_by_key(|a| a.sent_ms);
        let window = |r: Option<Reading>| r.map_or("–".to_owned(), |r| format!("{:.3}", r.used));
        println!(
            "    t={:.2} s: {} refused request {}{}",
            seconds(attempt.sent_ms),
            NAMES[index],
            attempt.seq.map_or("?".to_owned(), |s| s.to_string()),
            before.map_or(String::new(), |b| format!(
                "; answered {:.0} ms before: {} with 5h {} / 7d {}",
                attempt.sent_ms - b.at_ms,
                b.status,
                window(b.five),
                window(b.week)
            ))
        );
    }
    let limited = run.iter().filter(|a| a.status == 429).count();
    let probes = run.iter().filter(|a| a.probe).count();
    println!(
        "upstream: {} answers in the run, {limited} of them 429 (window used up), {probes} selector probes; weekly capacity expired unused: {total_expired} requests",
        run.len()
    );
    println!();
}
