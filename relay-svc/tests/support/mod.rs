//! The harness shared by the health-evidence and refresh-race tests: one pool of accounts on the
//! fake upstream, served by a standalone relay (the selector and admission engines in process)
//! or by the distributed stack (Postgres, Redis, selectors, admission, relays — one relay per
//! selector), with the probe settings a test chooses, and a reading of every account's health
//! (status, blocks, breaker, unauthorized count) and of the selector's counters in either mode.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use poolgate_core::account::{CredentialKind, OAuthState, Platform, Secret};
use poolgate_core::health::Breaker;
use poolgate_core::outcome::RuntimeBlockSettings;
use poolgate_operator::AdminEndpoint;
use poolgate_select::engine::{SelectorSettings, UsageReadSettings};
use poolgate_select::probe::ProbeSettings;
use poolgate_stack::{self as stack, Backends};
use poolgate_testkit::fake_upstream::FakeUpstream;
use relay_svc::metrics::Metrics;
use relay_svc::proxy::{Relay, RelaySettings};
use relay_svc::standalone::{Standalone, StandaloneFile};
use serde_json::Value;

/// The client key of the standalone pool (the distributed one creates its own).
pub const STANDALONE_KEY: &str = "pgk-evidence-key-0001";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Standalone,
    Distributed,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Standalone => "standalone",
            Mode::Distributed => "distributed",
        })
    }
}

/// One account of the pool.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: &'static str,
    pub platform: Platform,
    /// The API key, or (with `refresh_token`) the OAuth access token.
    pub credential: String,
    /// A Claude subscription (OAuth) account refreshing at the fake's `/oauth/token`.
    pub refresh_token: Option<String>,
    pub priority: i32,
    pub concurrency: i32,
    /// `None`: the fake upstream.
    pub base_url: Option<String>,
    /// What the account serves (`chat`, `embeddings`, `rerank`); empty: all its platform can.
    pub serves: &'static [&'static str],
}

impl Spec {
    pub fn api_key(name: &'static str, platform: Platform, priority: i32) -> Self {
        Spec {
            name,
            platform,
            credential: format!("cred-{name}"),
            refresh_token: None,
            priority,
            concurrency: 8,
            base_url: None,
            serves: &[],
        }
    }

    pub fn oauth(name: &'static str, access: &str, refresh: &str, priority: i32) -> Self {
        Spec {
            name,
            platform: Platform::Anthropic,
            credential: access.to_owned(),
            refresh_token: Some(refresh.to_owned()),
            priority,
            concurrency: 8,
            base_url: None,
            serves: &[],
        }
    }
}

/// How the pool's relays and selectors run.
#[derive(Debug, Clone)]
pub struct Options {
    pub relay: RelaySettings,
    pub probe: ProbeSettings,
    pub blocks: RuntimeBlockSettings,
    /// Distributed: this many selectors, each with a relay of its own (standalone: one relay).
    pub relays: usize,
    /// How often the OAuth accounts' usage endpoints are read (and at start).
    pub usage_reads: UsageReadSettings,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            relay: RelaySettings {
                max_wait: Duration::from_secs(10),
                conflict_delay: Duration::from_millis(20),
                ..RelaySettings::default()
            },
            probe: ProbeSettings::default(),
            blocks: RuntimeBlockSettings::default(),
            relays: 1,
            usage_reads: UsageReadSettings::default(),
        }
    }
}

/// One block as operators see it (the same fields in both modes).
#[derive(Debug, Clone)]
pub struct Block {
    pub kind: String,
    pub class: String,
    pub status: u16,
    pub reason: String,
    pub remaining_ms: u64,
}

/// One account's health.
#[derive(Debug, Clone)]
pub struct Health {
    pub id: i64,
    pub name: String,
    pub status: String,
    pub reason: String,
    pub blocks: Vec<Block>,
    /// Distributed only (standalone keeps it inside the engine): the breaker and its count.
    pub breaker: Option<Breaker>,
    pub failures: Option<u32>,
    /// Distributed only: unauthorized outcomes counted toward `error`.
    pub unauthorized: Option<u64>,
}

