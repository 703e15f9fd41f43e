//! Service identity on the selector's port: every RPC (selection, outcomes, authentication,
//! usage, the admin API) refuses a caller without, or with a wrong, service token; the admin RPCs
//! also keep their admin token; health checks stay open.

use crate::support;

use poolgate_proto::FILE_DESCRIPTOR_SET;
use poolgate_testkit::{call_empty, rpc_paths};
use support::{ADMIN_TOKEN, Backends, Replica, SERVICE_TOKEN, fast_settings};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_refuses_callers_without_the_service_token_and_health_stays_open() {
    let backends = Backends::start().await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", replica.addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connects");
    let paths = rpc_paths(
        FILE_DESCRIPTOR_SET,
        &[
            "poolgate.selector.v1.Selector",
            "poolgate.selector.v1.SelectorAdmin",
        ],
    )
    .expect("paths");
    for method in ["Select", "ReportOutcome", "Authenticate", "ListAccounts"] {
        assert!(
            paths.iter().any(|p| p.ends_with(&format!("/{method}"))),
            "{paths:?}"
        );
    }
    let header = poolgate_rpc::service_auth::SERVICE_TOKEN_HEADER;
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    for path in paths
        .iter()
        .map(String::as_str)
        .chain(["/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"])
    {
        // The admin bearer token alone is not enough: the service token comes first.
        for metadata in [
            vec![("authorization", bearer.as_str())],
            vec![(header, "wrong-token"), ("authorization", bearer.as_str())],
        ] {
            let (code, message) = call_empty(channel.clone(), path, &metadata)
                .await
                .expect("call");
            assert_eq!(code, Code::Unauthenticated, "{path} with {metadata:?}");
            assert!(message.contains(header), "{message}");
        }
    }
    // The right service token: selection RPCs answer; admin RPCs still want the admin token.
    let (code, _) = call_empty(
        channel.clone(),
        "/poolgate.selector.v1.SelectorAdmin/ListAccounts",
        &[(header, SERVICE_TOKEN), ("authorization", bearer.as_str())],
    )
    .await
    .expect("call");
    assert_eq!(code, Code::Ok);
    let (code, message) = call_empty(
        channel.clone(),
        "/poolgate.selector.v1.SelectorAdmin/ListAccounts",
        &[(header, SERVICE_TOKEN)],
    )
    .await
    .expect("call");
    assert_eq!(code, Code::Unauthenticated, "{message}");
    assert!(message.contains("admin"), "{message}");
    let (code, _) = call_empty(channel, "/grpc.health.v1.Health/Check", &[])
        .await
        .expect("call");
    assert_eq!(code, Code::Ok, "health checks stay open");
}
