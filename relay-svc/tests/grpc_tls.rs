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

/// A CA, a server certificate for localhost and a client certificate, all in `dir`.
fn certificates(dir: &std::path::Path) {
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
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .expect("ext");
    for (name, subject) in [
        ("server", "/CN=localhost"),
        ("client", "/CN=poolgate-relay"),
    ] {
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                subject,
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.pem"),
                "-days",
                "1",
                "-extfile",
                "ext.cnf",
            ],
        );
    }
}

async fn inflight(client: &relay_svc::remote::GrpcClient, port: u16) -> Result<u32, String> {
    let channel =
        relay_svc::remote::balanced_channel(&[format!("https://localhost:{port}")], client)
            .map_err(|error| error.to_string())?;
    let mut client = AdmissionClient::new(channel);
    let mut last = String::from("no attempt");
    for _ in 0..30 {
        match client
            .inflight(pb::InflightRequest {
                account_ids: vec![1],
            })
            .await
        {
            Ok(response) => return Ok(response.into_inner().accounts[0].inflight),
            Err(status) => last = format!("{:?}: {}", status.code(), status.message()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_callers_with_a_certificate_from_the_ca_and_no_one_else() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let scratch = Scratch::new("mtls").expect("scratch");
    let dir = scratch.path();
    certificates(dir);
    let config = admission_svc::Config {
        tls: Some(poolgate_rpc::tls::TlsFiles {
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
            client_ca: Some(dir.join("ca.pem")),
        }),
        callers: poolgate_rpc::service_auth::CallerCheck::MutualTls,
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
    let with_certificate = relay_svc::remote::GrpcClient {
        tls_ca: Some(ca.clone()),
        tls_identity: Some((
            std::fs::read(dir.join("client.pem")).expect("cert"),
            std::fs::read(dir.join("client.key")).expect("key"),
        )),
        service_token: None,
        ..Default::default()
    };
    assert_eq!(inflight(&with_certificate, port).await, Ok(0));
    let without = relay_svc::remote::GrpcClient {
        tls_ca: Some(ca),
        ..Default::default()
    };
    assert!(
        inflight(&without, port).await.is_err(),
        "no client certificate: refused in the handshake"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_over_tls_verified_by_the_relays_channel() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let scratch = Scratch::new("tls").expect("scratch");
    let dir = scratch.path();
    certificates(dir);
    let config = admission_svc::Config {
        tls: Some(poolgate_rpc::tls::TlsFiles {
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
            client_ca: None,
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
    let client = relay_svc::remote::GrpcClient {
        tls_ca: Some(ca),
        ..Default::default()
    };
    assert_eq!(
        inflight(&client, port).await,
        Ok(0),
        "a verified TLS call succeeds"
    );
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
