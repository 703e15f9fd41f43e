//! The HTTP front under hostile clients (docs/SECURITY.md, "The HTTP front"), against the relay
//! binary the test run builds, with short edge timeouts so a debug build shows them: a request
//! without a good key is answered and closed before its body is read; slow senders are cut off
//! while a real slow upload at a fair rate is served; the bytes buffered across connections are
//! bounded; headers must arrive in time; bad JSON of every kind gets a 4xx in the client's format.
//! (Memory figures are the benchmark's: docs/BENCHMARKS.md.)

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::processes::{Process, binary};
use poolgate_testkit::fake_upstream::FakeUpstream;
use poolgate_testkit::{eventually, free_port};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const KEY: &str = "sk-hostile-client";
const MAX_BODY: usize = 2 << 20;
const MAX_BUFFERED: usize = 4 << 20;

struct Relay {
    _process: Process,
    port: u16,
    _upstream: FakeUpstream,
}

async fn start() -> Relay {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let upstream = FakeUpstream::start().await.expect("upstream");
    let dir = std::env::temp_dir().join(format!(
        "poolgate-hostile-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let config: PathBuf = dir.join("relay.yaml");
    std::fs::write(
        &config,
        format!(
            "api_keys:\n  - {{key: {KEY}, group: default, user: u}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{base}\", api_key: cred-a}}\n",
            base = upstream.base_url
        ),
    )
    .expect("config");
    let port = free_port().expect("port");
    let process = Process(
        Command::new(binary("relay-svc"))
            .args(["--standalone", "--config"])
            .arg(&config)
            .arg("--state-file")
            .arg(dir.join("state.json"))
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--metrics-listen",
                "127.0.0.1:0",
                "--max-body-bytes",
                &MAX_BODY.to_string(),
                "--max-buffered-bytes",
                &MAX_BUFFERED.to_string(),
                "--header-read-timeout-ms",
                "1500",
                "--body-idle-timeout-ms",
                "1500",
                "--body-rate-grace-ms",
                "1500",
                "--body-min-rate",
                "20000",
            ])
            .env_remove("RUST_LOG")
            .env_remove("RELAY_ADMIN_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("relay starts"),
    );
    eventually(Duration::from_secs(10), || async {
        TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(|_| ())
    })
    .await
    .expect("relay listens");
    Relay {
        _process: process,
        port,
        _upstream: upstream,
    }
}

/// A message request's head, announcing `length` body bytes.
fn head(key: Option<&str>, length: usize) -> String {
    let auth = key.map_or(String::new(), |key| format!("x-api-key: {key}\r\n"));
    format!(
        "POST /v1/messages HTTP/1.1\r\nhost: relay\r\ncontent-type: application/json\r\nanthropic-version: 2023-06-01\r\n{auth}content-length: {length}\r\n\r\n"
    )
}

/// Reads what the relay sends until it closes the connection (or resets it, or `within` ends):
/// the text, and whether it closed.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, bool) {
    let mut seen = Vec::new();
    let mut buffer = [0u8; 8192];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&seen).into_owned(), true),
            Ok(Ok(n)) => seen.extend_from_slice(&buffer[..n]),
            Err(_) => return (String::from_utf8_lossy(&seen).into_owned(), false),
        }
    }
}

fn status_of(response: &str) -> Option<u16> {
    response.split_whitespace().nth(1)?.parse().ok()
}

fn json_body(response: &str) -> Option<Value> {
    let body = response.split("\r\n\r\n").nth(1)?;
    serde_json::from_str(body).ok()
}

