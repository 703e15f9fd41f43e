//! Takes one lease from a running admission-svc, renews it, charges a retry, and releases it,
//! printing each event. Start the server first (`cargo run -p admission-svc`), then:
//!
//! ```text
//! cargo run -p admission-svc --example lease [-- http://127.0.0.1:50061 [account_id]]
//! ```

use std::process::ExitCode;

use poolgate_proto::admission::v1 as pb;
use poolgate_proto::admission::v1::admission_client::AdmissionClient;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

fn message(kind: pb::lease_request::Kind) -> pb::LeaseRequest {
    pb::LeaseRequest { kind: Some(kind) }
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let endpoint = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:50061".into());
    let account_id: i64 = match args.next().map(|a| a.parse()) {
        None => 1,
        Some(Ok(id)) => id,
        Some(Err(_)) => {
            eprintln!("account_id must be a positive integer");
            return ExitCode::from(2);
        }
    };
    let mut client = match AdmissionClient::connect(endpoint.clone()).await {
        Ok(client) => client,
        Err(error) => {
            eprintln!(
                "cannot reach admission at {endpoint}: {error}\nstart it with: cargo run -p admission-svc"
            );
            return ExitCode::from(1);
        }
    };
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    let acquire = pb::Acquire {
        account_id,
        concurrency_limit: 2,
        rpm_limit: 60,
        ..Default::default()
    };
    let script = [
        message(pb::lease_request::Kind::Acquire(acquire)),
        message(pb::lease_request::Kind::Heartbeat(pb::Heartbeat {})),
        message(pb::lease_request::Kind::Attempt(pb::Attempt {})),
        message(pb::lease_request::Kind::Release(pb::Release {
            spend_usd: 0.01,
            tokens: 0,
        })),
    ];
    let mut events = match client.lease(ReceiverStream::new(receiver)).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            eprintln!("lease failed: {status}");
            return ExitCode::from(1);
        }
    };
    for request in script {
        if sender.send(request).await.is_err() {
            break;
        }
        match events.next().await {
            Some(Ok(event)) => {
                println!("{:?}", event.kind);
                if matches!(event.kind, Some(pb::lease_event::Kind::Denied(_))) {
                    return ExitCode::from(1);
                }
            }
            Some(Err(status)) => {
                eprintln!("lease stream failed: {status}");
                return ExitCode::from(1);
            }
            None => break,
        }
    }
    let inflight = client
        .inflight(pb::InflightRequest {
            account_ids: vec![account_id],
        })
        .await;
    match inflight {
        Ok(response) => println!(
            "inflight after release: {:?}",
            response.into_inner().accounts
        ),
        Err(status) => eprintln!("inflight failed: {status}"),
    }
    ExitCode::SUCCESS
}
