//! The data plane survives the control plane (docs/DESIGN.md §2, "Selection at the edge"), every
//! service a separate process: 2 selectors, 1 admission replica, 2 relays over one Redis and one
//! Postgres, 4 accounts, 8 clients in a loop over both relays. Every selector is killed (`kill -9`)
//! under the load: the relays keep serving every request from their last view; a relay started
//! during the outage, which never had a view, answers a clear 503 in the client's format; when a
//! selector comes back, the relays' streams reopen and the usage of every request served through
//! the outage reaches Postgres: nothing is lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::common;

use common::processes::{Databases, Env, Process};
use poolgate_testkit::fake_upstream::FakeUpstream;
use poolgate_testkit::{eventually, free_port};
use serde_json::{Value, json};

const SELECTORS: usize = 2;
const RELAYS: usize = 2;
const CLIENTS: usize = 8;

struct Cluster {
    env: Env,
    http: reqwest::Client,
    key: String,
    selector_ports: Vec<u16>,
    selectors: Vec<Option<Process>>,
    admission_url: String,
    relays: Vec<(Process, u16, u16)>,
}

impl Cluster {
    fn start_selector(&mut self, n: usize) {
        self.selectors[n] = Some(self.env.spawn(
            "selector-svc",
            &format!("selector-{n}"),
            &[
                "--listen",
                &format!("127.0.0.1:{}", self.selector_ports[n]),
                "--metrics-listen",
                &format!("127.0.0.1:{}", free_port().expect("port")),
            ],
        ));
    }

