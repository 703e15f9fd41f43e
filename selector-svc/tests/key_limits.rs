//! A client key's own limits on the selector's side (docs/DESIGN.md §4 "Client key limits", §6):
//! the store keeps a key's concurrency, TPM and budgets (migration 0007) and changes only what an
//! update gives; `CreateApiKey`, `UpdateApiKey`, `ListApiKeys`, `Authenticate` and `DescribeKey`
//! carry them; bad input is `INVALID_ARGUMENT` naming the field; and admission's budget counters,
//! lost to a Redis flush, are rebuilt from the usage ledger over the deployment's calendar.

use crate::support;

use std::time::Duration;

use poolgate_core::lease::KeyLimits;
use poolgate_core::now_ms;
use poolgate_lease::calendar::Calendar;
use poolgate_proto::convert::keys::{KeyUpdate, authenticated_limits};
use poolgate_proto::selector::v1 as pb;
use poolgate_runtime::redis_keys::client_key_spend;
use poolgate_select::crypto::api_key_hash;
use poolgate_select::source::UsageInput;
use poolgate_testkit::eventually;
use support::{Backends, Replica, admin, fast_settings};

fn limits() -> KeyLimits {
    KeyLimits {
        api_key_id: 0,
        concurrency_limit: 2,
        tpm_limit: 50_000,
        budget_total_micros: 100_000_000,
        budget_day_micros: 1_500_000,
        budget_week_micros: 5_000_000,
        budget_month_micros: 20_250_000,
    }
}