impl Health {
    pub fn hard_block(&self) -> Option<&Block> {
        self.blocks.iter().find(|b| b.kind == "hard")
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (#{}): {}", self.name, self.id, self.status)?;
        if !self.reason.is_empty() {
            write!(f, " ({})", self.reason)?;
        }
        for b in &self.blocks {
            write!(
                f,
                "; {} block {}|{}|{} {} ms left",
                b.kind, b.class, b.status, b.reason, b.remaining_ms
            )?;
        }
        if let Some(breaker) = &self.breaker {
            write!(f, "; breaker {breaker:?}")?;
        }
        if let Some(failures) = self.failures {
            write!(f, "; failures {failures}")?;
        }
        if let Some(count) = self.unauthorized {
            write!(f, "; unauthorized count {count}")?;
        }
        Ok(())
    }
}

enum Engines {
    Standalone {
        operator: Arc<dyn AdminEndpoint>,
        _engines: Standalone,
    },
    Distributed {
        backends: Backends,
        selectors: Vec<selector_svc::server::Built>,
        _admission: Arc<poolgate_lease::LeaseEngine>,
    },
}

/// A running pool.
pub struct Pool {
    pub mode: Mode,
    pub upstream: FakeUpstream,
    /// The relays' client URLs.
    pub bases: Vec<String>,
    pub key: String,
    pub http: reqwest::Client,
    /// Account names and ids, in the order given.
    pub accounts: Vec<(String, i64)>,
    pub options: Options,
    relays: Vec<Arc<Relay>>,
    engines: Engines,
}

fn yaml_account(spec: &Spec, base: &str) -> String {
    let platform = spec.platform.as_str();
    let credential = match &spec.refresh_token {
        Some(refresh) => format!(
            "oauth: {{access_token: \"{}\", refresh_token: \"{refresh}\", expires_at: 4102444800000, token_url: \"{}/oauth/token\"}}",
            spec.credential,
            spec.base_url.as_deref().unwrap_or(base)
        ),
        None => format!("credential: \"{}\"", spec.credential),
    };
    format!(
        "  - {{name: {}, platform: {platform}, base_url: \"{}\", {credential}, priority: {}, concurrency: {}, serves: [{}]}}\n",
        spec.name,
        spec.base_url.as_deref().unwrap_or(base),
        spec.priority,
        spec.concurrency,
        spec.serves.join(", ")
    )
}

async fn listen() -> Result<(tokio::net::TcpListener, SocketAddr), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind: {e}"))?;
    let address = listener.local_addr().map_err(|e| format!("address: {e}"))?;
    Ok((listener, address))
}

fn selector_settings(options: &Options) -> SelectorSettings {
    SelectorSettings {
        blocks: options.blocks.clone(),
        probe: options.probe.clone(),
        usage_reads: options.usage_reads.clone(),
        ..SelectorSettings::default()
    }
}

/// A selector over `backends` with these settings, served on a free port.
async fn selector(
    backends: &Backends,
    options: &Options,
) -> Result<(selector_svc::server::Built, SocketAddr), String> {
    stack::selector_with(backends, selector_settings(options)).await
}

impl Pool {
    /// Starts the fake upstream and the pool over `specs` in `mode`.
    pub async fn start(mode: Mode, specs: &[Spec], options: Options) -> Pool {
        let upstream = FakeUpstream::start().await.expect("fake upstream starts");
        let pool = match mode {
            Mode::Standalone => Self::standalone(upstream, specs, options).await,
            Mode::Distributed => Self::distributed(upstream, specs, options).await,
        };
        pool.expect("the pool starts")
    }

