//! Bad input on every RPC gets a clean status naming the field, and the server keeps serving.

use crate::support;

use poolgate_proto::admission::v1 as pb;
use support::{Answer, LeaseStream, Store, TestServer, acquire, inflight_one};

fn invalid_naming(answer: &Answer, field: &str) {
    match answer {
        Answer::Error(tonic::Code::InvalidArgument, message) => {
            assert!(message.contains(field), "{message:?} should name {field}");
            assert!(
                message.len() < 400,
                "the message stays short: {} bytes",
                message.len()
            );
        }
        other => panic!("expected InvalidArgument naming {field}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_stream_rejects_bad_acquires_and_keeps_serving() {
    let store = Store::redis().await;
    let server = TestServer::on(&store).await;
    let client = &server.client;
    let huge = "x".repeat(1 << 20);
    let cases: Vec<(pb::Acquire, &str)> = vec![
        (acquire(0, 1), "acquire.account_id"),
        (acquire(-7, 1), "acquire.account_id"),
        (acquire(i64::MIN, 1), "acquire.account_id"),
        (
            pb::Acquire {
                user_id: Some(String::new()),
                ..acquire(1, 1)
            },
            "acquire.user_id",
        ),
        (
            pb::Acquire {
                user_id: Some(huge.clone()),
                ..acquire(1, 1)
            },
            "acquire.user_id",
        ),
        (
            pb::Acquire {
                session_hash: Some(String::new()),
                ..acquire(1, 1)
            },
            "acquire.session_hash",
        ),
        (
            pb::Acquire {
                session_hash: Some(huge.clone()),
                ..acquire(1, 1)
            },
            "acquire.session_hash",
        ),
        (
            pb::Acquire {
                user_rpm_limit: 5,
                ..acquire(1, 1)
            },
            "acquire.user_id",
        ),
        (
            pb::Acquire {
                session_window_limit_usd: f64::NAN,
                ..acquire(1, 1)
            },
            "acquire.session_window_limit_usd",
        ),
        (
            pb::Acquire {
                session_window_limit_usd: f64::INFINITY,
                ..acquire(1, 1)
            },
            "acquire.session_window_limit_usd",
        ),
        (
            pb::Acquire {
                wait_ms: u32::MAX,
                ..acquire(1, 1)
            },
            "acquire.wait_ms",
        ),
    ];
    for (terms, field) in cases {
        let (_, answer) = LeaseStream::acquire(client, terms).await;
        invalid_naming(&answer, field);
    }
    // Negative limits are not errors: a limit <= 0 means unlimited (docs/DESIGN.md §4).
    let (_, answer) = LeaseStream::acquire(
        client,
        pb::Acquire {
            rpm_limit: -3,
            ..acquire(1, -1)
        },
    )
    .await;
    assert!(answer.is_granted(), "{answer:?}");
    // A first message that is neither Acquire nor Resume.
    for first in [
        pb::lease_request::Kind::Heartbeat(pb::Heartbeat {}),
        pb::lease_request::Kind::Attempt(pb::Attempt {}),
        pb::lease_request::Kind::Release(pb::Release {
            spend_usd: 0.0,
            tokens: 0,
        }),
    ] {
        let (_, answer) = LeaseStream::open(client, first).await;
        invalid_naming(&answer, "kind");
    }
    // Resume with a malformed lease id, without terms, or with terms of another account.
    let (_, answer) = LeaseStream::resume(client, "not-a-lease", acquire(1, 1)).await;
    invalid_naming(&answer, "resume.lease_id");
    let (_, answer) = LeaseStream::resume(client, &huge, acquire(1, 1)).await;
    invalid_naming(&answer, "resume.lease_id");
    let (_, answer) = LeaseStream::resume(client, "5.abc.1", acquire(6, 1)).await;
    invalid_naming(&answer, "resume.terms.account_id");
    let (_, answer) = LeaseStream::open(
        client,
        pb::lease_request::Kind::Resume(pb::Resume {
            lease_id: "5.abc.1".into(),
            terms: None,
        }),
    )
    .await;
    invalid_naming(&answer, "resume.terms");
    // Still serving.
    let (held, answer) = LeaseStream::acquire(client, acquire(9, 1)).await;
    assert!(answer.is_granted(), "{answer:?}");
    held.release(0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_on_a_held_lease_end_the_stream_and_leave_the_slot_to_the_grace() {
    let store = Store::redis().await;
    let server = TestServer::on(&store).await;
    let (mut stream, answer) = LeaseStream::acquire(&server.client, acquire(41, 1)).await;
    assert!(answer.is_granted());
    stream
        .send(pb::lease_request::Kind::Release(pb::Release {
            spend_usd: -1.0,
            tokens: 0,
        }))
        .await;
    match stream.next_event().await {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(
                status.message().contains("release.spend_usd"),
                "{}",
                status.message()
            );
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // A second Acquire on a held lease is a protocol error, too.
    let (mut second, answer) = LeaseStream::acquire(&server.client, acquire(42, 1)).await;
    assert!(answer.is_granted());
    second
        .send(pb::lease_request::Kind::Acquire(acquire(42, 1)))
        .await;
    assert!(
        matches!(second.next_event().await, Err(status) if status.code() == tonic::Code::FailedPrecondition)
    );
    // Both leases were orphaned (the holder may resume) and expire after the 300 ms grace.
    poolgate_testkit::eventually(std::time::Duration::from_secs(2), || async {
        (inflight_one(&server.client, 41).await + inflight_one(&server.client, 42).await == 0)
            .then_some(())
    })
    .await
    .expect("orphaned leases expire");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_rpcs_reject_bad_input_naming_the_field() {
    let store = Store::memory().await;
    let server = TestServer::on(&store).await;
    let mut client = server.client.clone();
    let huge = "x".repeat(1 << 20);
    for lease_id in ["", "0.abc.1", "-1.abc.1", "1.abc", huge.as_str()] {
        let status = client
            .release(pb::ReleaseRequest {
                lease_id: lease_id.into(),
                ..Default::default()
            })
            .await
            .expect_err("bad lease id");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("lease_id"));
    }
    for spend_usd in [-1.0, f64::NAN, f64::INFINITY, 2e6] {
        let status = client
            .release(pb::ReleaseRequest {
                lease_id: "1.abc.1".into(),
                spend_usd,
                tokens: 0,
            })
            .await
            .expect_err("bad spend");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("spend_usd"), "{status:?}");
    }
    for ids in [vec![0], vec![1, -2], vec![1; 1001]] {
        let status = client
            .inflight(pb::InflightRequest { account_ids: ids })
            .await
            .expect_err("bad ids");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("account_ids"));
    }
    for (account_id, usd, field) in [
        (0, 1.0, "account_id"),
        (-1, 1.0, "account_id"),
        (1, -0.5, "usd"),
        (1, f64::NAN, "usd"),
        (1, 1e12, "usd"),
    ] {
        let status = client
            .record_spend(pb::RecordSpendRequest { account_id, usd })
            .await
            .expect_err("bad spend");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(field), "{}", status.message());
    }
    // Empty Inflight is fine, and the server still answers.
    let empty = client
        .inflight(pb::InflightRequest {
            account_ids: vec![],
        })
        .await
        .expect("empty inflight")
        .into_inner();
    assert!(empty.accounts.is_empty());
    assert_eq!(inflight_one(&server.client, 3).await, 0);
}

/// GET /metrics from the test server, over a plain TCP connection.
async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr)
        .await
        .expect("metrics port");
    socket
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut text = String::new();
    socket.read_to_string(&mut text).await.expect("read");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_is_counted_by_method_and_code_without_unbounded_labels() {
    let store = Store::memory().await;
    let server = TestServer::on(&store).await;
    let mut client = server.client.clone();
    let _ = client
        .inflight(pb::InflightRequest {
            account_ids: vec![1],
        })
        .await;
    let _ = client
        .inflight(pb::InflightRequest {
            account_ids: vec![-1],
        })
        .await;
    let (held, _) = LeaseStream::acquire(&server.client, acquire(77, 1)).await;
    held.release(0.0).await;
    let text = scrape(server.metrics_addr).await;
    assert!(
        text.contains(r#"grpc_server_requests_total{code="Ok",method="Admission/Inflight"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"grpc_server_requests_total{code="InvalidArgument",method="Admission/Inflight"} 1"#
        ),
        "{text}"
    );
    assert!(text.contains(r#"method="Admission/Lease""#), "{text}");
    assert!(
        text.contains(r#"admission_decisions_total{reason="none",result="granted"} 1"#),
        "{text}"
    );
    assert!(
        !text.contains("77."),
        "no lease id or account id in any label"
    );
}
