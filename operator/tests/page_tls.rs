//! The status page's own listener over TLS (the selector's `--admin-http-listen` with its
//! certificate flags): it serves HTTPS with the server's certificate, its session cookie is
//! `Secure`, and a plaintext client gets nothing.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use poolgate_operator::page::{self, Scheme};
use poolgate_operator::view::UsageReport;
use poolgate_operator::{
    AccountRow, AdminEndpoint, BlockRow, KeyRow, OperatorError, StatusView, WindowRow,
};

const TOKEN: &str = "tls-admin-token";

/// An endpoint with nothing in it: this test is about the transport.
struct Empty;

fn none<T>() -> Result<T, OperatorError> {
    Err(OperatorError::Unavailable("nothing here".into()))
}

#[async_trait]
impl AdminEndpoint for Empty {
    async fn accounts(&self, _: Option<&str>) -> Result<Vec<AccountRow>, OperatorError> {
        Ok(Vec::new())
    }
    async fn blocks(&self) -> Result<Vec<BlockRow>, OperatorError> {
        Ok(Vec::new())
    }
    async fn windows(
        &self,
        _: Option<i64>,
        _: Option<&str>,
    ) -> Result<Vec<WindowRow>, OperatorError> {
        Ok(Vec::new())
    }
    async fn restore(&self, _: i64) -> Result<AccountRow, OperatorError> {
        none()
    }
    async fn clear_block(&self, _: i64) -> Result<(), OperatorError> {
        none()
    }
    async fn usage(
        &self,
        from_ms: i64,
        to_ms: i64,
        _: Option<i64>,
    ) -> Result<UsageReport, OperatorError> {
        Ok(UsageReport {
            from_ms,
            to_ms,
            keys: Vec::new(),
        })
    }
    async fn keys(&self) -> Result<Vec<KeyRow>, OperatorError> {
        Ok(Vec::new())
    }
    async fn set_key_disabled(&self, _: i64, _: bool) -> Result<KeyRow, OperatorError> {
        none()
    }
    async fn sign_in(
        &self,
        _: &poolgate_core::account::SignIn,
    ) -> Result<poolgate_operator::SignedInRow, OperatorError> {
        Err(OperatorError::Unavailable("not served here".into()))
    }
    async fn status(&self) -> Result<StatusView, OperatorError> {
        Ok(StatusView {
            generated_at_ms: poolgate_core::now_ms(),
            failure_policy: "memory".into(),
            admission: "ok".into(),
            admission_replicas: Vec::new(),
            accounts: Vec::new(),
        })
    }
    async fn prices(&self) -> Result<poolgate_operator::PriceList, OperatorError> {
        none()
    }
    async fn set_price(
        &self,
        _: &str,
        _: poolgate_core::account::Price,
    ) -> Result<poolgate_operator::PriceRow, OperatorError> {
        none()
    }
    async fn remove_price(&self, _: &str) -> Result<poolgate_operator::PriceRow, OperatorError> {
        none()
    }
}

/// A self-signed certificate for 127.0.0.1 in `dir`: (cert.pem, key.pem).
fn certificate(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
        ])
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs (bash scripts/test.sh installs it)");
    assert!(status.success(), "openssl made a certificate");
    (dir.join("cert.pem"), dir.join("key.pem"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_page_serves_https_and_its_session_cookie_is_secure() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = std::env::temp_dir().join(format!("poolgate-page-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let (cert, key) = certificate(&dir);
    let tls = page::tls_config(&cert, &key).expect("the identity loads");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let router = page::router(Arc::new(Empty), TOKEN, Scheme::Https);
    let serving = tokio::spawn(page::serve(listener, router, Some(tls), async {
        let _ = stopped.await;
    }));

    let root = reqwest::Certificate::from_pem(&std::fs::read(&cert).expect("cert"))
        .expect("a PEM certificate");
    let https = reqwest::Client::builder()
        .add_root_certificate(root)
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let login = https
        .post(format!("https://{address}/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .expect("the page answers over TLS");
    assert_eq!(login.status().as_u16(), 303);
    let cookie = login
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Secure"] {
        assert!(
            cookie.split("; ").any(|a| a == attribute),
            "{attribute}: {cookie}"
        );
    }
    let session = cookie.split(';').next().unwrap_or_default().to_owned();
    let status = https
        .get(format!("https://{address}/api/status"))
        .header("cookie", session)
        .send()
        .await
        .expect("status");
    assert_eq!(status.status().as_u16(), 200);

    let plain = reqwest::Client::new()
        .get(format!("http://{address}/"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(
        plain.is_err() || plain.is_ok_and(|r| r.status().as_u16() != 200),
        "no page in plaintext"
    );
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the listener stops on shutdown")
        .expect("no panic");
    let _ = std::fs::remove_dir_all(&dir);
}
