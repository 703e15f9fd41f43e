//! The status page over HTTP: on the selector's `--admin-http-listen` in the distributed stack
//! (real Postgres and Redis) and on the standalone relay's admin listener. Without a session the
//! page is the login form and the API answers 401; a wrong token waits out the fixed delay; the
//! right one sets an HTTP-only, `SameSite=Strict`, expiring cookie; a forged, expired or
//! other-token cookie opens nothing; every answer carries the CSP; no credential shows beyond its
//! last four characters. (`status_page_browser.rs` drives the page in a real browser.)

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use poolgate_core::account::Secret;
use poolgate_operator::page::Sessions;
use poolgate_operator::page::session::COOKIE;
use poolgate_runtime::failed_auth::REFUSAL_DELAY;
use poolgate_testkit::fake_upstream::FakeUpstream;
use relay_svc::proxy::RelaySettings;
use relay_svc::run::{Config, Listeners};
use relay_svc::server::{self, Mode};
use relay_svc::standalone::StandaloneFile;
use serde_json::Value;

/// A credential long enough to be masked to its last four characters.
const CREDENTIAL: &str = "sk-ant-api03-very-secret-credential-a1b2";

struct Page {
    _backends: common::Backends,
    _selector: selector_svc::server::Built,
    _upstream: FakeUpstream,
    base: String,
    http: reqwest::Client,
}

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("http client")
}

/// The distributed stack's selector with its page, two accounts (one with a long credential)
/// and a client key.
async fn selector_page() -> Page {
    let backends = common::backends().await.expect("backends start");
    let upstream = FakeUpstream::start().await.expect("upstream");
    let mut alpha = common::account("alpha", &upstream.base_url, 2, 0);
    alpha.credential = Some(Secret::new(CREDENTIAL));
    backends.store.upsert_account(&alpha).await.expect("alpha");
    backends
        .store
        .upsert_account(&common::account("beta", &upstream.base_url, 2, 1))
        .await
        .expect("beta");
    backends
        .store
        .create_api_key("ci-key", "alice", "default", 0)
        .await
        .expect("key");
    let (selector, _, page) = common::selector_with_page(&backends, Default::default())
        .await
        .expect("selector starts");
    Page {
        _backends: backends,
        _selector: selector,
        _upstream: upstream,
        base: format!("http://{page}"),
        http: client(),
    }
}

impl Page {
    async fn get(&self, path: &str, cookie: Option<&str>) -> reqwest::Response {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(cookie) = cookie {
            request = request.header("cookie", format!("{COOKIE}={cookie}"));
        }
        request.send().await.expect("the page answers")
    }

    async fn login(&self, token: &str) -> reqwest::Response {
        self.http
            .post(format!("{}/login", self.base))
            .form(&[("token", token)])
            .send()
            .await
            .expect("the page answers")
    }

    /// Logs in with the admin token; the session cookie's value.
    async fn session(&self) -> String {
        let response = self.login(common::ADMIN_TOKEN).await;
        assert_eq!(response.status().as_u16(), 303);
        session_value(&response).expect("a session cookie")
    }
}

