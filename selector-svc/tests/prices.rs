//! The operator's price verbs against a running selector (distributed mode), over real Postgres
//! and Redis (docs/DESIGN.md §6, "Prices"): `prices` lists the shipped catalogue and the
//! operator's prices with their sources; `set-price` overrides the catalogue in the plans at
//! once and in `model_prices` for every replica; bad input exits 2 naming the field and changes
//! nothing; `remove-price` brings the catalogue's back. Plans say where each price came from, a
//! model released tomorrow getting its family's highest catalogue price; `usage` shows each
//! model's usage with the price it was charged at.

use crate::support;

use clap::Parser;
use poolgate_operator::grpc::SelectorAdmin;
use poolgate_operator::{OperatorError, Verb};
use poolgate_proto::selector::v1 as pb;
use support::{
    ADMIN_TOKEN, Backends, Replica, SERVICE_TOKEN, admin, fast_settings, select_request,
};

#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

fn verb(args: &[&str]) -> Verb {
    Cli::try_parse_from(std::iter::once("admin").chain(args.iter().copied()))
        .expect("a verb")
        .verb
}

async fn operator(replica: &Replica) -> SelectorAdmin {
    SelectorAdmin::connect(
        &format!("http://{}", replica.addr),
        ADMIN_TOKEN,
        Some(SERVICE_TOKEN),
    )
    .await
    .expect("connects")
}

/// The first plan account's price and source for `model`.
async fn planned(replica: &Replica, model: &str) -> (Option<pb::Price>, pb::PriceSource, String) {
    let plan = replica
        .client
        .clone()
        .select(select_request("g", model))
        .await
        .expect("a plan")
        .into_inner();
    let account = plan.accounts.first().expect("an account");
    (
        account.price,
        account.price_source(),
        account.price_fallback_from.clone(),
    )
}

