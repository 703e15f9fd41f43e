//! Chaos under load, every service a separate process: 3 relays, 2 admission replicas and
//! 2 selectors over one Redis and one Postgres; 20 accounts with concurrency limits of 1 to 3;
//! 100 clients (half of them streaming) spread over the relays. The fake upstream counts the
//! concurrent requests per credential. Faults come one at a time, each in its own phase:
//!
//! 1. none (the baseline);
//! 2. `kill -9` of a relay: its leases are reaped within the orphan grace, the other relays'
//!    requests are untouched;
//! 3. `kill -9` of an admission replica: relays resume their leases on the other one; what is not
//!    resumed is reaped within the lease TTL;
//! 4. clients aborting mid-stream (and while waiting): every slot is free well before the orphan
//!    grace;
//! 5. Redis stopped for 10 s and restarted (policy `open`): requests keep succeeding, both
//!    replicas report `admission_degraded 1`, the upstream sees at most 2 × limit (one limit per
//!    replica, by design), and after the restart the limits hold globally again;
//! 6. a burst of 429 and 529 on every account: afterwards every account is active, none is
//!    hard-blocked or breaker-open, and every one of them serves again.
//!
//! After every phase and a quiet period no account holds a lease, and every request got a
//! response or a clean error in the client's format: nothing hangs, nothing is lost. Timings are
//! only checked in quiet phases. The bench mode runs the same with more clients:
//! `POOLGATE_CHAOS_CLIENTS=500 cargo nextest run -p relay-svc --test chaos --release`.
//! Every service's log is kept (`POOLGATE_TEST_LOGS=<dir>`, else a directory of the test's own
//! under the temporary directory); a relay that never serves fails with their tails.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common;

use common::processes::{Env, Process, log_tail};
use poolgate_runtime::redis_keys::AccountKeys;
use poolgate_select::crypto::Keyring;
use poolgate_testkit::fake_upstream::{FakeUpstream, Scripted};
use poolgate_testkit::{PostgresServer, RedisServer, eventually, free_port};
use serde_json::{Value, json};

const ACCOUNTS: usize = 20;
const RELAYS: usize = 3;
const ADMISSIONS: usize = 2;
const SELECTORS: usize = 2;
const LEASE_TTL: Duration = Duration::from_secs(10);
const ORPHAN_GRACE: Duration = Duration::from_secs(5);
/// Slack on top of a deadline for a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(2);
/// How long after the clients stopped every lease must be gone (nothing is running then).
const QUIET: Duration = Duration::from_secs(3);
/// A request that takes longer than this has hung.
const HANG: Duration = Duration::from_secs(45);

/// More clients than the CI suite's 100 (the bench mode): the pool is overloaded, so a request
/// may wait out the relay's 20 s and get a clean 503; such answers are counted, not failures.
fn overloaded() -> bool {
    clients() > 100
}

