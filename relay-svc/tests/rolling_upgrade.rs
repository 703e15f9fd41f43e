//! A rolling upgrade under load (docs/DESIGN.md §8, "Upgrades"): the distributed stack runs the
//! previous release's binaries (built once from the revision `scripts/previous-release.txt`
//! records; `scripts/previous_release.sh`) over a schema this release migrated, while clients
//! send requests through a balancer that, like a Kubernetes Service, stops sending to a relay
//! before it is replaced. The selector, then each admission replica, then each relay is replaced
//! by this release's, one at a time: no account holds more than its limit, no lease is left
//! behind, and no request fails but for one race of the previous release (its relays' selector
//! calls as its selector closes; bounded below, and said in docs/DESIGN.md §8).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common;

use common::processes::{Env, Process, binary, previous_release_binary};
use poolgate_testkit::fake_upstream::FakeUpstream;
use poolgate_testkit::{PostgresServer, RedisServer, eventually, free_port};
use serde_json::json;

/// How many requests each account takes at once.
const LIMIT: i32 = 3;

/// A Kubernetes Service in front of a set of pods: a TCP proxy that sends each new connection to
/// one of the backends in service, in turn. Taking a backend out sends it no new connection;
/// the ones it has end when it closes them (its graceful stop).
#[derive(Clone)]
struct Service {
    port: u16,
    backends: Arc<Mutex<Vec<u16>>>,
}