fn message_body(size: usize) -> String {
    let filler = "x".repeat(size.saturating_sub(120));
    format!(
        r#"{{"model":"claude-x","max_tokens":8,"messages":[{{"role":"user","content":"{filler}"}}]}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_and_a_slow_huge_body_is_answered_and_closed_before_the_body_is_read() {
    let relay = start().await;
    for key in [None, Some("sk-wrong-key")] {
        let mut stream = TcpStream::connect(("127.0.0.1", relay.port))
            .await
            .expect("connect");
        let started = Instant::now();
        stream
            .write_all(head(key, 31 << 20).as_bytes())
            .await
            .expect("head");
        // A few bytes of the 31 MB, then nothing more: the answer must not wait for the rest.
        let _ = stream.write_all(b"{\"model\":").await;
        let (response, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
        assert_eq!(status_of(&response), Some(401), "{key:?}: {response}");
        assert!(
            closed,
            "{key:?}: the connection is closed, not kept for the body"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "answered at once: {:?}",
            started.elapsed()
        );
        let error = json_body(&response).expect("a JSON error body");
        assert_eq!(error["type"], "error", "{error}");
        assert_eq!(error["error"]["type"], "authentication_error", "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_that_stalls_or_trickles_gets_a_408_and_the_connection_closed() {
    let relay = start().await;
    // Stalls after the first bytes: the idle timeout.
    let mut stalled = TcpStream::connect(("127.0.0.1", relay.port))
        .await
        .expect("connect");
    stalled
        .write_all(head(Some(KEY), 100_000).as_bytes())
        .await
        .expect("head");
    stalled.write_all(b"{\"model\":").await.expect("bytes");
    let (response, closed) = read_until_closed(&mut stalled, Duration::from_secs(8)).await;
    assert_eq!(status_of(&response), Some(408), "{response}");
    assert!(closed);
    // Trickles: a byte every 100 ms never idles, but falls under the minimum rate.
    let mut trickling = TcpStream::connect(("127.0.0.1", relay.port))
        .await
        .expect("connect");
    trickling
        .write_all(head(Some(KEY), 100_000).as_bytes())
        .await
        .expect("head");
    let reader = tokio::spawn(async move {
        let mut trickling = trickling;
        let started = Instant::now();
        loop {
            if trickling.write_all(b" ").await.is_err()
                || started.elapsed() > Duration::from_secs(8)
            {
                break;
            }
            let mut buffer = [0u8; 4096];
            if let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(100), trickling.read(&mut buffer)).await
            {
                return String::from_utf8_lossy(&buffer[..n]).into_owned();
            }
        }
        String::new()
    });
    let response = reader.await.expect("reader");
    assert_eq!(status_of(&response), Some(408), "{response}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_slow_upload_at_a_fair_rate_is_served() {
    let relay = start().await;
    let body = message_body(300_000);
    let mut stream = TcpStream::connect(("127.0.0.1", relay.port))
        .await
        .expect("connect");
    stream
        .write_all(head(Some(KEY), body.len()).as_bytes())
        .await
        .expect("head");
    // 300 kB in 25 kB steps every 500 ms: about 50 kB/s for 6 s, past the grace, above the rate.
    for chunk in body.as_bytes().chunks(25_000) {
        stream.write_all(chunk).await.expect("chunk");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut response = Vec::new();
    let mut buffer = [0u8; 8192];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&response).contains("\"usage\"") {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Ok(Ok(n)) if n > 0 => response.extend_from_slice(&buffer[..n]),
            _ => break,
        }
    }
    let response = String::from_utf8_lossy(&response);
    assert_eq!(status_of(&response), Some(200), "{response}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_buffered_across_connections_are_bounded_and_past_it_the_answer_is_a_503() {
    let relay = start().await;
    // Two uploads of 2 MiB each hold the whole 4 MiB budget while they are being sent.
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(("127.0.0.1", relay.port))
            .await
            .expect("connect");
        stream
            .write_all(head(Some(KEY), MAX_BODY).as_bytes())
            .await
            .expect("head");
        stream.write_all(&[b' '; 1000]).await.expect("bytes");
        holders.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut third = TcpStream::connect(("127.0.0.1", relay.port))
        .await
        .expect("connect");
    third
        .write_all(head(Some(KEY), 1 << 20).as_bytes())
        .await
        .expect("head");
    let (response, closed) = read_until_closed(&mut third, Duration::from_secs(3)).await;
    assert_eq!(status_of(&response), Some(503), "{response}");
    assert!(closed);
    let error = json_body(&response).expect("a JSON error body");
    assert_eq!(error["error"]["type"], "overloaded_error", "{error}");
    // Once the holders are gone, the budget is back.
    drop(holders);
    let served = eventually(Duration::from_secs(5), || async {
        let response = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/v1/messages", relay.port))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .body(message_body(1 << 20))
            .send()
            .await
            .ok()?;
        (response.status() == 200).then_some(())
    })
    .await;
    assert_eq!(served, Ok(()), "the budget is given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_that_never_end_are_cut_off() {
    let relay = start().await;
    let mut stream = TcpStream::connect(("127.0.0.1", relay.port))
        .await
        .expect("connect");
    stream
        .write_all(b"POST /v1/messages HTTP/1.1\r\nhost: relay\r\n")
        .await
        .expect("part of a head");
    let started = Instant::now();
    // A header line now and then, never the blank line that ends them.
    let mut closed = false;
    for n in 0..40 {
        if stream
            .write_all(format!("x-flood-{n}: {}\r\n", "a".repeat(100)).as_bytes())
            .await
            .is_err()
        {
            closed = true;
            break;
        }
        let mut buffer = [0u8; 1024];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buffer)).await
        {
            closed = true;
            break;
        }
    }
    assert!(closed, "the relay closed a head that never ended");
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_nesting_invalid_utf8_and_garbage_get_a_400_in_the_clients_format() {
    let relay = start().await;
    let client = reqwest::Client::new();
    let deep = format!(
        r#"{{"model":"claude-x","max_tokens":8,"messages":{}{}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let invalid_utf8: Vec<u8> = b"{\"model\":\"claude-\xff\xfe\",\"max_tokens\":8}".to_vec();
    for body in [deep.into_bytes(), invalid_utf8, b"\x00\x01garbage".to_vec()] {
        let response = client
            .post(format!("http://127.0.0.1:{}/v1/messages", relay.port))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .body(body)
            .send()
            .await
            .expect("answered");
        assert_eq!(response.status(), 400);
        let error: Value = response.json().await.expect("a JSON error");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_http2_streams_on_one_connection_are_all_served() {
    let relay = start().await;
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    let requests = (0..300).map(|_| {
        let client = client.clone();
        let url = format!("http://127.0.0.1:{}/v1/models", relay.port);
        async move {
            client
                .get(url)
                .header("x-api-key", KEY)
                .header("anthropic-version", "2023-06-01")
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    let statuses = futures_util::future::join_all(requests).await;
    let served = statuses.iter().filter(|s| matches!(s, Ok(200))).count();
    assert_eq!(served, 300, "{:?}", &statuses[..5]);
}