async fn served_limits(backends: &Backends, secret: &str) -> Option<KeyLimits> {
    let snapshot = backends.store.load_snapshot().await.expect("snapshot");
    snapshot
        .api_key(&api_key_hash(secret))
        .map(|record| record.limits.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_keeps_a_keys_limits_and_an_update_changes_only_those_it_gives() {
    let backends = Backends::start().await;
    backends.account("a", "g", |_| {}).await;
    let store = &backends.store;
    let (id, secret) = store
        .create_api_key_with_limits("ci", "alice", "g", 30, &Default::default(), &limits())
        .await
        .expect("created");
    let with_id = KeyLimits {
        api_key_id: id,
        ..limits()
    };
    assert_eq!(
        served_limits(&backends, secret.expose()).await,
        Some(with_id.clone())
    );

    // Concurrency cleared, the day's budget changed; the rest stays.
    let changed = store
        .update_api_key(
            id,
            &KeyUpdate {
                concurrency_limit: Some(0),
                budget_day_micros: Some(2_500_000),
                ..Default::default()
            },
        )
        .await
        .expect("changed");
    let expected = KeyLimits {
        concurrency_limit: 0,
        budget_day_micros: 2_500_000,
        ..with_id.clone()
    };
    assert_eq!(changed.limits, expected);
    assert_eq!(
        served_limits(&backends, secret.expose()).await,
        Some(expected.clone())
    );
    // An update of something else leaves every limit as it is.
    let disabled = store
        .update_api_key(
            id,
            &KeyUpdate {
                disabled: Some(true),
                ..Default::default()
            },
        )
        .await
        .expect("disabled");
    assert_eq!(disabled.limits, expected);

    // A key created without limits, and one written as before migration 0007, have none.
    let (plain_id, plain) = store
        .create_api_key("plain", "bob", "g", 0)
        .await
        .expect("created");
    assert_eq!(
        served_limits(&backends, plain.expose()).await,
        Some(KeyLimits {
            api_key_id: plain_id,
            ..KeyLimits::default()
        })
    );
    sqlx::query(
        "INSERT INTO api_keys (name, key_hash, key_prefix, user_name, group_id) \
         SELECT 'old', $1, 'old', 'carol', id FROM groups WHERE name = 'g'",
    )
    .bind(api_key_hash("an-old-key"))
    .execute(store.pool())
    .await
    .expect("an old-style insert");
    let old = served_limits(&backends, "an-old-key")
        .await
        .expect("served");
    assert!(!old.any(), "no limits: {old:?}");

    // The schema refuses what the admin API refuses.
    for change in [
        "UPDATE api_keys SET concurrency_limit = -1 WHERE id = $1",
        "UPDATE api_keys SET tpm_limit = -1 WHERE id = $1",
        "UPDATE api_keys SET budget_total_usd = -0.5 WHERE id = $1",
        "UPDATE api_keys SET budget_day_usd = 'NaN' WHERE id = $1",
        "UPDATE api_keys SET budget_week_usd = 'Infinity' WHERE id = $1",
        "UPDATE api_keys SET budget_month_usd = 2000000 WHERE id = $1",
    ] {
        let refused = sqlx::query(change).bind(id).execute(store.pool()).await;
        assert!(refused.is_err(), "{change} is refused by a check");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_limits_go_through_every_key_rpc_and_bad_ones_are_refused_naming_the_field() {
    let backends = Backends::start().await;
    backends.account("a", "g", |_| {}).await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let created = replica
        .admin
        .clone()
        .create_api_key(admin(pb::CreateApiKeyRequest {
            user: "alice".into(),
            group: "g".into(),
            key_concurrency_limit: 2,
            key_tpm_limit: 50_000,
            key_budget_total_usd: 100.0,
            key_budget_day_usd: 1.5,
            key_budget_week_usd: 5.0,
            key_budget_month_usd: 20.25,
            ..Default::default()
        }))
        .await
        .expect("created")
        .into_inner();
    let with_id = KeyLimits {
        api_key_id: created.id,
        ..limits()
    };
    let authenticate = || async {
        replica
            .client
            .clone()
            .authenticate(pb::AuthenticateRequest {
                api_key: created.api_key.clone(),
            })
            .await
            .expect("authenticated")
            .into_inner()
    };
    let answer = authenticate().await;
    assert_eq!(answer.key_budget_month_usd, 20.25);
    assert_eq!(authenticated_limits(&answer), Ok(with_id.clone()));

    let view = replica
        .admin
        .clone()
        .update_api_key(admin(pb::UpdateApiKeyRequest {
            id: created.id,
            key_tpm_limit: Some(0),
            key_budget_week_usd: Some(7.5),
            ..Default::default()
        }))
        .await
        .expect("updated")
        .into_inner();
    assert_eq!(
        (
            view.key_concurrency_limit,
            view.key_tpm_limit,
            view.key_budget_week_usd,
            view.key_budget_total_usd
        ),
        (2, 0, 7.5, 100.0)
    );
    let expected = KeyLimits {
        tpm_limit: 0,
        budget_week_micros: 7_500_000,
        ..with_id
    };
    assert_eq!(authenticated_limits(&authenticate().await), Ok(expected));
    let described = replica
        .client
        .clone()
        .describe_key(pb::DescribeKeyRequest {
            api_key: created.api_key.clone(),
        })
        .await
        .expect("described")
        .into_inner();
    assert_eq!(
        (
            described.key_concurrency_limit,
            described.key_tpm_limit,
            described.key_budget_day_usd,
            described.key_budget_week_usd
        ),
        (2, 0, 1.5, 7.5)
    );
    let listed = replica
        .admin
        .clone()
        .list_api_keys(admin(pb::ListApiKeysRequest {}))
        .await
        .expect("listed")
        .into_inner();
    assert_eq!(listed.keys.len(), 1);
    assert_eq!(listed.keys[0].key_budget_month_usd, 20.25);

    let new_key = pb::CreateApiKeyRequest {
        user: "bob".into(),
        group: "g".into(),
        ..Default::default()
    };
    let creates = [
        (
            pb::CreateApiKeyRequest {
                key_concurrency_limit: -1,
                ..new_key.clone()
            },
            "key_concurrency_limit",
        ),
        (
            pb::CreateApiKeyRequest {
                key_tpm_limit: -1,
                ..new_key.clone()
            },
            "key_tpm_limit",
        ),
        (
            pb::CreateApiKeyRequest {
                key_budget_total_usd: f64::NAN,
                ..new_key.clone()
            },
            "key_budget_total_usd",
        ),
        (
            pb::CreateApiKeyRequest {
                key_budget_month_usd: 1e12,
                ..new_key
            },
            "key_budget_month_usd",
        ),
    ];
    for (request, field) in creates {
        let refused = replica
            .admin
            .clone()
            .create_api_key(admin(request))
            .await
            .expect_err(field);
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{field}");
        assert!(
            refused.message().starts_with(&format!("invalid {field}:")),
            "{field}: {}",
            refused.message()
        );
    }
    let updates = [
        (
            pb::UpdateApiKeyRequest {
                id: created.id,
                key_budget_day_usd: Some(-1.0),
                ..Default::default()
            },
            "key_budget_day_usd",
        ),
        (
            pb::UpdateApiKeyRequest {
                id: created.id,
                key_concurrency_limit: Some(-3),
                ..Default::default()
            },
            "key_concurrency_limit",
        ),
        (
            pb::UpdateApiKeyRequest {
                id: created.id,
                key_budget_week_usd: Some(f64::INFINITY),
                ..Default::default()
            },
            "key_budget_week_usd",
        ),
    ];
    for (request, field) in updates {
        let refused = replica
            .admin
            .clone()
            .update_api_key(admin(request))
            .await
            .expect_err(field);
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{field}");
        assert!(
            refused.message().starts_with(&format!("invalid {field}:")),
            "{field}: {}",
            refused.message()
        );
    }
    let keys = backends.store.list_api_keys().await.expect("list");
    assert_eq!(keys.len(), 1, "no refused key was created");
    assert_eq!(
        keys[0].limits.budget_day_micros, 1_500_000,
        "a refused update changed nothing"
    );
}

fn usage(api_key_id: i64, cost_usd: f64, at_ms: i64) -> UsageInput {
    UsageInput {
        api_key_id: Some(api_key_id),
        user: "alice".into(),
        account_id: None,
        model: "claude-sonnet-4-5".into(),
        input_tokens: 10,
        output_tokens: 10,
        cache_write_tokens: 0,
        cache_read_tokens: 0,
        cost_usd,
        price_source: None,
        status: 200,
        latency_ms: 1,
        at_ms: Some(at_ms),
    }
}

/// A budget counter as admission keeps it in Redis (`None`: absent).
async fn counter(backends: &Backends, api_key_id: i64, period: &str) -> Option<i64> {
    let mut redis = backends.redis.client().await.expect("redis");
    redis::cmd("GET")
        .arg(client_key_spend(api_key_id, period))
        .query_async::<Option<i64>>(&mut redis)
        .await
        .expect("get")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_lost_to_a_redis_flush_is_rebuilt_from_the_ledger_in_the_deployments_calendar() {
    let backends = Backends::start().await;
    backends.account("a", "g", |_| {}).await;
    let store = &backends.store;
    let budgeted = KeyLimits {
        concurrency_limit: 0,
        tpm_limit: 0,
        budget_week_micros: 0,
        budget_month_micros: 0,
        ..limits()
    };
    let (id, _) = store
        .create_api_key_with_limits("ci", "alice", "g", 0, &Default::default(), &budgeted)
        .await
        .expect("created");
    let (unbudgeted, _) = store
        .create_api_key_with_limits(
            "rate",
            "bob",
            "g",
            0,
            &Default::default(),
            &KeyLimits {
                concurrency_limit: 3,
                ..KeyLimits::default()
            },
        )
        .await
        .expect("created");
    // Tokyo (UTC+9, no DST): the ledger is summed over Tokyo's day, as admission counts it.
    let zone = "Asia/Tokyo";
    let calendar = Calendar::new(zone, Default::default()).expect("zone");
    let now = now_ms();
    let day = calendar.periods(now).day;
    let day_start = day.ends_ms - 24 * 3_600_000;
    store
        .insert_usage(&[
            usage(id, 0.75, day_start + 1_000),
            usage(id, 0.5, now - 1_000),
            // Tokyo's yesterday: in the total, not in the day.
            usage(id, 2.0, day_start - 60_000),
            usage(unbudgeted, 9.0, now - 1_000),
        ])
        .await
        .expect("usage recorded");
    let mut config = backends.config(fast_settings());
    config.lease_settings.budget_time_zone = zone.into();
    let replica = Replica::start(config).await;

    // At start: the counters the ledger says, only for the budgets set.
    eventually(Duration::from_secs(5), || async {
        (counter(&backends, id, &day.id).await == Some(1_250_000)).then_some(())
    })
    .await
    .expect("the day's counter is rebuilt at start");
    assert_eq!(counter(&backends, id, "t").await, Some(3_250_000));
    let week = calendar.periods(now).week.id;
    assert_eq!(counter(&backends, id, &week).await, None, "no week budget");
    assert_eq!(counter(&backends, unbudgeted, "t").await, None);
    assert_eq!(counter(&backends, unbudgeted, &day.id).await, None);

    // A counter admission keeps is never touched: a charge since stays counted once.
    let mut redis = backends.redis.client().await.expect("redis");
    redis::cmd("INCRBY")
        .arg(client_key_spend(id, &day.id))
        .arg(100)
        .query_async::<i64>(&mut redis)
        .await
        .expect("a charge");
    let seeded = replica
        .built
        .selector
        .rebuild_budgets(replica.built.budgets.as_ref())
        .await
        .expect("rebuild");
    assert_eq!(seeded, 0);
    assert_eq!(counter(&backends, id, &day.id).await, Some(1_250_100));

    // Flushed: the next rebuild puts the ledger's spend back.
    backends.redis.flush().await.expect("flushed");
    assert_eq!(counter(&backends, id, &day.id).await, None);
    let seeded = replica
        .built
        .selector
        .rebuild_budgets(replica.built.budgets.as_ref())
        .await
        .expect("rebuild");
    assert_eq!(seeded, 2);
    assert_eq!(counter(&backends, id, &day.id).await, Some(1_250_000));
    assert_eq!(counter(&backends, id, "t").await, Some(3_250_000));
}
