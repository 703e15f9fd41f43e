//! Distributed mode with every service as its own process (the binaries the workspace builds),
//! over a private Redis and Postgres: `selector-svc migrate`, accounts and a client key created
//! through the `selector-svc admin` CLI, then requests through `relay-svc`.

use std::time::Duration;

use crate::common;

use common::processes::Env;
use poolgate_testkit::fake_upstream::FakeUpstream;
use poolgate_testkit::{PostgresServer, RedisServer, eventually, free_port};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_selector_and_admission_as_separate_processes() {
    let (postgres, redis) = tokio::join!(PostgresServer::start(), RedisServer::start());
    let (postgres, redis) = (postgres.expect("postgres"), redis.expect("redis"));
    let upstream = FakeUpstream::start().await.expect("upstream");
    let (selector_port, admission_port, relay_port, relay_metrics_port) = (
        free_port().expect("port"),
        free_port().expect("port"),
        free_port().expect("port"),
        free_port().expect("port"),
    );
    let keys = format!("k1:{}", poolgate_select::crypto::Keyring::generate_key());
    let env = Env {
        vars: vec![
            ("POOLGATE_DATABASE_URL".into(), postgres.url()),
            ("POOLGATE_REDIS_URL".into(), redis.url()),
            ("POOLGATE_CREDENTIAL_KEYS".into(), keys),
            ("SELECTOR_ADMIN_TOKEN".into(), "admin-token".into()),
            (
                "SELECTOR_LISTEN".into(),
                format!("127.0.0.1:{selector_port}"),
            ),
            (
                "SELECTOR_METRICS_LISTEN".into(),
                format!("127.0.0.1:{}", free_port().expect("port")),
            ),
            (
                "SELECTOR_ENDPOINT".into(),
                format!("http://127.0.0.1:{selector_port}"),
            ),
            (
                "ADMISSION_LISTEN".into(),
                format!("127.0.0.1:{admission_port}"),
            ),
            (
                "ADMISSION_METRICS_LISTEN".into(),
                format!("127.0.0.1:{}", free_port().expect("port")),
            ),
        ],
    };
    let migrated = env.run("selector-svc", &["migrate"], &[]);
    assert!(migrated.contains("migrations applied"), "{migrated}");
    let _selector = env.spawn("selector-svc", "selector", &[]);
    let _admission = env.spawn("admission-svc", "admission", &[]);
    let _relay = env.spawn(
        "relay-svc",
        "relay",
        &[
            "--listen",
            &format!("127.0.0.1:{relay_port}"),
            "--metrics-listen",
            &format!("127.0.0.1:{relay_metrics_port}"),
            "--selector-url",
            &format!("http://127.0.0.1:{selector_port}"),
            "--admission-url",
            &format!("http://127.0.0.1:{admission_port}"),
        ],
    );
    // Wait for the selector, then configure it through the admin CLI.
    eventually(Duration::from_secs(20), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", selector_port))
            .await
            .ok()
            .map(|_| ())
    })
    .await
    .expect("selector listens");
    for name in ["proc-a", "proc-b"] {
        let credential = format!("cred-{name}");
        let out = env.run(
            "selector-svc",
            &[
                "admin",
                "upsert-account",
                "--name",
                name,
                "--group",
                "default",
                "--platform",
                "anthropic",
                "--base-url",
                &upstream.base_url,
                "--concurrency",
                "2",
            ],
            &[("ACCOUNT_CREDENTIAL", credential.as_str())],
        );
        assert!(
            out.contains(name) && !out.contains(&credential),
            "credential masked in the listing: {out}"
        );
    }
    let key = env.create_key("alice", "default");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{relay_port}");
    eventually(Duration::from_secs(20), || async {
        let response = http
            .post(format!("{base}/v1/messages"))
            .header("x-api-key", &key)
            .json(&json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .ok()?;
        (response.status().as_u16() == 200).then_some(())
    })
    .await
    .expect("a request goes through the three processes");
    upstream.set_delay(Duration::from_millis(30));
    let requests: Vec<_> = (0..30)
        .map(|n| {
            let (http, base, key) = (http.clone(), base.clone(), key.clone());
            tokio::spawn(async move {
                http.post(format!("{base}/v1/messages"))
                    .header("x-api-key", &key)
                    .json(&json!({"model": "claude-x", "max_tokens": 8, "stream": n % 2 == 0, "messages": [{"role": "user", "content": "hi"}]}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.expect("task"), 200);
    }
    for name in ["proc-a", "proc-b"] {
        let peak = upstream.stats(&format!("cred-{name}")).peak;
        assert!(peak <= 2, "{name} saw {peak} concurrent requests, limit 2");
    }
    let blocks = env.run("selector-svc", &["admin", "blocks"], &[]);
    assert!(blocks.trim().is_empty(), "no account was blocked: {blocks}");
    // A refused configuration verb exits 2 naming the field, and writes nothing (issue 39):
    // a key for a group nobody made.
    let keys_before = env.run("selector-svc", &["admin", "keys"], &[]);
    let refused = env
        .command("selector-svc")
        .args(["admin", "create-key", "--user", "u", "--group", "defualt"])
        .output()
        .expect("command runs");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("group"), "names the field: {stderr}");
    assert_eq!(
        env.run("selector-svc", &["admin", "keys"], &[]),
        keys_before,
        "no key was created"
    );
    // The relay's metrics are on their own port, not on the clients'.
    let metrics = http
        .get(format!("http://127.0.0.1:{relay_metrics_port}/metrics"))
        .send()
        .await
        .expect("metrics port answers")
        .text()
        .await
        .expect("text");
    assert!(metrics.contains("relay_requests_total"), "{metrics}");
    let on_client_port = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("relay answers");
    assert_eq!(on_client_port.status().as_u16(), 404);
}
