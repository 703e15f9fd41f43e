//! What client connections cost the relay in memory: the relay's peak resident set
//! (`VmHWM`) in two scenarios, each on a fresh standalone relay process over the fake upstream:
//!
//! - `slow`: `--connections` connections without an API key, each announcing a 31 MB body and
//!   sending a little of it every 100 ms for `--seconds`;
//! - `large`: one authenticated `--mb` MB Messages request (one large user message), answered by
//!   the fake upstream.
//!
//! Prints the relay's VmHWM at start and after each scenario. `--relay` picks the binary (to
//! compare builds: the one next to this bench by default). Linux only (reads /proc).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use poolgate_testkit::fake_upstream::FakeUpstream;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[derive(Parser)]
struct Args {
    /// The relay binary (default: `relay-svc` beside this bench).
    #[arg(long)]
    relay: Option<PathBuf>,
    /// Slow unauthenticated connections.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// How long the slow connections keep sending.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Size of the large authenticated request, MB.
    #[arg(long, default_value_t = 30)]
    mb: usize,
}

struct Relay {
    child: Child,
    port: u16,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const KEY: &str = "sk-edge-memory";

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

async fn start(binary: &PathBuf, upstream: &FakeUpstream, dir: &std::path::Path) -> Relay {
    let config = dir.join("relay.yaml");
    std::fs::write(
        &config,
        format!(
            "api_keys:\n  - {{key: {KEY}, group: default, user: u}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{}\", api_key: cred-a}}\n",
            upstream.base_url
        ),
    )
    .expect("config");
    let port = poolgate_testkit::free_port().expect("port");
    let child = Command::new(binary)
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
            &(64usize << 20).to_string(),
        ])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("relay starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "the relay did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Relay { child, port }
}

async fn slow_unauthenticated(relay: &Relay, connections: usize, seconds: f64) {
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: relay\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        31 << 20
    );
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..connections)
        .map(|_| {
            let head = head.clone();
            let port = relay.port;
            tokio::spawn(async move {
                let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)).await else {
                    return;
                };
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b' '; 64 << 10];
                while Instant::now() < until {
                    if stream.write_all(&chunk).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
}

async fn large_request(relay: &Relay, mb: usize) -> u16 {
    let filler = "x".repeat(mb << 20);
    let body = format!(
        r#"{{"model":"claude-x","max_tokens":8,"messages":[{{"role":"user","content":"{filler}"}}]}}"#
    );
    reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/v1/messages", relay.port))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let binary = args.relay.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("relay-svc")))
            .unwrap_or_else(|| PathBuf::from("relay-svc"))
    });
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let dir = std::env::temp_dir().join(format!("poolgate-edge-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    println!("relay: {}", binary.display());

    let relay = start(&binary, &upstream, &dir).await;
    let idle = vm_hwm_kib(relay.child.id()).unwrap_or(0);
    slow_unauthenticated(&relay, args.connections, args.seconds).await;
    let slow = vm_hwm_kib(relay.child.id()).unwrap_or(0);
    println!(
        "slow: {} unauthenticated connections x 31 MB announced, {:.0} s: VmHWM {:.1} MiB at start, {:.1} MiB after (+{:.1} MiB)",
        args.connections,
        args.seconds,
        idle as f64 / 1024.0,
        slow as f64 / 1024.0,
        slow.saturating_sub(idle) as f64 / 1024.0
    );
    drop(relay);

    let relay = start(&binary, &upstream, &dir).await;
    let idle = vm_hwm_kib(relay.child.id()).unwrap_or(0);
    let status = large_request(&relay, args.mb).await;
    let large = vm_hwm_kib(relay.child.id()).unwrap_or(0);
    let grown = large.saturating_sub(idle) as f64 / 1024.0;
    println!(
        "large: one {} MB request (status {status}): VmHWM {:.1} MiB at start, {:.1} MiB after (+{:.1} MiB, {:.1}x the body)",
        args.mb,
        idle as f64 / 1024.0,
        large as f64 / 1024.0,
        grown,
        grown / args.mb as f64
    );
    let _ = std::fs::remove_dir_all(&dir);
}