fn clients() -> usize {
    std::env::var("POOLGATE_CHAOS_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(100)
}

struct Account {
    id: i64,
    credential: String,
    limit: u32,
}

struct Cluster {
    env: Env,
    redis: RedisServer,
    _postgres: PostgresServer,
    upstream: FakeUpstream,
    accounts: Vec<Account>,
    key: String,
    http: reqwest::Client,
    _selectors: Vec<Process>,
    admissions: Vec<Option<Process>>,
    admission_ports: Vec<(u16, u16)>,
    relays: Vec<Option<Process>>,
    relay_ports: Vec<u16>,
    relay_metrics_ports: Vec<u16>,
    selector_urls: String,
    admission_urls: String,
}

impl Cluster {
    async fn start() -> Cluster {
        let (postgres, redis) = tokio::join!(PostgresServer::start(), RedisServer::start());
        let (postgres, redis) = (postgres.expect("postgres"), redis.expect("redis"));
        let upstream = FakeUpstream::start().await.expect("upstream");
        upstream.set_delay(Duration::from_millis(40));
        upstream.set_chunk_delay(Duration::from_millis(10));
        let keys = format!("k1:{}", Keyring::generate_key());
        let keyring = Keyring::parse(&keys, None).expect("keyring");
        let store =
            selector_svc::store::PostgresSource::connect(&postgres.url(), Arc::new(keyring))
                .await
                .expect("connect");
        store.migrate().await.expect("migrate");
        let mut accounts = Vec::new();
        for n in 0..ACCOUNTS {
            let limit = 1 + (n % 3) as u32;
            let name = format!("chaos-{n:02}");
            let input = common::account(&name, &upstream.base_url, limit as i32, 0);
            let id = store.upsert_account(&input).await.expect("account");
            accounts.push(Account {
                id,
                credential: format!("cred-{name}"),
                limit,
            });
        }
        let (_, key) = store
            .create_api_key("chaos", "chaos", "default", 0)
            .await
            .expect("api key");
        let selector_ports: Vec<u16> = (0..SELECTORS).map(|_| free_port().expect("port")).collect();
        let admission_ports: Vec<(u16, u16)> = (0..ADMISSIONS)
            .map(|_| (free_port().expect("port"), free_port().expect("port")))
            .collect();
        let relay_ports: Vec<u16> = (0..RELAYS).map(|_| free_port().expect("port")).collect();
        let relay_metrics_ports: Vec<u16> =
            (0..RELAYS).map(|_| free_port().expect("port")).collect();
        let urls = |ports: Vec<u16>| {
            ports
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let env = Env {
            vars: vec![
                ("POOLGATE_DATABASE_URL".into(), postgres.url()),
                ("POOLGATE_REDIS_URL".into(), redis.url()),
                ("POOLGATE_CREDENTIAL_KEYS".into(), keys),
                ("SELECTOR_ADMIN_TOKEN".into(), "admin-token".into()),
                (
                    "SELECTOR_ENDPOINT".into(),
                    format!("http://127.0.0.1:{}", selector_ports[0]),
                ),
            ],
        };
        let selectors = selector_ports
            .iter()
            .enumerate()
            .map(|(n, port)| {
                env.spawn(
                    "selector-svc",
                    &format!("selector-{n}"),
                    &[
                        "--listen",
                        &format!("127.0.0.1:{port}"),
                        "--metrics-listen",
                        &format!("127.0.0.1:{}", free_port().expect("port")),
                    ],
                )
            })
            .collect();
        let mut cluster = Cluster {
            env,
            redis,
            _postgres: postgres,
            upstream,
            accounts,
            key: key.expose().to_owned(),
            http: {
                let _ = rustls::crypto::ring::default_provider().install_default();
                reqwest::Client::builder()
                    .pool_max_idle_per_host(1024)
                    .build()
                    .expect("http client")
            },
            _selectors: selectors,
            admissions: (0..ADMISSIONS).map(|_| None).collect(),
            admission_urls: urls(admission_ports.iter().map(|(p, _)| *p).collect()),
            admission_ports,
            relays: (0..RELAYS).map(|_| None).collect(),
            relay_ports,
            relay_metrics_ports,
            selector_urls: urls(selector_ports),
        };
        for n in 0..ADMISSIONS {
            cluster.start_admission(n);
        }
        for n in 0..RELAYS {
            cluster.start_relay(n, true).await;
        }
        cluster
    }

    fn start_admission(&mut self, n: usize) {
        let (port, metrics) = self.admission_ports[n];
        self.admissions[n] = Some(self.env.spawn(
            "admission-svc",
            &format!("admission-{n}"),
            &[
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--metrics-listen",
                &format!("127.0.0.1:{metrics}"),
                "--lease-ttl-ms",
                &LEASE_TTL.as_millis().to_string(),
                "--orphan-grace-ms",
                &ORPHAN_GRACE.as_millis().to_string(),
                "--failure-policy",
                "open",
                "--redis-timeout-ms",
                "300",
                "--registry-interval-ms",
                "300",
                "--max-waiting",
                "1000",
            ],
        ));
    }

    /// Starts relay `n` and waits until a request goes through it. On the cluster's first start
    /// (`may_move`) a relay that exits at once (its port taken by another process between
    /// `free_port` and its bind) is started again on other ports, as the harness's own servers
    /// are; a restarted relay keeps its ports, since the load's clients use them.
    async fn start_relay(&mut self, n: usize, may_move: bool) {
        for _ in 0..3 {
            self.spawn_relay(n);
            let base = self.relay_base(n);
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut last = None;
            let exited = loop {
                let exited = self.relays[n]
                    .as_mut()
                    .and_then(|process| process.0.try_wait().ok().flatten());
                if let Some(status) = exited {
                    break Some(status);
                }
                // Bounded, so a port another process holds (and never answers on) does not keep
                // this loop from seeing the relay exit.
                let answer = tokio::time::timeout(
                    Duration::from_secs(5),
                    request(&self.http, &base, &self.key, false, "warm-up".into()),
                )
                .await;
                match answer {
                    Ok(Answer::Ok) => return,
                    Ok(answer) => last = Some(format!("{answer:?}")),
                    Err(_) => last = Some("no answer within 5 s".to_owned()),
                }
                if Instant::now() >= deadline {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let logs: Vec<String> = [
                format!("relay-{n}"),
                "selector-0".into(),
                "admission-0".into(),
            ]
            .iter()
            .map(|label| log_tail(label, 30))
            .collect();
            match exited {
                Some(status) if may_move => {
                    eprintln!(
                        "relay {n} exited at start ({status}); starting it on other ports\n{}",
                        logs.join("\n")
                    );
                    self.relay_ports[n] = free_port().expect("port");
                    self.relay_metrics_ports[n] = free_port().expect("port");
                }
                _ => panic!(
                    "relay {n} does not serve within 30 s (exited: {exited:?}); its last answer: {last:?}\n{}",
                    logs.join("\n")
                ),
            }
        }
        panic!("relay {n} exited at start three times");
    }

    fn spawn_relay(&mut self, n: usize) {
        let port = self.relay_ports[n];
        let metrics_port = self.relay_metrics_ports[n];
        self.relays[n] = Some(self.env.spawn(
            "relay-svc",
            &format!("relay-{n}"),
            &[
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--metrics-listen",
                &format!("127.0.0.1:{metrics_port}"),
                "--selector-url",
                &self.selector_urls,
                "--admission-url",
                &self.admission_urls,
                "--max-wait-ms",
                "20000",
                "--shutdown-grace-ms",
                "1000",
            ],
        ));
    }

    fn relay_base(&self, n: usize) -> String {
        format!("http://127.0.0.1:{}", self.relay_ports[n])
    }

    /// Live leases per account (score = expiry on the Redis clock).
    async fn live_leases(&self) -> Result<Vec<(i64, u32)>, String> {
        let mut conn = self.redis.client().await?;
        let now_ms = redis_now_ms(&mut conn).await?;
        let mut held = Vec::new();
        for account in &self.accounts {
            let count: u32 = redis::cmd("ZCOUNT")
                .arg(AccountKeys::new(account.id).leases)
                .arg(now_ms)
                .arg("+inf")
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            if count > 0 {
                held.push((account.id, count));
            }
        }
        Ok(held)
    }

    /// The live leases (account key, lease id) right now.
    async fn live_lease_ids(&self) -> Result<Vec<(String, String)>, String> {
        let mut conn = self.redis.client().await?;
        let now_ms = redis_now_ms(&mut conn).await?;
        let mut live = Vec::new();
        for account in &self.accounts {
            let key = AccountKeys::new(account.id).leases;
            let members: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                .arg(&key)
                .arg(now_ms)
                .arg("+inf")
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            live.extend(members.into_iter().map(|m| (key.clone(), m)));
        }
        Ok(live)
    }

    /// Waits until none of `leases` is live any more (released, reaped or expired), while the
    /// load goes on; panics after `deadline` (counted from `since`).
    async fn expect_gone(
        &self,
        leases: &[(String, String)],
        since: Instant,
        deadline: Duration,
        what: &str,
    ) -> Duration {
        let still_live = || async {
            let mut conn = self.redis.client().await.ok()?;
            let now_ms = redis_now_ms(&mut conn).await.ok()?;
            let mut live = Vec::new();
            for (key, lease) in leases {
                let score: Option<f64> = redis::cmd("ZSCORE")
                    .arg(key)
                    .arg(lease)
                    .query_async(&mut conn)
                    .await
                    .ok()?;
                if score.is_some_and(|expiry| expiry >= now_ms as f64) {
                    live.push(lease.clone());
                }
            }
            Some(live)
        };
        let left = deadline.saturating_sub(since.elapsed());
        let result = eventually(left, || async {
            still_live().await.filter(|live| live.is_empty())
        })
        .await;
        if result.is_err() {
            panic!(
                "{what}: of the {} leases live at the fault, {:?} still live {:?} after it (deadline {deadline:?})",
                leases.len(),
                still_live().await,
                since.elapsed()
            );
        }
        since.elapsed()
    }

    /// Waits until no account holds a lease; panics after `deadline` (counted from `since`).
    async fn expect_no_leases(&self, since: Instant, deadline: Duration, what: &str) -> Duration {
        let left = deadline.saturating_sub(since.elapsed());
        let result = eventually(left, || async {
            self.live_leases().await.ok().filter(|held| held.is_empty())
        })
        .await;
        if result.is_err() {
            panic!(
                "{what}: leases still held {:?} after {:?} (deadline {deadline:?}): {:?}",
                since.elapsed(),
                deadline,
                self.live_leases().await
            );
        }
        since.elapsed()
    }

    /// Accounts whose upstream peak exceeded `factor` × limit since the last reset.
    fn over_limit(&self, factor: u32) -> Vec<String> {
        self.accounts
            .iter()
            .filter_map(|a| {
                let peak = self.upstream.stats(&a.credential).peak;
                (peak > factor * a.limit)
                    .then(|| format!("{}: peak {peak} > {} × {}", a.credential, factor, a.limit))
            })
            .collect()
    }

    async fn scrape(&self, port: u16, metric: &str) -> Option<f64> {
        let text = self
            .http
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .filter(|line| line.starts_with(metric) && !line.starts_with('#'))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .reduce(|a, b| a + b)
    }

    async fn degraded(&self, n: usize) -> Option<f64> {
        self.scrape(self.admission_ports[n].1, "admission_degraded")
            .await
    }

    async fn relay_counter(&self, n: usize, metric: &str) -> f64 {
        self.scrape(self.relay_metrics_ports[n], metric)
            .await
            .unwrap_or(0.0)
    }

    /// A counter summed over every relay.
    async fn relays_counter(&self, metric: &str) -> f64 {
        let mut sum = 0.0;
        for n in 0..RELAYS {
            sum += self.relay_counter(n, metric).await;
        }
        sum
    }
}

async fn redis_now_ms(conn: &mut redis::aio::MultiplexedConnection) -> Result<u64, String> {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(seconds * 1000 + micros / 1000)
}

#[derive(Debug)]
enum Answer {
    Ok,
    /// An error in the client's format (HTTP status, or 200 with a stream `error` event), and
    /// its body.
    Clean(u16, String),
    /// The connection failed or was cut (expected only from a killed relay).
    Transport(String),
    /// An answer that is neither a response nor a clean error.
    Unclean(u16, String),
    Hung,
}

async fn request(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    stream: bool,
    content: String,
) -> Answer {
    let body = json!({"model": "claude-x", "max_tokens": 16, "stream": stream, "messages": [{"role": "user", "content": content}]});
    let call = async {
        let response = match http
            .post(format!("{base}/v1/messages"))
            .header("x-api-key", key)
            .json(&body)
            .send()
            .await
        {
            Ok(response) => response,
            Err(error) => return Answer::Transport(error.to_string()),
        };
        let status = response.status().as_u16();
        let text = match response.text().await {
            Ok(text) => text,
            Err(error) => return Answer::Transport(error.to_string()),
        };
        if status == 200 {
            let complete = if stream {
                if text.contains("event: error") {
                    return Answer::Clean(200, text);
                }
                text.contains("event: message_stop")
            } else {
                serde_json::from_str::<Value>(&text)
                    .is_ok_and(|v| v["type"] == "message" && v["content"].is_array())
            };
            return if complete {
                Answer::Ok
            } else {
                Answer::Unclean(status, text)
            };
        }
        let error: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if error["type"] == "error" && error["error"]["type"].is_string() {
            Answer::Clean(status, text)
        } else {
            Answer::Unclean(status, text)
        }
    };
    tokio::time::timeout(HANG, call)
        .await
        .unwrap_or(Answer::Hung)
}

/// What the clients of one relay got.
#[derive(Debug, Default)]
struct Tally {
    ok: u64,
    clean: BTreeMap<u16, u64>,
    /// One body per status, for the report.
    clean_samples: BTreeMap<u16, String>,
    transport: u64,
    /// The first connection failure, for the report.
    transport_sample: Option<String>,
    unclean: Vec<String>,
    hung: u64,
}

impl Tally {
    fn total(&self) -> u64 {
        self.ok
            + self.clean.values().sum::<u64>()
            + self.transport
            + self.hung
            + self.unclean.len() as u64
    }

    fn add(&mut self, answer: Answer) {
        match answer {
            Answer::Ok => self.ok += 1,
            Answer::Clean(status, body) => {
                *self.clean.entry(status).or_default() += 1;
                self.clean_samples
                    .entry(status)
                    .or_insert_with(|| body.chars().take(300).collect());
            }
            Answer::Transport(error) => {
                self.transport += 1;
                self.transport_sample.get_or_insert(error);
            }
            Answer::Unclean(status, body) => {
                if self.unclean.len() < 5 {
                    self.unclean.push(format!(
                        "{status}: {}",
                        body.chars().take(300).collect::<String>()
                    ));
                } else {
                    self.unclean.push(String::new());
                }
            }
            Answer::Hung => self.hung += 1,
        }
    }
}

/// Clients looping over the relays until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<(usize, tokio::task::JoinHandle<Tally>)>,
}

fn start_load(cluster: &Cluster, phase: &str) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = (0..clients())
        .map(|c| {
            let relay = c % RELAYS;
            let (http, base, key, stop) = (
                cluster.http.clone(),
                cluster.relay_base(relay),
                cluster.key.clone(),
                stop.clone(),
            );
            let phase = phase.to_owned();
            let task = tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Distinct conversations, so sessions spread over the accounts.
                    let content = format!("{phase} client {c} request {n}");
                    let answer = request(&http, &base, &key, c % 2 == 1, content).await;
                    if matches!(answer, Answer::Transport(_)) {
                        // A dead relay refuses at once: do not spin.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    tally.add(answer);
                    n += 1;
                }
                tally
            });
            (relay, task)
        })
        .collect();
    Load { stop, tasks }
}