fn line_of<'a>(listing: &'a str, model: &str) -> &'a str {
    listing
        .lines()
        .find(|line| line.starts_with(&format!("{model}\t")))
        .unwrap_or_else(|| panic!("{model} listed in {listing}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prices_are_listed_set_and_removed_without_sql_and_plans_say_where_they_came_from() {
    let backends = Backends::start().await;
    backends.account("acct-a", "g", |_| {}).await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let operator = operator(&replica).await;
    let run = |args: &'static [&'static str]| {
        let operator = &operator;
        async move { poolgate_operator::execute(operator, &verb(args)).await }
    };

    // The catalogue ships with the build: listed, and in the plans, with no row written.
    let listing = run(&["prices"]).await.expect("listed");
    assert_eq!(
        line_of(&listing, "claude-opus-5-5"),
        "claude-opus-5-5\tsource=catalogue\tinput=4\toutput=20\tcache_write=5\tcache_read=0.2"
    );
    let (price, source, _) = planned(&replica, "claude-opus-5-5").await;
    assert_eq!(source, pb::PriceSource::Catalogue);
    assert_eq!(price.map(|p| p.input_per_mtok), Some(4.0));
    // A model released tomorrow: its family's highest catalogue price, and the plan says so.
    let (price, source, from) = planned(&replica, "claude-opus-6").await;
    assert_eq!(
        (source, from.as_str(), price.map(|p| p.output_per_mtok)),
        (pb::PriceSource::Fallback, "claude-opus-*", Some(25.0))
    );

    // Set over the catalogue's: served at once, listed as the operator's over the catalogue's.
    let set = run(&[
        "set-price",
        "claude-opus-5-5",
        "--input-usd",
        "1",
        "--output-usd",
        "2",
        "--cache-write-usd",
        "1.25",
        "--cache-read-usd",
        "0.1",
    ])
    .await
    .expect("set");
    assert_eq!(
        set,
        "claude-opus-5-5\tsource=operator\tinput=1\toutput=2\tcache_write=1.25\tcache_read=0.1\tcatalogue=4/20/5/0.2"
    );
    let (price, source, _) = planned(&replica, "claude-opus-5-5").await;
    assert_eq!(
        (source, price.map(|p| p.input_per_mtok)),
        (pb::PriceSource::Operator, Some(1.0))
    );
    // A free price is a price: the operator's, not "none".
    run(&[
        "set-price",
        "house-model",
        "--input-usd",
        "0",
        "--output-usd",
        "0",
        "--cache-write-usd",
        "0",
        "--cache-read-usd",
        "0",
    ])
    .await
    .expect("set");
    let (_, source, _) = planned(&replica, "house-model").await;
    assert_eq!(source, pb::PriceSource::Operator);

    // Bad input: exit 2 naming the field, nothing changed.
    let before = run(&["prices"]).await.expect("listed");
    for (args, field) in [
        (
            &[
                "set-price",
                "claude-opus-5-5",
                "--input-usd",
                "-1",
                "--output-usd",
                "2",
                "--cache-write-usd",
                "0",
                "--cache-read-usd",
                "0",
            ][..],
            "input",
        ),
        (
            &[
                "set-price",
                "claude-opus-5-5",
                "--input-usd",
                "1",
                "--output-usd",
                "NaN",
                "--cache-write-usd",
                "0",
                "--cache-read-usd",
                "0",
            ][..],
            "output",
        ),
        (
            &[
                "set-price",
                "",
                "--input-usd",
                "1",
                "--output-usd",
                "1",
                "--cache-write-usd",
                "0",
                "--cache-read-usd",
                "0",
            ][..],
            "model",
        ),
        (
            &[
                "set-price",
                "bad model",
                "--input-usd",
                "1",
                "--output-usd",
                "1",
                "--cache-write-usd",
                "0",
                "--cache-read-usd",
                "0",
            ][..],
            "model",
        ),
    ] {
        let error = poolgate_operator::execute(&operator, &verb(args))
            .await
            .expect_err("refused");
        assert_eq!(error.exit_code(), 2, "{args:?}: {error}");
        assert!(error.to_string().contains(field), "{args:?}: {error}");
    }
    // The selector refuses them itself, whoever asks (not only the CLI).
    let refused = replica
        .admin
        .clone()
        .set_price(admin(pb::SetPriceRequest {
            model: "claude-opus-5-5".into(),
            price: Some(pb::Price {
                per_search_unit: 0.0,
                input_per_mtok: 1.0,
                output_per_mtok: f64::NAN,
                cache_write_per_mtok: 0.0,
                cache_read_per_mtok: 0.0,
            }),
        }))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("output"),
        "{}",
        refused.message()
    );
    assert_eq!(run(&["prices"]).await.expect("listed"), before);

    // Written to `model_prices`: another replica (or a restart) serves it.
    let other = Replica::start(backends.config(fast_settings())).await;
    let (price, source, _) = planned(&other, "claude-opus-5-5").await;
    assert_eq!(
        (source, price.map(|p| p.input_per_mtok)),
        (pb::PriceSource::Operator, Some(1.0))
    );

    // Removed: the catalogue's applies again; removing it twice is not found.
    let removed = run(&["remove-price", "claude-opus-5-5"])
        .await
        .expect("removed");
    assert!(
        removed.starts_with("claude-opus-5-5\tsource=catalogue\tinput=4\t"),
        "{removed}"
    );
    let (_, source, _) = planned(&replica, "claude-opus-5-5").await;
    assert_eq!(source, pb::PriceSource::Catalogue);
    let error = run(&["remove-price", "claude-opus-5-5"])
        .await
        .expect_err("nothing to remove");
    assert!(matches!(error, OperatorError::NotFound(_)), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_shows_each_models_usage_with_the_price_it_was_charged_at() {
    let backends = Backends::start().await;
    backends.account("acct-a", "g", |_| {}).await;
    backends
        .store
        .create_api_key("usage", "alice", "g", 0)
        .await
        .expect("key");
    let replica = Replica::start(backends.config(fast_settings())).await;
    let keys = replica
        .admin
        .clone()
        .list_api_keys(admin(pb::ListApiKeysRequest {}))
        .await
        .expect("keys")
        .into_inner()
        .keys;
    let key_id = keys.first().expect("the key").id;
    let record = |model: &str, source: pb::PriceSource, cost_usd: f64| pb::UsageRecord {
        api_key_id: key_id,
        user: "alice".into(),
        model: model.into(),
        input_tokens: 10,
        output_tokens: 7,
        cost_usd,
        status: 200,
        price_source: source as i32,
        ..Default::default()
    };
    replica
        .client
        .clone()
        .record_usage(pb::RecordUsageRequest {
            records: vec![
                record("claude-opus-6", pb::PriceSource::Fallback, 0.5),
                record("claude-opus-6", pb::PriceSource::Fallback, 0.25),
                record("claude-haiku-5-5", pb::PriceSource::Catalogue, 0.01),
                // An older relay's record says nothing.
                record("claude-x", pb::PriceSource::Unspecified, 0.0),
            ],
        })
        .await
        .expect("recorded");
    let operator = operator(&replica).await;
    let text = poolgate_operator::execute(&operator, &verb(&["usage", &key_id.to_string()]))
        .await
        .expect("usage");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[0].starts_with(&format!("{key_id}\talice\trequests=4\t")),
        "{text}"
    );
    assert_eq!(
        lines[1..],
        [
            format!(
                "{key_id}\talice\tmodel=claude-haiku-5-5\tprice=catalogue\trequests=1\tinput_tokens=10\toutput_tokens=7\tcost_usd=0.010000"
            ),
            format!(
                "{key_id}\talice\tmodel=claude-opus-6\tprice=fallback\trequests=2\tinput_tokens=20\toutput_tokens=14\tcost_usd=0.750000"
            ),
            format!(
                "{key_id}\talice\tmodel=claude-x\tprice=unknown\trequests=1\tinput_tokens=10\toutput_tokens=7\tcost_usd=0.000000"
            ),
        ]
    );
}
