//! The repair verbs against a running selector (distributed mode), over real Postgres and Redis:
//! `clear-block` and `restore` answer for an account the selector serves, and an account it does
//! not serve is not found, as on a standalone relay (both run the engine's one admin API).

use crate::support;

use clap::Parser;
use poolgate_operator::grpc::SelectorAdmin;
use poolgate_operator::{OperatorError, Verb};
use support::{ADMIN_TOKEN, Backends, Replica, SERVICE_TOKEN, fast_settings};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clearing_or_restoring_an_account_the_selector_does_not_serve_is_not_found() {
    let backends = Backends::start().await;
    let a = backends.account("acct-a", "g", |_| {}).await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let operator = SelectorAdmin::connect(
        &format!("http://{}", replica.addr),
        ADMIN_TOKEN,
        Some(SERVICE_TOKEN),
    )
    .await
    .expect("connects");

    poolgate_operator::execute(&operator, &verb(&["clear-block", &a.to_string()]))
        .await
        .expect("the served account's blocks are cleared");
    poolgate_operator::execute(&operator, &verb(&["restore", &a.to_string()]))
        .await
        .expect("the served account is restored");
    for args in [["clear-block", "999"], ["restore", "999"]] {
        let error = poolgate_operator::execute(&operator, &verb(&args))
            .await
            .expect_err("no account 999");
        assert!(
            matches!(error, OperatorError::NotFound(_)),
            "{args:?}: {error}"
        );
    }
}
