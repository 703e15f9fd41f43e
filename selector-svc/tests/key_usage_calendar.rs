//! A client key's usage per period in the deployment's budget calendar (docs/DESIGN.md §6, "What
//! a client key reaches"): `DescribeKey` (the self-service view) and the operator's
//! `ListApiKeys` sum the usage ledger over the day, week and month of `--budget-time-zone`, the
//! periods admission counts budgets in, so the spend they show is each budget's; the operator's
//! `keys` line shows it against the key's budgets.

use crate::support;

use poolgate_core::keys::UsagePeriod;
use poolgate_core::lease::KeyLimits;
use poolgate_core::now_ms;
use poolgate_lease::calendar::{Calendar, Periods};
use poolgate_operator::grpc::api_key_row;
use poolgate_operator::verb::key_line;
use poolgate_proto::selector::v1 as pb;
use poolgate_select::source::UsageInput;
use support::{Backends, Replica, admin, fast_settings};

const HOUR_MS: i64 = 3_600_000;

fn usage(api_key_id: i64, cost_usd: f64, at_ms: i64) -> UsageInput {
    UsageInput {
        api_key_id: Some(api_key_id),
        user: "alice".into(),
        account_id: None,
        model: "claude-sonnet-4-5".into(),
        input_tokens: 10,
        output_tokens: 5,
        cache_write_tokens: 0,
        cache_read_tokens: 0,
        cost_usd,
        price_source: None,
        status: 200,
        latency_ms: 1,
        at_ms: Some(at_ms),
    }
}

/// Whether `from_ms` is where `calendar`'s period (`pick`) containing `now_ms` began: the
/// instant before it is in another period, the instant itself in this one.
fn starts_the_period(
    calendar: &Calendar,
    pick: fn(Periods) -> String,
    from_ms: i64,
    now_ms: i64,
) -> bool {
    let now = pick(calendar.periods(now_ms));
    pick(calendar.periods(from_ms)) == now && pick(calendar.periods(from_ms - 1)) != now
}

/// Tokyo (UTC+9, no DST): from 15:00 UTC its date is a day ahead of UTC's, so Tokyo's day and
/// UTC's always differ by nine hours, whenever the test runs. A record just after Tokyo's
/// midnight counts in the day, one just before does not; in a UTC calendar one of the two would
/// be counted wrong (before 15:00 UTC the first is in UTC's yesterday, after it the second is
/// in UTC's today).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_key_and_the_operators_list_sum_usage_in_the_deployments_calendar() {
    let backends = Backends::start().await;
    backends.account("a", "g", |_| {}).await;
    let store = &backends.store;
    let limits = KeyLimits {
        budget_day_micros: 5_000_000,
        budget_month_micros: 60_000_000,
        ..KeyLimits::default()
    };
    let (id, secret) = store
        .create_api_key_with_limits("ci", "alice", "g", 0, &Default::default(), &limits)
        .await
        .expect("created");
    let zone = "Asia/Tokyo";
    let calendar = Calendar::new(zone, Default::default()).expect("zone");
    let now = now_ms();
    let day_start = calendar.periods(now).day.ends_ms - 24 * HOUR_MS;
    store
        .insert_usage(&[
            // Just after Tokyo's midnight: today.
            usage(id, 0.75, day_start + 1_000),
            usage(id, 0.45, now - 1_000),
            // Just before it: Tokyo's yesterday, in the total only (and in the week and month
            // unless today is their first day).
            usage(id, 2.0, day_start - 60_000),
        ])
        .await
        .expect("usage recorded");
    let mut config = backends.config(fast_settings());
    config.lease_settings.budget_time_zone = zone.into();
    let replica = Replica::start(config).await;

    let described = replica
        .built
        .selector
        .describe_key(secret.expose())
        .await
        .expect("described");
    let period = |wanted: UsagePeriod| {
        described
            .usage
            .iter()
            .find(|(period, _, _)| *period == wanted)
            .copied()
            .expect("every period is described")
    };
    let (_, day_from, day) = period(UsagePeriod::Day);
    assert_eq!(day_from, day_start, "the day begins at Tokyo's midnight");
    assert_eq!(
        (day.requests, day.cost_usd),
        (2, 1.2),
        "today's records only"
    );
    let (_, total_from, total) = period(UsagePeriod::Total);
    assert_eq!((total_from, total.requests), (0, 3));
    let (_, week_from, week) = period(UsagePeriod::Week);
    assert!(
        starts_the_period(&calendar, |p| p.week.id, week_from, now),
        "the week begins at Tokyo's midnight of its first day"
    );
    let (_, month_from, month) = period(UsagePeriod::Month);
    assert!(
        starts_the_period(&calendar, |p| p.month.id, month_from, now),
        "the month begins at Tokyo's midnight of its 1st"
    );
    let yesterday_in = |from_ms: i64| if from_ms <= day_start - 60_000 { 3 } else { 2 };
    assert_eq!(week.requests, yesterday_in(week_from));
    assert_eq!(month.requests, yesterday_in(month_from));

    // The operator's list: the same usage by key id, against the key's budgets.
    let listed = replica
        .admin
        .clone()
        .list_api_keys(admin(pb::ListApiKeysRequest {}))
        .await
        .expect("listed")
        .into_inner();
    let view = listed
        .keys
        .into_iter()
        .find(|key| key.id == id)
        .expect("the key is listed");
    let day_view = view
        .usage
        .iter()
        .find(|usage| usage.period == "day")
        .expect("the day's usage is listed");
    assert_eq!(
        (day_view.from_ms, day_view.requests, day_view.cost_usd),
        (day_start, 2, 1.2)
    );
    let row = api_key_row(view).expect("readable");
    let month_spent = format!("{:.2}", month.cost_usd);
    assert!(
        key_line(&row, now).ends_with(&format!("\tbudgets_usd=day:1.20/5,month:{month_spent}/60")),
        "{}",
        key_line(&row, now)
    );
    let day_row = row.usage_in("day").expect("the day's usage");
    assert_eq!(day_row.remaining_usd, Some(5.0 - 1.2));
}