impl Service {
    async fn start(backends: Vec<u16>) -> Service {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let service = Service {
            port,
            backends: Arc::new(Mutex::new(backends)),
        };
        let routes = service.backends.clone();
        tokio::spawn(async move {
            let mut turn = 0usize;
            while let Ok((mut inbound, _)) = listener.accept().await {
                let backend = {
                    let ports = routes.lock().unwrap_or_else(|p| p.into_inner());
                    turn += 1;
                    ports.get(turn % ports.len().max(1)).copied()
                };
                let Some(backend) = backend else { continue };
                tokio::spawn(async move {
                    if let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", backend)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        service
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn set(&self, backends: &[u16]) {
        *self.backends.lock().unwrap_or_else(|p| p.into_inner()) = backends.to_vec();
    }
}

struct Stack {
    env: Env,
    selector_ports: [u16; 2],
    admission_ports: [u16; 2],
    relay_ports: [u16; 2],
    /// The selectors' and the admission replicas' Services, as the relays reach them.
    selectors: Service,
    admissions: Service,
}

impl Stack {
    fn selector_urls(&self) -> String {
        self.selectors.url()
    }

    fn admission_urls(&self) -> String {
        self.admissions.url()
    }

    /// A selector or an admission replica (both take only their two listeners here).
    fn service(&self, path: std::path::PathBuf, port: u16, label: &str) -> Process {
        let listen = format!("127.0.0.1:{port}");
        let metrics = format!("127.0.0.1:{}", free_port().expect("port"));
        self.env.spawn_of(
            path,
            label,
            &["--listen", &listen, "--metrics-listen", &metrics],
        )
    }

    fn relay(&self, path: std::path::PathBuf, port: u16, label: &str) -> Process {
        let listen = format!("127.0.0.1:{port}");
        let metrics = format!("127.0.0.1:{}", free_port().expect("port"));
        let (selectors, admissions) = (self.selector_urls(), self.admission_urls());
        self.env.spawn_of(
            path,
            label,
            &[
                "--listen",
                &listen,
                "--metrics-listen",
                &metrics,
                "--selector-url",
                &selectors,
                "--admission-url",
                &admissions,
            ],
        )
    }
}

async fn listening(port: u16) {
    eventually(Duration::from_secs(30), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(|_| ())
    })
    .await
    .unwrap_or_else(|_| panic!("nothing listens on {port}"));
}

/// Stops `process` the graceful way and waits for it to be gone.
async fn stop(mut process: Process) {
    process.terminate();
    for _ in 0..300 {
        if matches!(process.0.try_wait(), Ok(Some(_))) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    process.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_release_is_replaced_one_service_at_a_time_under_load() {
    let previous = |name: &str| previous_release_binary(name);
    let (postgres, redis) = tokio::join!(PostgresServer::start(), RedisServer::start());
    let (postgres, redis) = (postgres.expect("postgres"), redis.expect("redis"));
    let upstream = FakeUpstream::start().await.expect("upstream");
    let port = || free_port().expect("port");
    let keys = format!("k1:{}", poolgate_select::crypto::Keyring::generate_key());
    let (selector_ports, admission_ports) = ([port(), port()], [port(), port()]);
    let stack = Stack {
        env: Env {
            vars: vec![
                ("POOLGATE_DATABASE_URL".into(), postgres.url()),
                ("POOLGATE_REDIS_URL".into(), redis.url()),
                ("POOLGATE_CREDENTIAL_KEYS".into(), keys),
                ("SELECTOR_ADMIN_TOKEN".into(), "admin-token".into()),
            ],
        },
        selector_ports,
        admission_ports,
        relay_ports: [port(), port()],
        selectors: Service::start(vec![selector_ports[0]]).await,
        admissions: Service::start(admission_ports.to_vec()).await,
    };
    // This release's schema, which the previous release's selector runs on (its minimum).
    let migrated = stack.env.run("selector-svc", &["migrate"], &[]);
    assert!(migrated.contains("migrations applied"), "{migrated}");

    let old_selector = stack.service(
        previous("selector-svc"),
        stack.selector_ports[0],
        "selector-old",
    );
    let mut admissions: Vec<Process> = stack
        .admission_ports
        .iter()
        .enumerate()
        .map(|(n, port)| {
            stack.service(
                previous("admission-svc"),
                *port,
                &format!("admission-{n}-old"),
            )
        })
        .collect();
    let mut relays: Vec<Process> = stack
        .relay_ports
        .iter()
        .enumerate()
        .map(|(n, port)| stack.relay(previous("relay-svc"), *port, &format!("relay-{n}-old")))
        .collect();
    listening(stack.selector_ports[0]).await;
    let endpoint = stack.selectors.url();
    let admin_env = [("SELECTOR_ENDPOINT", endpoint.as_str())];
    for name in ["up-a", "up-b"] {
        let credential = format!("cred-{name}");
        let concurrency = LIMIT.to_string();
        stack.env.run(
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
                &concurrency,
            ],
            &[("ACCOUNT_CREDENTIAL", credential.as_str()), admin_env[0]],
        );
    }
    let created = stack.env.run(
        "selector-svc",
        &[
            "admin",
            "create-key",
            "--user",
            "alice",
            "--group",
            "default",
        ],
        &admin_env,
    );
    let key = created
        .lines()
        .find_map(|line| line.strip_prefix("api_key="))
        .expect("the key is printed")
        .to_owned();
    for port in stack.relay_ports {
        listening(port).await;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    for port in stack.relay_ports {
        let base = format!("http://127.0.0.1:{port}");
        eventually(Duration::from_secs(30), || async {
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
        .expect("the previous release serves");
    }

    // The load: each client sends to the relays the balancer has in service, in turn.
    upstream.set_delay(Duration::from_millis(40));
    let in_service: Arc<Mutex<Vec<u16>>> = Arc::new(Mutex::new(stack.relay_ports.to_vec()));
    let stop_load = Arc::new(AtomicBool::new(false));
    // Which step the upgrade is at, recorded with a failure: 0 before, 1 the selector, 2 and 3
    // the admission replicas, 4 and 5 the relays, 6 after.
    let phase = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..6)
        .map(|n| {
            let (http, key, in_service, stop_load, phase) = (
                http.clone(),
                key.clone(),
                in_service.clone(),
                stop_load.clone(),
                phase.clone(),
            );
            tokio::spawn(async move {
                let mut failed = Vec::new();
                let mut sent = 0usize;
                while !stop_load.load(Ordering::Relaxed) {
                    let port = {
                        let ports = in_service.lock().unwrap_or_else(|p| p.into_inner());
                        ports[(n + sent) % ports.len()]
                    };
                    sent += 1;
                    let answer = http
                        .post(format!("http://127.0.0.1:{port}/v1/messages"))
                        .header("x-api-key", &key)
                        .json(&json!({"model": "claude-x", "max_tokens": 8, "stream": sent.is_multiple_of(2), "messages": [{"role": "user", "content": format!("load {n}")}]}))
                        .send()
                        .await;
                    let (status, body) = match answer {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            let body = response.text().await.unwrap_or_default();
                            if status == 200 && body.contains("\"type\":\"error\"") {
                                (0, body)
                            } else {
                                (status, body)
                            }
                        }
                        Err(error) => (0, error.to_string()),
                    };
                    if status != 200 {
                        let phase = phase.load(Ordering::Relaxed);
                        failed.push((phase, port, status, body.chars().take(300).collect::<String>()));
                    }
                }
                (sent, failed)
            })
        })
        .collect();
    let settle = Duration::from_millis(1500);
    tokio::time::sleep(settle).await;

    phase.store(1, Ordering::Relaxed);
    // 1. The selector: this release's beside the old one in the Service, then the old one out
    // and stopped.
    let new_selector = stack.service(
        binary("selector-svc"),
        stack.selector_ports[1],
        "selector-new",
    );
    listening(stack.selector_ports[1]).await;
    stack.selectors.set(&stack.selector_ports);
    tokio::time::sleep(settle).await;
    stack.selectors.set(&stack.selector_ports[1..]);
    stop(old_selector).await;
    tokio::time::sleep(settle).await;

    // 2. Each admission replica, in turn: out of its Service, stopped, replaced on its address,
    // back in.
    for (n, port) in stack.admission_ports.iter().enumerate() {
        phase.store(2 + n, Ordering::Relaxed);
        let others: Vec<u16> = stack
            .admission_ports
            .iter()
            .copied()
            .filter(|p| p != port)
            .collect();
        stack.admissions.set(&others);
        let old = admissions.remove(0);
        stop(old).await;
        admissions.push(stack.service(
            binary("admission-svc"),
            *port,
            &format!("admission-{n}-new"),
        ));
        listening(*port).await;
        stack.admissions.set(&stack.admission_ports);
        tokio::time::sleep(settle).await;
    }

    // 3. Each relay, in turn: out of the balancer, drained by its graceful stop, replaced on its
    // address, back in.
    for (n, port) in stack.relay_ports.iter().enumerate() {
        phase.store(4 + n, Ordering::Relaxed);
        in_service
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|p| p != port);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let old = relays.remove(0);
        stop(old).await;
        relays.push(stack.relay(binary("relay-svc"), *port, &format!("relay-{n}-new")));
        listening(*port).await;
        in_service
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(*port);
        tokio::time::sleep(settle).await;
    }

    phase.store(6, Ordering::Relaxed);
    stop_load.store(true, Ordering::Relaxed);
    let mut sent = 0;
    let mut failed = Vec::new();
    for client in clients {
        let (n, f) = client.await.expect("a client");
        sent += n;
        failed.extend(f);
    }
    upstream.set_delay(Duration::ZERO);
    assert!(sent > 50, "under load: {sent} requests");
    // The one failure seen: while the previous release's selector stops (step 1), a previous
    // release's relay answers 503 "account selection is unavailable" to a request whose
    // selector call met the closing connection (0.1.0 relays ask the selector for every plan and
    // do not retry it; this release's plan at the edge). Rare (3 of 2 189 in one run of five),
    // bounded here, and nowhere else: every other step, and every request a relay of this
    // release served, succeeded (docs/DESIGN.md §8).
    let (tolerated, other): (Vec<_>, Vec<_>) =
        failed.iter().partition(|(phase, _, status, body)| {
            *phase == 1 && *status == 503 && body.contains("account selection is unavailable")
        });
    assert!(
        other.is_empty(),
        "{} of {sent} requests failed, the first: {:?}",
        other.len(),
        &other[..other.len().min(20)]
    );
    assert!(
        tolerated.len() * 100 <= sent,
        "{} of {sent} requests met the previous release's selector closing",
        tolerated.len()
    );
    for credential in ["cred-up-a", "cred-up-b"] {
        let peak = upstream.stats(credential).peak;
        assert!(
            peak <= LIMIT as u32,
            "{credential} held {peak} requests at once (limit {LIMIT})"
        );
    }
    // No lease left behind: every account's lease set empties.
    let mut redis = redis.client().await.expect("redis");
    let leaked = eventually(Duration::from_secs(15), || {
        let mut redis = redis.clone();
        async move {
            let mut held = 0i64;
            for id in 1..=2 {
                let key = format!("pg:{{a:{id}}}:leases");
                let now_ms = poolgate_core::now_ms();
                let live: i64 = redis::cmd("ZCOUNT")
                    .arg(&key)
                    .arg(now_ms)
                    .arg("+inf")
                    .query_async(&mut redis)
                    .await
                    .ok()?;
                held += live;
            }
            (held == 0).then_some(())
        }
    })
    .await;
    let _: Option<i64> = redis::cmd("DBSIZE").query_async(&mut redis).await.ok();
    assert!(leaked.is_ok(), "leases were left behind after the upgrade");
    drop(new_selector);
    drop(admissions);
    drop(relays);
}