fn set_cookie(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn session_value(response: &reqwest::Response) -> Option<String> {
    let cookie = set_cookie(response)?;
    let pair = cookie.split(';').next()?;
    pair.strip_prefix(&format!("{COOKIE}=")).map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_session_the_page_is_the_login_form_and_the_api_answers_401() {
    let page = selector_page().await;
    let response = page.get("/", None).await;
    assert_eq!(response.status().as_u16(), 200);
    let body = response.text().await.expect("body");
    assert!(body.contains(r#"<form id="login""#), "{body}");
    assert!(body.contains(r#"name="token" type="password""#), "{body}");
    for hidden in ["alpha", "beta", "ci-key", "app.js", r#"id="accounts""#] {
        assert!(!body.contains(hidden), "{hidden} shown without a session");
    }
    for path in ["/api/status", "/api/keys"] {
        let response = page.get(path, None).await;
        assert_eq!(response.status().as_u16(), 401, "{path}");
        let refusal: Value = response.json().await.expect("a JSON error");
        assert_eq!(refusal["error"]["type"], "authentication_error", "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_after_the_fixed_delay_without_a_cookie() {
    let page = selector_page().await;
    for wrong in ["wrong", "", "admin ", "admi"] {
        let started = Instant::now();
        let response = page.login(wrong).await;
        let waited = started.elapsed();
        assert_eq!(response.status().as_u16(), 401, "{wrong:?}");
        assert!(
            waited >= REFUSAL_DELAY,
            "{wrong:?} answered after {waited:?}"
        );
        assert_eq!(set_cookie(&response), None, "{wrong:?}");
        let body = response.text().await.expect("body");
        assert!(body.contains("That token was refused."), "{body}");
        assert!(body.contains(r#"<form id="login""#), "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_opens_a_strict_http_only_expiring_session() {
    let page = selector_page().await;
    let response = page.login(common::ADMIN_TOKEN).await;
    assert_eq!(response.status().as_u16(), 303);
    assert_eq!(
        response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok()),
        Some("/")
    );
    let cookie = set_cookie(&response).expect("set-cookie");
    let attributes: Vec<&str> = cookie.split("; ").skip(1).collect();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(attributes.contains(&attribute), "{attribute} in {cookie}");
    }
    assert!(!attributes.contains(&"Secure"), "plain HTTP: {cookie}");
    let session = session_value(&response).expect("value");
    // The expiry is inside the signed value, about 12 h ahead.
    let expires_ms: i64 = session
        .split('.')
        .nth(1)
        .and_then(|ms| ms.parse().ok())
        .expect("v1.<expires_ms>.<mac>");
    let ahead = expires_ms - poolgate_core::now_ms();
    assert!(
        (11 * 3_600_000..=12 * 3_600_000).contains(&ahead),
        "{ahead}"
    );

    let shell = page
        .get("/", Some(&session))
        .await
        .text()
        .await
        .expect("body");
    assert!(
        shell.contains(r#"id="accounts""#),
        "the page with a session"
    );
    assert!(shell.contains(r#"<script src="/app.js""#), "{shell}");
    assert!(!shell.contains(r#"<form id="login""#), "{shell}");

    // The logout clears the cookie in the browser.
    let out = page
        .http
        .post(format!("{}/logout", page.base))
        .send()
        .await
        .expect("logout");
    assert_eq!(out.status().as_u16(), 303);
    let cleared = set_cookie(&out).expect("set-cookie");
    assert!(cleared.starts_with(&format!("{COOKIE}=;")) && cleared.contains("Max-Age=0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_expired_or_other_tokens_cookie_opens_nothing() {
    let page = selector_page().await;
    let good = page.session().await;
    let now = poolgate_core::now_ms();
    let ours = Sessions::new(common::ADMIN_TOKEN, false);
    let tag = good.rsplit_once('.').map(|(_, tag)| tag).unwrap_or("");
    let refused = [
        ("expired", ours.value(now - 1)),
        (
            "another token's",
            Sessions::new("not-the-admin-token", false).value(now + 3_600_000),
        ),
        ("extended", format!("v1.{}.{tag}", now + 90 * 86_400_000)),
        ("forged", format!("v1.{}.AAAAAAAA", now + 3_600_000)),
        ("the token itself", common::ADMIN_TOKEN.to_owned()),
        ("empty", String::new()),
    ];
    for (what, cookie) in &refused {
        let response = page.get("/api/status", Some(cookie)).await;
        assert_eq!(response.status().as_u16(), 401, "{what}");
        let body = page
            .get("/", Some(cookie))
            .await
            .text()
            .await
            .expect("body");
        assert!(
            body.contains(r#"<form id="login""#),
            "{what}: the login form"
        );
    }
    assert_ne!(
        page.get("/api/status", Some(&good)).await.status().as_u16(),
        401,
        "the real session passes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_the_content_security_policy_and_no_store() {
    let page = selector_page().await;
    let session = page.session().await;
    let answers = vec![
        ("/", page.get("/", None).await),
        ("/ signed in", page.get("/", Some(&session)).await),
        ("/app.js", page.get("/app.js", None).await),
        ("/style.css", page.get("/style.css", None).await),
        ("/api/status", page.get("/api/status", None).await),
        ("/api/keys", page.get("/api/keys", Some(&session)).await),
        ("/nowhere", page.get("/nowhere", None).await),
        ("POST /login", page.login("wrong").await),
    ];
    for (what, response) in answers {
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let csp = header("content-security-policy");
        assert!(csp.contains("default-src 'self'"), "{what}: {csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{what}: {csp}");
        assert!(!csp.contains("unsafe-inline"), "{what}: {csp}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{what}");
        assert_eq!(header("cache-control"), "no-store", "{what}");
        assert_eq!(header("referrer-policy"), "no-referrer", "{what}");
    }
    let script = page.get("/app.js", None).await;
    assert!(
        script
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/javascript")),
        "the script is served as a script (nosniff)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_session_the_api_answers_every_account_and_key_without_credentials() {
    let page = selector_page().await;
    let session = page.session().await;
    let response = page.get("/api/status", Some(&session)).await;
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.expect("body");
    let status: Value = serde_json::from_str(&text).expect("json");
    let accounts = status["status"]["accounts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = accounts.iter().filter_map(|a| a["name"].as_str()).collect();
    assert_eq!(names, ["alpha", "beta"], "{text}");
    assert_eq!(accounts[0]["status"], "active", "{text}");
    assert_eq!(accounts[0]["credential_masked"], "…a1b2", "{text}");
    assert!(
        !text.contains("very-secret"),
        "no credential beyond its last four: {text}"
    );
    for field in ["admission", "failure_policy"] {
        assert!(status["status"][field].is_string(), "{field}: {text}");
    }

    let keys: Value = page
        .get("/api/keys", Some(&session))
        .await
        .json()
        .await
        .expect("json");
    let listed = keys["keys"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 1, "{keys}");
    assert_eq!(listed[0]["name"], "ci-key");
    assert_eq!(
        listed[0]["prefix"], "",
        "a key's leading characters are not shown"
    );
    assert!(keys["usage"]["keys"].is_array(), "{keys}");
    let span = keys["usage"]["to_ms"].as_i64().unwrap_or(0)
        - keys["usage"]["from_ms"].as_i64().unwrap_or(0);
    assert_eq!(span, 24 * 3_600_000, "the last 24 h");
}

/// `serve_selector` as `main` runs it: the page on the address of `--admin-http-listen`, stopped
/// with the gRPC server at shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_selector_serves_the_page_on_its_flags_address_and_stops_it_at_shutdown() {
    let backends = common::backends().await.expect("backends start");
    let port = poolgate_testkit::free_port().expect("a free port");
    let page: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut config = common::selector_config(&backends, Default::default());
    config.admin_http_listen = Some(page);
    let built = selector_svc::server::build(&config, poolgate_select::metrics::Metrics::new())
        .await
        .expect("selector builds");
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = built.serving();
    let running = tokio::spawn(async move {
        selector_svc::server::serve_selector(serving, &config, grpc, None, async {
            let _ = stopped.await;
        })
        .await
    });
    let http = client();
    let form = poolgate_testkit::eventually(Duration::from_secs(10), || async {
        http.get(format!("http://{page}/"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()
    })
    .await
    .expect("the page answers on the flag's address");
    assert!(form.contains(r#"<form id="login""#), "{form}");
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(15), running)
        .await
        .expect("serving ends at shutdown")
        .expect("no panic")
        .expect("a clean end");
    assert!(
        tokio::net::TcpStream::connect(page).await.is_err(),
        "the page's listener is closed with the rest"
    );
}

/// The standalone relay's page: on its admin listener, the same login, while the admin routes
/// keep asking for the bearer token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standalone_relay_serves_the_page_on_its_admin_listener() {
    const TOKEN: &str = "standalone-admin-token";
    let upstream = FakeUpstream::start().await.expect("upstream");
    let file = StandaloneFile::parse(&format!(
        "api_keys:\n  - {{key: sk-page-client, group: default, user: u}}\naccounts:\n  - {{name: solo, platform: anthropic, base_url: \"{}\", api_key: {CREDENTIAL}}}\n",
        upstream.base_url
    ))
    .expect("config");
    let config = Config {
        server: server::Config {
            mode: Mode::Standalone {
                file: Arc::new(file),
                state_file: None,
            },
            relay: RelaySettings::default(),
            blocks: Default::default(),
            admission: Default::default(),
            shutdown_grace: Duration::from_secs(1),
        },
        admin_token: Some(Secret::new(TOKEN)),
    };
    let bind = || async {
        tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind")
    };
    let admin = bind().await;
    let admin_addr: SocketAddr = admin.local_addr().expect("addr");
    let listeners = Listeners {
        client: bind().await,
        metrics: None,
        admin: Some(admin),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay_svc::run(config, listeners, async {
        let _ = stopped.await;
    }));
    let http = client();
    let base = format!("http://{admin_addr}");
    let login_form = poolgate_testkit::eventually(Duration::from_secs(10), || async {
        http.get(format!("{base}/"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()
    })
    .await
    .expect("the page answers");
    assert!(login_form.contains(r#"<form id="login""#), "{login_form}");
    let bare = http
        .get(format!("{base}/admin/accounts"))
        .send()
        .await
        .expect("answer");
    assert_eq!(
        bare.status().as_u16(),
        401,
        "the admin routes still need the bearer"
    );
    let elsewhere = http
        .get(format!("{base}/admin/nowhere"))
        .send()
        .await
        .expect("answer");
    assert_eq!(
        elsewhere.status().as_u16(),
        401,
        "an unknown path too: the page does not open the listener"
    );
    let login = http
        .post(format!("{base}/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .expect("login");
    assert_eq!(login.status().as_u16(), 303);
    let session = session_value(&login).expect("a session");
    let keys: Value = http
        .get(format!("{base}/api/keys"))
        .header("cookie", format!("{COOKIE}={session}"))
        .send()
        .await
        .expect("keys")
        .json()
        .await
        .expect("json");
    assert_eq!(keys["keys"][0]["user"], "u", "{keys}");
    let status = http
        .get(format!("{base}/api/status"))
        .header("cookie", format!("{COOKIE}={session}"))
        .send()
        .await
        .expect("status");
    let text = status.text().await.expect("body");
    assert!(text.contains("\"solo\""), "{text}");
    assert!(!text.contains("very-secret"), "{text}");
    let _ = stop.send(());
    let _ = running.await;
}
