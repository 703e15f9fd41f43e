//! Graceful shutdown: SIGTERM to a relay in the middle of a streamed response lets the stream
//! finish and frees everything; SIGTERM to one of two admission replicas under load never lets
//! the upstream see more than an account's limit.

use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::processes::{Process, binary};
use futures_util::StreamExt;
use poolgate_runtime::redis_keys::AccountKeys;
use poolgate_testkit::fake_upstream::FakeUpstream;
use poolgate_testkit::{eventually, free_port};
use relay_svc::proxy::RelaySettings;
use serde_json::json;

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
                "--metrics-listen",
                "127.0.0.1:0",
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
    let backends = common::backends().await.expect("backends start");
    let upstream = FakeUpstream::start().await.expect("upstream");
    upstream.set_delay(Duration::from_millis(30));
    upstream.set_chunk_delay(Duration::from_millis(20));
    for name in ["a", "b"] {
        backends
            .store
            .upsert_account(&common::account(name, &upstream.base_url, 2, 0))
            .await
            .expect("account");
    }
    let (_, key) = backends
        .store
        .create_api_key("t", "u", "default", 0)
        .await
        .expect("key");
    let (_selector, selector_addr) = common::selector(&backends).await.expect("selector starts");
    let redis = &backends.redis;
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
                    .env("POOLGATE_SERVICE_TOKEN", common::SERVICE_TOKEN)
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
    let addr = common::relay(
        vec![format!("http://{selector_addr}")],
        admission_ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect(),
        RelaySettings {
            max_wait: Duration::from_secs(20),
            ..RelaySettings::default()
        },
    )
    .await
    .expect("relay starts");
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
