//! Graceful shutdown: SIGTERM to a relay in the middle of a streamed response lets the stream
//! finish and frees everything; SIGTERM to one of two admission replicas under load never lets
//! the upstream see more than an account's limit.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use admission_svc::redis_conn::{RedisOptions, RedisTarget};
use futures_util::StreamExt;
use poolgate_proto::keys::AccountKeys;
use poolgate_testkit::{PostgresServer, RedisServer, eventually, free_port};
use relay_svc::fake_upstream::FakeUpstream;
use relay_svc::metrics::Metrics;
use relay_svc::proxy::RelaySettings;
use serde_json::json;

fn binary(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_BIN_EXE_relay-svc"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run the workspace's tests",
        path.display()
    );
    path
}

struct Process(Child);

impl Process {
    fn terminate(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn stream_body() -> serde_json::Value {
    json!({"model": "claude-x", "max_tokens": 8, "stream": true, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_the_relay_lets_an_open_stream_finish() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let upstream = FakeUpstream::start().await.expect("upstream");
    upstream.set_chunk_delay(Duration::from_millis(300));
    let dir = std::env::temp_dir().join(format!("poolgate-shutdown-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("relay.yaml");
    std::fs::write(
        &config,
        format!(
            "api_keys:\n  - {{key: sk-shutdown, group: default, user: u}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{}\", api_key: k-a, concurrency: 1}}\n",
            upstream.base_url
        ),
    )
    .expect("config");
    let port = free_port().expect("port");
    let mut relay = Process(
        Command::new(binary("relay-svc"))
            .args(["--standalone", "--config"])
            .arg(&config)
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--shutdown-grace-ms",
                "10000",
            ])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("relay starts"),
    );
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/v1/messages");
    eventually(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(|_| ())
    })
    .await
    .expect("relay listens");
    let response = http
        .post(&url)
        .header("x-api-key", "sk-shutdown")
        .json(&stream_body())
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status().as_u16(), 200);
    let mut body = response.bytes_stream();
    let mut text =
        String::from_utf8_lossy(&body.next().await.expect("first chunk").expect("bytes"))
            .into_owned();
    relay.terminate();
    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(
            &chunk.expect("the stream is not cut"),
        ));
    }
    assert!(
        text.contains("message_stop"),
        "the stream finished after SIGTERM: {text}"
    );
    let status = tokio::task::spawn_blocking(move || relay.0.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(
        status.success(),
        "the relay exits 0 after draining: {status:?}"
    );
    assert_eq!(
        upstream.stats("k-a").current,
        0,
        "nothing left open upstream"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_one_admission_replica_under_load_never_over_admits() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (postgres, redis) = tokio::join!(PostgresServer::start(), RedisServer::start());
    let (postgres, redis) = (postgres.expect("postgres"), redis.expect("redis"));
    let keyring = selector_svc::crypto::Keyring::parse(
        &format!("k1:{}", selector_svc::crypto::Keyring::generate_key()),
        None,
    )
    .expect("keys");
    let store =
        selector_svc::store::ConfigStore::connect(&postgres.url(), Arc::new(keyring.clone()))
            .await
            .expect("store");
    store.migrate().await.expect("migrate");
    let upstream = FakeUpstream::start().await.expect("upstream");
    upstream.set_delay(Duration::from_millis(30));
    upstream.set_chunk_delay(Duration::from_millis(20));
    for name in ["a", "b"] {
        store
            .upsert_account(&selector_svc::store::AccountInput {
                name: name.into(),
                group: "default".into(),
                platform: selector_svc::domain::Platform::Anthropic,
                base_url: upstream.base_url.clone(),
                credential_kind: selector_svc::domain::CredentialKind::ApiKey,
                credential: Some(selector_svc::domain::Secret::new(format!("k-{name}"))),
                oauth: None,
                priority: 0,
                weight: 1,
                concurrency_limit: 2,
                rpm_limit: 0,
                session_window_limit_usd: 0.0,
                allowed_models: vec![],
                model_mapping: Default::default(),
                proxy_url: None,
            })
            .await
            .expect("account");
    }
    let (_, key) = store
        .create_api_key("t", "u", "default", 0)
        .await
        .expect("key");
    let selector_config = selector_svc::server::Config {
        database_url: postgres.url(),
        redis_target: RedisTarget::Single(redis.url()),
        redis_options: RedisOptions::default(),
        keyring,
        admin_token: None,
        settings: Default::default(),
        refresh: Default::default(),
        reload_interval: Duration::from_secs(3600),
        refresh_interval: Duration::from_secs(3600),
        max_concurrent_streams: 10_000,
        tls: None,
    };
    let selector =
        selector_svc::server::build(&selector_config, selector_svc::metrics::Metrics::new())
            .await
            .expect("selector");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let selector_addr = listener.local_addr().expect("addr");
    let serving = selector.selector.clone();
    tokio::spawn(async move {
        let _ = selector_svc::server::serve_selector(
            serving,
            &selector_config,
            listener,
            None,
            std::future::pending(),
        )
        .await;
    });
    let admission_ports = [free_port().expect("port"), free_port().expect("port")];
    let admissions: Vec<Process> = admission_ports
        .iter()
        .map(|port| {
            Process(
                Command::new(binary("admission-svc"))
                    .args([
                        "--listen",
                        &format!("127.0.0.1:{port}"),
                        "--metrics-listen",
                        &format!("127.0.0.1:{}", free_port().expect("port")),
                    ])
                    .args([
                        "--redis-url",
                        &redis.url(),
                        "--shutdown-grace-ms",
                        "1000",
                        "--orphan-grace-ms",
                        "3000",
                    ])
                    .env_remove("RUST_LOG")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("admission starts"),
            )
        })
        .collect();
    for port in admission_ports {
        eventually(Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        })
        .await
        .expect("admission listens");
    }
    let config = relay_svc::server::Config {
        mode: relay_svc::server::Mode::Remote {
            selector: vec![format!("http://{selector_addr}")],
            admission: admission_ports
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect(),
            tls_ca: None,
        },
        relay: RelaySettings {
            max_wait: Duration::from_secs(20),
            ..RelaySettings::default()
        },
        blocks: Default::default(),
        admission: Default::default(),
        shutdown_grace: Duration::from_secs(5),
    };
    let relay = relay_svc::server::build(&config, Metrics::new()).expect("relay");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(relay_svc::server::serve(
        relay,
        listener,
        std::future::pending(),
        Duration::from_secs(1),
    ));
    let http = reqwest::Client::new();
    let key = key.expose().to_owned();
    let requests: Vec<_> = (0..60)
        .map(|n| {
            let (http, key) = (http.clone(), key.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(n * 15)).await;
                let response = http
                    .post(format!("http://{addr}/v1/messages"))
                    .header("x-api-key", &key)
                    .json(&json!({"model": "claude-x", "max_tokens": 8, "stream": n % 2 == 0, "messages": [{"role": "user", "content": "hi"}]}))
                    .send()
                    .await;
                match response {
                    Ok(response) => response.status().as_u16(),
                    Err(_) => 0,
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    admissions[0].terminate();
    let mut statuses = Vec::new();
    for request in requests {
        statuses.push(request.await.expect("task"));
    }
    for credential in ["k-a", "k-b"] {
        let peak = upstream.stats(credential).peak;
        assert!(
            peak <= 2,
            "{credential} saw {peak} concurrent requests, limit 2"
        );
    }
    let served = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "a response or a clean error: {statuses:?}"
    );
    assert!(
        served >= 50,
        "most requests served across the rollout: {served}/60"
    );
    // Nothing is left held once everything has ended (orphaned leases expire within 3 s).
    let conn = redis.client().await.expect("redis");
    eventually(Duration::from_secs(8), || {
        let mut conn = conn.clone();
        async move {
            let mut total = 0u32;
            for id in [1, 2] {
                let (secs, _): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.ok()?;
                let held: u32 = redis::cmd("ZCOUNT")
                    .arg(AccountKeys::new(id).leases)
                    .arg(secs * 1000)
                    .arg("+inf")
                    .query_async(&mut conn)
                    .await
                    .ok()?;
                total += held;
            }
            (total == 0).then_some(())
        }
    })
    .await
    .expect("no lease left held");
}