    fn selector_urls(&self) -> String {
        self.selector_ports
            .iter()
            .map(|port| format!("http://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts a relay; answers its client and metrics ports.
    fn start_relay(&mut self, n: usize) -> (u16, u16) {
        let (port, metrics) = (free_port().expect("port"), free_port().expect("port"));
        let process = self.env.spawn(
            "relay-svc",
            &format!("relay-{n}"),
            &[
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--metrics-listen",
                &format!("127.0.0.1:{metrics}"),
                "--selector-url",
                &self.selector_urls(),
                "--admission-url",
                &self.admission_url,
                "--max-wait-ms",
                "10000",
            ],
        );
        self.relays.push((process, port, metrics));
        (port, metrics)
    }

    async fn metric(&self, metrics_port: u16, name: &str) -> f64 {
        let Ok(response) = self
            .http
            .get(format!("http://127.0.0.1:{metrics_port}/metrics"))
            .send()
            .await
        else {
            return 0.0;
        };
        let text = response.text().await.unwrap_or_default();
        text.lines()
            .filter(|line| line.starts_with(name) && !line.starts_with('#'))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// One request: `Ok(())` served, else the status and body.
async fn request(http: &reqwest::Client, port: u16, key: &str) -> Result<(), (u16, String)> {
    let body = json!({"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    let response = http
        .post(format!("http://127.0.0.1:{port}/v1/messages"))
        .header("x-api-key", key)
        .json(&body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .map_err(|error| (0, error.to_string()))?;
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    let served =
        status == 200 && serde_json::from_str::<Value>(&text).is_ok_and(|v| v["type"] == "message");
    if served { Ok(()) } else { Err((status, text)) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relays_keep_serving_from_their_view_while_every_selector_is_down() {
    let Databases {
        postgres: _postgres,
        redis: _redis,
        store,
        env,
    } = Databases::start().await;
    let upstream = FakeUpstream::start().await.expect("upstream");
    upstream.set_delay(Duration::from_millis(20));
    for n in 0..4 {
        let input = common::account(&format!("outage-{n}"), &upstream.base_url, 4, 0);
        store.upsert_account(&input).await.expect("account");
    }
    let (key_id, key) = store
        .create_api_key("outage", "outage", "default", 0)
        .await
        .expect("api key");
    let admission_port = free_port().expect("port");
    let _admission = env.spawn(
        "admission-svc",
        "admission",
        &[
            "--listen",
            &format!("127.0.0.1:{admission_port}"),
            "--metrics-listen",
            &format!("127.0.0.1:{}", free_port().expect("port")),
        ],
    );
    let mut cluster = Cluster {
        env,
        http: {
            let _ = rustls::crypto::ring::default_provider().install_default();
            reqwest::Client::new()
        },
        key: key.expose().to_owned(),
        selector_ports: (0..SELECTORS).map(|_| free_port().expect("port")).collect(),
        selectors: (0..SELECTORS).map(|_| None).collect(),
        admission_url: format!("http://127.0.0.1:{admission_port}"),
        relays: Vec::new(),
    };
    for n in 0..SELECTORS {
        cluster.start_selector(n);
    }
    let relays: Vec<(u16, u16)> = (0..RELAYS).map(|n| cluster.start_relay(n)).collect();
    let served = Arc::new(AtomicU64::new(0));
    for (port, metrics) in &relays {
        eventually(Duration::from_secs(30), || async {
            request(&cluster.http, *port, &cluster.key).await.ok()
        })
        .await
        .expect("the relay serves");
        served.fetch_add(1, Ordering::SeqCst);
        eventually(Duration::from_secs(10), || async {
            (cluster.metric(*metrics, "relay_view_updates_total").await > 0.0).then_some(())
        })
        .await
        .expect("the relay follows the selector's view");
    }

    // Steady load over both relays.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (http, key, port) = (
                cluster.http.clone(),
                cluster.key.clone(),
                relays[c % RELAYS].0,
            );
            let (stop, served, failures) = (stop.clone(), served.clone(), failures.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    match request(&http, port, &key).await {
                        Ok(()) => {
                            served.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(failure) => failures
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(failure),
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_kill = served.load(Ordering::SeqCst);
    for selector in &mut cluster.selectors {
        if let Some(process) = selector.take() {
            process.kill9();
        }
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    let during = served.load(Ordering::SeqCst) - before_kill;

    // A relay that never had a view: a clear 503 in the client's format.
    let (fresh_port, _) = cluster.start_relay(RELAYS);
    let refused = eventually(Duration::from_secs(20), || async {
        match request(&cluster.http, fresh_port, &cluster.key).await {
            Err((503, body)) => Some(body),
            _ => None,
        }
    })
    .await
    .expect("a relay without a view answers 503");
    let error: Value = serde_json::from_str(&refused).expect("a JSON error");
    assert_eq!(error["type"], "error", "{refused}");
    assert!(error["error"]["message"].is_string(), "{refused}");

    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.expect("client task");
    }
    let failed = failures.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        failed.is_empty(),
        "every request was served through the outage; failed: {:?}",
        &failed[..failed.len().min(3)]
    );
    assert!(
        during > 100,
        "the relays kept serving with every selector down ({during} requests in 6 s)"
    );

    // One selector back: the streams reopen, and the usage kept through the outage lands.
    cluster.start_selector(0);
    for (_, metrics) in &relays {
        eventually(Duration::from_secs(20), || async {
            (cluster
                .metric(*metrics, "relay_view_streams_total{event=\"opened\"}")
                .await
                >= 2.0)
                .then_some(())
        })
        .await
        .expect("the relay's view stream reopens");
    }
    let total = served.load(Ordering::SeqCst);
    let recorded = eventually(Duration::from_secs(30), || async {
        let usage = store
            .read_usage(key_id, 0, poolgate_core::now_ms() + 3_600_000)
            .await
            .ok()?;
        (usage.requests as u64 >= total).then_some(usage.requests)
    })
    .await
    .unwrap_or_else(|_| panic!("the usage of all {total} requests served reaches Postgres"));
    assert_eq!(recorded as u64, total, "every served request's usage, once");
    for (_, metrics) in &relays {
        assert_eq!(
            cluster
                .metric(*metrics, "relay_usage_records_lost_total")
                .await,
            0.0
        );
    }
}