impl Load {
    /// Stops the clients and collects their tallies per relay; every client must come back.
    async fn finish(self) -> Vec<Tally> {
        self.stop.store(true, Ordering::Relaxed);
        let mut per_relay: Vec<Tally> = (0..RELAYS).map(|_| Tally::default()).collect();
        for (relay, task) in self.tasks {
            let tally = tokio::time::timeout(HANG + Duration::from_secs(5), task)
                .await
                .expect("a client hung")
                .expect("client task");
            let into = &mut per_relay[relay];
            into.ok += tally.ok;
            for (status, count) in tally.clean {
                *into.clean.entry(status).or_default() += count;
            }
            for (status, body) in tally.clean_samples {
                into.clean_samples.entry(status).or_insert(body);
            }
            into.transport += tally.transport;
            if into.transport_sample.is_none() {
                into.transport_sample = tally.transport_sample;
            }
            into.hung += tally.hung;
            into.unclean.extend(tally.unclean);
        }
        per_relay
    }
}

fn assert_answered(phase: &str, tallies: &[Tally], allow_transport: &[usize], allow_clean: bool) {
    for (relay, tally) in tallies.iter().enumerate() {
        eprintln!("{phase}: relay {relay}: {tally:?}");
        assert!(tally.total() > 0, "{phase}: relay {relay} served nothing");
        assert_eq!(tally.hung, 0, "{phase}: relay {relay}: requests hung");
        assert!(
            tally.unclean.is_empty(),
            "{phase}: relay {relay}: answers neither a response nor a clean error: {:?}",
            tally.unclean
        );
        if !allow_transport.contains(&relay) {
            assert_eq!(
                tally.transport, 0,
                "{phase}: relay {relay}: connections failed"
            );
        }
        if !allow_clean {
            assert!(
                tally.clean.is_empty(),
                "{phase}: relay {relay}: errors where every request should succeed: {:?}",
                tally.clean
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_one_fault_at_a_time_under_load_never_over_admits_and_loses_nothing() {
    let mut cluster = Cluster::start().await;
    let phase_length = Duration::from_secs(4);

    // 1. Baseline.
    cluster.upstream.reset_stats();
    let load = start_load(&cluster, "baseline");
    tokio::time::sleep(phase_length).await;
    let tallies = load.finish().await;
    assert_answered("baseline", &tallies, &[], overloaded());
    assert_eq!(cluster.over_limit(1), Vec::<String>::new(), "baseline");
    cluster
        .expect_no_leases(Instant::now(), QUIET, "baseline")
        .await;

    // 2. kill -9 of a relay mid-load.
    cluster.upstream.reset_stats();
    let lost_before = [
        cluster.relay_counter(0, "relay_lease_lost_total").await,
        cluster.relay_counter(1, "relay_lease_lost_total").await,
    ];
    let load = start_load(&cluster, "kill-relay");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let killed = Instant::now();
    if let Some(relay) = cluster.relays[2].take() {
        relay.kill9();
    }
    // Every lease live at the kill is gone within the orphan grace: the dead relay's are reaped,
    // the others' are released as their requests end; meanwhile the load goes on.
    let at_kill = cluster.live_lease_ids().await.expect("redis");
    let reaped = cluster
        .expect_gone(&at_kill, killed, ORPHAN_GRACE + SLACK, "kill-relay")
        .await;
    tokio::time::sleep(phase_length.saturating_sub(killed.elapsed())).await;
    let tallies = load.finish().await;
    assert_answered("kill-relay", &tallies, &[2], overloaded());
    assert_eq!(cluster.over_limit(1), Vec::<String>::new(), "kill-relay");
    cluster
        .expect_no_leases(Instant::now(), QUIET, "after kill-relay")
        .await;
    for (relay, before) in lost_before.iter().enumerate() {
        assert_eq!(
            cluster.relay_counter(relay, "relay_lease_lost_total").await,
            *before,
            "relay {relay} lost no lease: the dead relay's cleanup touched nothing else"
        );
    }
    eprintln!(
        "kill-relay: the {} leases live at the kill were gone {reaped:?} after it",
        at_kill.len()
    );
    cluster.start_relay(2, false).await;

    // 3. kill -9 of an admission replica mid-load.
    cluster.upstream.reset_stats();
    let lost_before = cluster.relays_counter("relay_lease_lost_total").await;
    let resumed_before = cluster.relays_counter("relay_lease_resumed_total").await;
    let load = start_load(&cluster, "kill-admission");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let killed = Instant::now();
    if let Some(admission) = cluster.admissions[1].take() {
        admission.kill9();
    }
    // Every lease live at the kill is gone within the TTL: resumed ones are released as their
    // requests end, what was not resumed (a grant that never reached its relay) expires.
    let at_kill = cluster.live_lease_ids().await.expect("redis");
    let reaped = cluster
        .expect_gone(&at_kill, killed, LEASE_TTL + SLACK, "kill-admission")
        .await;
    tokio::time::sleep(phase_length.saturating_sub(killed.elapsed())).await;
    let tallies = load.finish().await;
    // Requests waiting on the killed replica get a clean 503; none hangs or over-admits.
    assert_answered("kill-admission", &tallies, &[], true);
    let served: u64 = tallies.iter().map(|t| t.ok).sum();
    let total: u64 = tallies.iter().map(Tally::total).sum();
    assert!(
        served * 10 >= total * 9,
        "kill-admission: most requests are served by the surviving replica ({served} of {total})"
    );
    let over = cluster.over_limit(1);
    let resumed = cluster.relays_counter("relay_lease_resumed_total").await - resumed_before;
    let lost = cluster.relays_counter("relay_lease_lost_total").await - lost_before;
    eprintln!(
        "kill-admission: {resumed} leases resumed on the other replica, {lost} lost; the {} leases live at the kill were gone {reaped:?} after it",
        at_kill.len()
    );
    assert_eq!(over, Vec::<String>::new(), "kill-admission");
    cluster
        .expect_no_leases(Instant::now(), QUIET, "after kill-admission")
        .await;
    assert!(resumed > 0.0, "the dead replica's leases were resumed");
    assert_eq!(lost, 0.0, "every broken lease stream was resumed");
    cluster.start_admission(1);
    eventually(Duration::from_secs(20), || async {
        cluster.degraded(1).await.map(|_| ())
    })
    .await
    .expect("admission 1 is back");

    // 4. Clients abort mid-stream and while waiting; the orphan grace is long by comparison.
    cluster.upstream.reset_stats();
    cluster.upstream.set_chunk_delay(Duration::from_millis(400));
    let aborting: Vec<_> = (0..clients())
        .map(|c| {
            let (http, base, key) = (
                cluster.http.clone(),
                cluster.relay_base(c % RELAYS),
                cluster.key.clone(),
            );
            tokio::spawn(async move {
                request(&http, &base, &key, true, format!("abort client {c}")).await
            })
        })
        .collect();
    let all_slots: u32 = cluster.accounts.iter().map(|a| a.limit).sum();
    eventually(Duration::from_secs(15), || async {
        let streaming: u32 = cluster
            .accounts
            .iter()
            .map(|a| cluster.upstream.stats(&a.credential).current)
            .sum();
        (streaming * 4 >= all_slots * 3).then_some(())
    })
    .await
    .expect("most slots are streaming");
    let aborted = Instant::now();
    for task in &aborting {
        task.abort();
    }
    let freed = cluster
        .expect_no_leases(aborted, ORPHAN_GRACE / 2, "client aborts")
        .await;
    eprintln!("aborts: every slot free {freed:?} after the clients left");
    assert_eq!(cluster.over_limit(1), Vec::<String>::new(), "aborts");
    cluster.upstream.set_chunk_delay(Duration::from_millis(10));
    // The upstream calls are cancelled with the clients.
    eventually(Duration::from_secs(5), || async {
        cluster
            .accounts
            .iter()
            .all(|a| cluster.upstream.stats(&a.credential).current == 0)
            .then_some(())
    })
    .await
    .expect("the upstream calls of the aborted clients ended");

    // 5. Redis stopped for 10 s, then restarted empty.
    cluster.upstream.reset_stats();
    let load = start_load(&cluster, "redis-outage");
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.redis.kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for n in 0..ADMISSIONS {
        assert_eq!(
            cluster.degraded(n).await,
            Some(1.0),
            "admission {n} reports the outage"
        );
    }
    tokio::time::sleep(Duration::from_secs(7)).await;
    cluster.redis.restart().await.expect("redis restarts");
    for n in 0..ADMISSIONS {
        eventually(Duration::from_secs(10), || async {
            (cluster.degraded(n).await == Some(0.0)).then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("admission {n} recovers"));
    }
    let tallies = load.finish().await;
    assert_answered("redis-outage", &tallies, &[], overloaded());
    // In the outage each replica enforces the limits on its own: at most 2 × limit.
    assert_eq!(
        cluster.over_limit(ADMISSIONS as u32),
        Vec::<String>::new(),
        "redis-outage"
    );
    cluster
        .expect_no_leases(Instant::now(), QUIET, "after the outage")
        .await;
    // Global enforcement again.
    cluster.upstream.reset_stats();
    let load = start_load(&cluster, "after-outage");
    tokio::time::sleep(phase_length).await;
    let tallies = load.finish().await;
    assert_answered("after-outage", &tallies, &[], overloaded());
    assert_eq!(cluster.over_limit(1), Vec::<String>::new(), "after-outage");
    cluster
        .expect_no_leases(Instant::now(), QUIET, "after-outage")
        .await;

    // 6. A burst of 429 and 529 on every account.
    for account in &cluster.accounts {
        let burst = (0..4).map(|n| Scripted::Fail {
            status: if n % 2 == 0 { 429 } else { 529 },
            headers: vec![("retry-after".into(), "1".into())],
            body: r#"{"type":"error","error":{"type":"rate_limit_error","message":"busy"}}"#.into(),
        });
        cluster.upstream.script(&account.credential, burst);
    }
    cluster.upstream.reset_stats();
    let load = start_load(&cluster, "burst");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tallies = load.finish().await;
    // Busy answers may reach a client once every account is busy, in the client's format.
    assert_answered("burst", &tallies, &[], true);
    assert_eq!(cluster.over_limit(1), Vec::<String>::new(), "burst");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let listing = cluster.env.run("selector-svc", &["admin", "accounts"], &[]);
    assert_eq!(
        listing
            .lines()
            .filter(|l| l.contains("status=active"))
            .count(),
        ACCOUNTS,
        "every account is still active: {listing}"
    );
    let blocks = cluster.env.run("selector-svc", &["admin", "blocks"], &[]);
    assert!(
        !blocks.contains("\thard\t") && !blocks.contains("\tbreaker\t"),
        "busy is not broken: no hard block, no breaker: {blocks}"
    );
    cluster.upstream.reset_stats();
    let load = start_load(&cluster, "after-burst");
    tokio::time::sleep(phase_length).await;
    let tallies = load.finish().await;
    assert_answered("after-burst", &tallies, &[], overloaded());
    let idle: Vec<&str> = cluster
        .accounts
        .iter()
        .filter(|a| cluster.upstream.stats(&a.credential).total == 0)
        .map(|a| a.credential.as_str())
        .collect();
    assert!(
        idle.is_empty(),
        "every account serves again; idle: {idle:?}"
    );
    assert_eq!(cluster.over_limit(1), Vec::<String>::new(), "after-burst");
    cluster
        .expect_no_leases(Instant::now(), QUIET, "the end")
        .await;
}