    async fn standalone(
        upstream: FakeUpstream,
        specs: &[Spec],
        options: Options,
    ) -> Result<Pool, String> {
        let mut yaml = format!(
            "api_keys:\n  - {{key: {STANDALONE_KEY}, user: alice, group: default}}\naccounts:\n"
        );
        for spec in specs {
            yaml.push_str(&yaml_account(spec, &upstream.base_url));
        }
        let file = StandaloneFile::parse(&yaml)?;
        let metrics = Metrics::new();
        let engines = relay_svc::standalone::build(
            &file,
            None,
            selector_settings(&options),
            poolgate_core::lease::Settings::default(),
            &metrics,
        )?;
        let relay = Arc::new(
            Relay::new(
                engines.selection.clone(),
                engines.leases.clone(),
                options.relay.clone(),
                metrics,
            )
            .map_err(|e| e.to_string())?,
        );
        let (listener, address) = listen().await?;
        tokio::spawn(relay_svc::server::serve(
            relay.clone(),
            listener,
            None,
            std::future::pending(),
            Duration::from_secs(1),
        ));
        // Standalone ids are the accounts' positions in the file, from 1.
        let accounts = specs
            .iter()
            .enumerate()
            .map(|(n, s)| (s.name.to_owned(), n as i64 + 1))
            .collect();
        Ok(Pool {
            mode: Mode::Standalone,
            upstream,
            bases: vec![format!("http://{address}")],
            key: STANDALONE_KEY.into(),
            http: reqwest::Client::new(),
            accounts,
            options,
            relays: vec![relay],
            engines: Engines::Standalone {
                operator: engines.operator.clone(),
                _engines: engines,
            },
        })
    }

    async fn distributed(
        upstream: FakeUpstream,
        specs: &[Spec],
        options: Options,
    ) -> Result<Pool, String> {
        let backends = stack::backends().await?;
        let mut accounts = Vec::new();
        for spec in specs {
            let mut input = stack::account(
                spec.name,
                spec.base_url.as_deref().unwrap_or(&upstream.base_url),
                spec.concurrency,
                spec.priority,
            );
            input.platform = spec.platform;
            input.serves = spec
                .serves
                .iter()
                .map(|name| poolgate_core::account::Service::parse(name).expect("a service"))
                .collect();
            input.credential = Some(Secret::new(spec.credential.clone()));
            if let Some(refresh) = &spec.refresh_token {
                input.credential_kind = CredentialKind::OAuth;
                input.oauth = Some(OAuthState {
                    refresh_token: Secret::new(refresh.clone()),
                    expires_at_ms: 4_102_444_800_000,
                    token_url: format!(
                        "{}/oauth/token",
                        spec.base_url.as_deref().unwrap_or(&upstream.base_url)
                    ),
                    client_id: String::new(),
                });
            }
            let id = backends
                .store
                .upsert_account(&input)
                .await
                .map_err(|e| format!("account {}: {e}", spec.name))?;
            accounts.push((spec.name.to_owned(), id));
        }
        let (_, key) = backends
            .store
            .create_api_key("evidence", "alice", "default", 0)
            .await
            .map_err(|e| format!("api key: {e}"))?;
        // Accounts are in Postgres before the selectors start: every snapshot has them at once.
        let (admission, admission_addr) =
            stack::admission(&backends.redis.url(), Default::default()).await?;
        let mut selectors = Vec::new();
        let mut relays = Vec::new();
        let mut bases = Vec::new();
        for _ in 0..options.relays.max(1) {
            let (built, selector_addr) = selector(&backends, &options).await?;
            let (relay, address) = stack::relay_with_handle(
                vec![format!("http://{selector_addr}")],
                vec![format!("http://{admission_addr}")],
                options.relay.clone(),
            )
            .await?;
            selectors.push(built);
            relays.push(relay);
            bases.push(format!("http://{address}"));
        }
        Ok(Pool {
            mode: Mode::Distributed,
            upstream,
            bases,
            key: key.expose().to_owned(),
            http: reqwest::Client::new(),
            accounts,
            options,
            relays,
            engines: Engines::Distributed {
                backends,
                selectors,
                _admission: admission,
            },
        })
    }

