//! gRPC between services over TLS: admission serves with a certificate, the relay's balanced
//! channel verifies it against a CA (also when the URL's name resolves to the replica's address);
//! a plaintext client cannot talk to it.

use std::time::Duration;

use poolgate_proto::admission::v1 as pb;
use poolgate_proto::admission::v1::admission_client::AdmissionClient;
use poolgate_testkit::Scratch;

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let status = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs (bash scripts/test.sh installs it)");
    assert!(status.success(), "openssl {args:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_over_tls_verified_by_the_relays_channel() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let scratch = Scratch::new("tls").expect("scratch");
    let dir = scratch.path();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=poolgate-test-ca",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .expect("ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
        ],
    );

    let config = admission_svc::Config {
        tls: Some(admission_svc::server::TlsFiles {
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        }),
        ..admission_svc::Config::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let _ = admission_svc::run(config, listener, None, std::future::pending()).await;
    });
    let ca = std::fs::read(dir.join("ca.pem")).expect("ca");
    let channel =
        relay_svc::remote::balanced_channel(&[format!("https://localhost:{port}")], Some(&ca))
            .expect("channel");
    let mut client = AdmissionClient::new(channel);
    let mut answer = None;
    for _ in 0..50 {
        if let Ok(response) = client
            .inflight(pb::InflightRequest {
                account_ids: vec![1],
            })
            .await
        {
            answer = Some(response.into_inner());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = answer.expect("a verified TLS call succeeds");
    assert_eq!(answer.accounts[0].inflight, 0);
    // Plaintext is refused.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("endpoint")
        .connect()
        .await;
    if let Ok(channel) = plain {
        let result = AdmissionClient::new(channel)
            .inflight(pb::InflightRequest {
                account_ids: vec![1],
            })
            .await;
        assert!(
            result.is_err(),
            "a plaintext call must fail against a TLS server"
        );
    }
}
