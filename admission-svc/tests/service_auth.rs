//! Service identity on admission's port: every RPC refuses a caller without, or with a wrong,
//! service token (`UNAUTHENTICATED`, naming the metadata key); health checks stay open; the right
//! token gets through.

use crate::support;

use poolgate_proto::FILE_DESCRIPTOR_SET;
use poolgate_testkit::{call_empty, rpc_paths};
use support::{SERVICE_TOKEN, Store, TestServer};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_refuses_callers_without_the_service_token_and_health_stays_open() {
    let server = TestServer::on(&Store::Memory).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connects");
    let paths =
        rpc_paths(FILE_DESCRIPTOR_SET, &["poolgate.admission.v1.Admission"]).expect("paths");
    assert!(paths.len() >= 4, "{paths:?}");
    let header = poolgate_rpc::service_auth::SERVICE_TOKEN_HEADER;
    for path in paths
        .iter()
        .map(String::as_str)
        .chain(["/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"])
    {
        for metadata in [vec![], vec![(header, "wrong-token")]] {
            let (code, message) = call_empty(channel.clone(), path, &metadata)
                .await
                .expect("call");
            assert_eq!(code, Code::Unauthenticated, "{path} with {metadata:?}");
            assert!(message.contains(header), "{message}");
        }
    }
    // The right token gets through (an answer, or the method's own refusal of an empty message).
    let (code, _) = call_empty(
        channel.clone(),
        "/poolgate.admission.v1.Admission/Inflight",
        &[(header, SERVICE_TOKEN)],
    )
    .await
    .expect("call");
    assert_ne!(code, Code::Unauthenticated);
    // The kubelet's probes carry no credential.
    let (code, _) = call_empty(channel, "/grpc.health.v1.Health/Check", &[])
        .await
        .expect("call");
    assert_eq!(code, Code::Ok, "health checks stay open");
}

#[test]
fn a_server_with_no_service_credential_refuses_to_start_and_names_the_flags() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_admission-svc"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .env_remove("POOLGATE_SERVICE_TOKEN")
        .env_remove("POOLGATE_INSECURE_DEV")
        .env_remove("ADMISSION_TLS_CLIENT_CA")
        .output()
        .expect("admission-svc runs");
    assert!(!output.status.success(), "refused to start");
    let stderr = String::from_utf8_lossy(&output.stderr);
    for flag in [
        "--service-token",
        "--tls-client-ca",
        "--insecure-dev",
        "x-poolgate-service-token",
    ] {
        assert!(stderr.contains(flag), "names {flag}: {stderr}");
    }
}