    /// The distributed stack's Postgres and Redis (`None` in standalone mode).
    pub fn backends(&self) -> Option<&Backends> {
        match &self.engines {
            Engines::Distributed { backends, .. } => Some(backends),
            Engines::Standalone { .. } => None,
        }
    }

    pub fn id(&self, name: &str) -> i64 {
        self.accounts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, id)| *id)
            .unwrap_or_else(|| panic!("no account {name}"))
    }

    /// Sends `body` to `path` on relay `relay` (modulo the relay count) with the client key
    /// (`x-api-key` on Anthropic paths, a bearer token on OpenAI ones) and reads the whole
    /// answer; status 0 when none came within 60 s.
    pub async fn send(&self, relay: usize, path: &str, body: &Value) -> (u16, String) {
        let base = &self.bases[relay % self.bases.len()];
        let mut request = self.http.post(format!("{base}{path}"));
        request = if path.starts_with("/v1/messages") {
            request
                .header("x-api-key", &self.key)
                .header("anthropic-version", "2023-06-01")
        } else {
            request.bearer_auth(&self.key)
        };
        let call = async {
            let response = request.json(body).send().await.ok()?;
            let status = response.status().as_u16();
            // A stream the relay ends with an error reads as far as it came.
            let text = response.text().await.unwrap_or_default();
            Some((status, text))
        };
        match tokio::time::timeout(Duration::from_secs(60), call).await {
            Ok(Some(answer)) => answer,
            Ok(None) => (0, "no answer (connection failed)".into()),
            Err(_) => (0, "no answer within 60 s".into()),
        }
    }

    /// Every account's health, in the order given.
    pub async fn health(&self) -> Vec<Health> {
        let mut all = Vec::new();
        match &self.engines {
            Engines::Standalone { operator, .. } => {
                let views = operator.accounts(None).await.expect("accounts readable");
                let blocks = operator.blocks().await.expect("blocks readable");
                for (name, id) in &self.accounts {
                    let view = views.iter().find(|v| v.id == *id);
                    all.push(Health {
                        id: *id,
                        name: name.clone(),
                        status: view.map(|v| v.status.clone()).unwrap_or_default(),
                        reason: view.map(|v| v.status_reason.clone()).unwrap_or_default(),
                        blocks: blocks
                            .iter()
                            .filter(|b| b.account_id == *id)
                            .map(|b| Block {
                                kind: b.kind.clone(),
                                class: b.class.clone(),
                                status: b.status,
                                reason: b.reason.clone(),
                                remaining_ms: b.remaining_ms,
                            })
                            .collect(),
                        breaker: None,
                        failures: None,
                        unauthorized: None,
                    });
                }
            }
            Engines::Distributed {
                backends,
                selectors,
                ..
            } => {
                let selector = &selectors[0].selector;
                let blocks = selector.blocks().await.expect("blocks readable");
                let mut redis = backends.redis.client().await.expect("redis");
                for (name, id) in &self.accounts {
                    let account = backends.store.load_account(*id).await.expect("account");
                    let health = selector.health().read_one(*id).await.expect("health");
                    let unauthorized: u64 = redis::cmd("ZCARD")
                        .arg(poolgate_runtime::redis_keys::unauthorized_events(*id))
                        .query_async(&mut redis)
                        .await
                        .expect("zcard");
                    all.push(Health {
                        id: *id,
                        name: name.clone(),
                        status: account.status.as_str().to_owned(),
                        reason: account.status_reason.clone(),
                        blocks: blocks
                            .iter()
                            .filter(|b| b.account_id == *id)
                            .map(|b| Block {
                                kind: b.kind.to_owned(),
                                class: b.class.clone(),
                                status: b.status,
                                reason: b.reason.clone(),
                                remaining_ms: b.remaining_ms,
                            })
                            .collect(),
                        breaker: Some(health.breaker),
                        failures: Some(health.failures),
                        unauthorized: Some(unauthorized),
                    });
                }
            }
        }
        all
    }

    /// Account `name`'s stored usage windows as `(kind label, utilization)`, read fresh.
    pub async fn windows_of(&self, name: &str) -> Vec<(String, Option<f64>)> {
        let id = self.id(name);
        match &self.engines {
            Engines::Standalone { operator, .. } => operator
                .windows(Some(id), None)
                .await
                .expect("windows readable")
                .into_iter()
                .map(|row| (row.kind, row.utilization))
                .collect(),
            Engines::Distributed { selectors, .. } => selectors[0]
                .selector
                .windows(Some(id), None)
                .await
                .expect("windows readable")
                .into_iter()
                .flat_map(|(_, readings)| readings)
                .map(|r| (r.kind.label().to_owned(), r.utilization))
                .collect(),
        }
    }

    pub async fn health_of(&self, name: &str) -> Health {
        self.health()
            .await
            .into_iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no account {name}"))
    }

    /// The stored credential of account `name` as the selector would hand it out (distributed:
    /// Postgres; standalone: the engine's snapshot is not reachable, `None`).
    pub async fn stored_credential(&self, name: &str) -> Option<String> {
        match &self.engines {
            Engines::Distributed { backends, .. } => backends
                .store
                .load_account(self.id(name))
                .await
                .ok()
                .map(|a| a.credential.expose().to_owned()),
            Engines::Standalone { .. } => None,
        }
    }

    /// The selector counters (`selector_*`) of every selector of the pool, summed by series.
    pub fn counters(&self) -> Counters {
        let texts: Vec<String> = match &self.engines {
            // The standalone engines register their metrics in the relay's registry.
            Engines::Standalone { .. } => self.relays.iter().map(|r| r.metrics.render()).collect(),
            // The selectors count their own work; relays selecting at the edge count their plans
            // (`selector_selects_total` and the other engine metrics, in the relay's registry).
            Engines::Distributed { selectors, .. } => selectors
                .iter()
                .map(|s| poolgate_runtime::metrics::render(&s.selector.metrics().registry))
                .chain(self.relays.iter().map(|r| r.metrics.render()))
                .collect(),
        };
        let mut series = BTreeMap::new();
        for text in texts {
            for line in text.lines() {
                if !line.starts_with("selector_") {
                    continue;
                }
                let Some((name, value)) = line.rsplit_once(' ') else {
                    continue;
                };
                let Ok(value) = value.parse::<f64>() else {
                    continue;
                };
                *series.entry(name.to_owned()).or_insert(0.0) += value;
            }
        }
        Counters(series)
    }
}

/// Selector counters by series (`name{labels}`), as rendered.
#[derive(Debug, Clone, Default)]
pub struct Counters(pub BTreeMap<String, f64>);

impl Counters {
    /// The series of metric `name` (a counter's `_total` name) with a non-zero value whose
    /// labels include every `label="value"` of `having`.
    pub fn nonzero(&self, name: &str, having: &[(&str, &str)]) -> Vec<(String, f64)> {
        self.0
            .iter()
            .filter(|(series, value)| {
                **value > 0.0
                    && (series.as_str() == name || series.starts_with(&format!("{name}{{")))
                    && having
                        .iter()
                        .all(|(label, v)| series.contains(&format!("{label}=\"{v}\"")))
            })
            .map(|(s, v)| (s.clone(), *v))
            .collect()
    }

    pub fn sum(&self, name: &str, having: &[(&str, &str)]) -> f64 {
        self.nonzero(name, having).iter().map(|(_, v)| v).sum()
    }
}

/// Probe settings short enough for a test: a probe's whole life fits in a few seconds, and an
/// unconfirmed suspicion keeps the account quiet only briefly (so the probe runs often).
pub fn quick_probe() -> ProbeSettings {
    ProbeSettings {
        timeout: Duration::from_secs(5),
        lease_wait: Duration::from_secs(2),
        block: Duration::from_secs(8),
        quiet_after_unconfirmed: Duration::from_millis(300),
        ..ProbeSettings::default()
    }
}

pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}
