//! One client request, end to end (docs/DESIGN.md §6): select → lease (user
//! RPM on the first lease only) → upstream call → classify → same-account retry on conflict →
//! fail over within the budget → report → bind on success → spend on release, usage batched.
//! Bookkeeping runs after the last byte, off the client's latency path.
//!
//! This module is the relay's request core and its short plan → lease → call loop; `run` is one
//! request's state between its plans and its answer (what it learned, each step's decision),
//! `auth` checks client keys, `keys` what a key
//! may reach and its holder's view of it, `request` builds the upstream request (the header
//! rules in `headers`, the body's changes in `body`) on the HTTP clients of `clients`, `call`
//! makes one upstream call and serves a whole answer, `stream` pumps a streamed one, `finish`
//! does the bookkeeping after the last byte, `report` is everything the relay tells selection,
//! `cache` the answer caches.

mod auth;
pub(crate) mod body;
mod cache;
mod call;
mod clients;
mod finish;
mod headers;
mod keys;
mod report;
mod request;
pub mod rerank;
mod run;
mod stream;
pub mod upstream_socket;

use poolgate_core::keys::KeyDescription;
use std::sync::Arc;

use poolgate_core::Clock;
use poolgate_core::account::Service;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use poolgate_core::classify::Classified;
use poolgate_core::lease::{Denial, LeaseTerms, UserLimit};
use poolgate_core::money::usd_to_micros;
use poolgate_core::outcome::OutcomeClass;
use tokio::sync::mpsc;

use crate::client_api::{Api, ErrorKind, RelayError};
use poolgate_core::select::NoneReason;

/// `retry-after` of an embeddings or rerank request the pool could not take now, when no
/// account said when it has room again (docs/DESIGN.md §6, "Embeddings and rerank").
pub const POOL_OUT_RETRY_MS: u64 = 1000;
use crate::metrics::Metrics;
use crate::ports::{Caller, KeyCheck, KeyLimit, Lease, LeaseApi, PlannedAccount, SelectionApi};
use crate::usage_sink::{ApiUsage, SinkSettings, UsageSink};

pub use body::{BodyJsonError, MAX_DEPTH as MAX_JSON_DEPTH, TopLevel};
use cache::TtlCache;
use clients::HttpClients;
use finish::UnpricedModels;
pub use headers::{merged_betas, passes_upstream};
pub use keys::key_view;
pub use request::HttpClientError;
use run::{RequestRun, Step, overloaded};

#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Upstream failures one request may fail over on (local refusals do not count).
    pub failover_budget: u32,
    /// Acquire attempts per request, at most.
    pub max_acquires: u32,
    /// How long a request may wait for capacity (a full pool, or blocks ending).
    pub max_wait: Duration,
    /// A streaming client waiting this long gets SSE keep-alive comments.
    pub ping_after: Duration,
    pub ping_every: Duration,
    /// Same-account retries on 409/423, and the pause before each.
    pub conflict_retries: u32,
    pub conflict_delay: Duration,
    /// A 429 reset further ahead than this is "window exhausted" (hard block).
    pub hard_block_threshold: Duration,
    /// Bound on connecting and on the response head from upstream.
    pub upstream_timeout: Duration,
    /// How long an authentication answer is reused.
    pub auth_cache_ttl: Duration,
    /// Largest request body accepted, and largest error body kept.
    pub max_body_bytes: usize,
    /// After a client disconnects, how long its slot stays held before release (the upstream
    /// counts the cancelled call until it notices the closed connection).
    pub cancel_linger: Duration,
    /// The client edge under hostile traffic (docs/SECURITY.md, "The HTTP front").
    pub edge: EdgeSettings,
    /// The Responses API over a WebSocket (`http/socket.rs`).
    pub sockets: crate::http::socket::SocketSettings,
}

/// Bounds on what a client connection may hold of the relay's time and memory.
#[derive(Debug, Clone)]
pub struct EdgeSettings {
    /// Longest wait for a request's headers (HTTP/1).
    pub header_read_timeout: Duration,
    /// Longest pause between two chunks of a request body.
    pub body_idle_timeout: Duration,
    /// Past `body_rate_grace`, a body must have arrived at this many bytes per second on
    /// average, or the request gets a 408 and the connection is closed.
    pub body_min_rate: u64,
    pub body_rate_grace: Duration,
    /// Request body bytes buffered across all connections at once: past it, 503.
    pub max_buffered_bytes: usize,
    /// HTTP/2: concurrent streams per connection, and resets a client may make in a row.
    pub h2_max_concurrent_streams: u32,
    pub h2_max_pending_resets: usize,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        EdgeSettings {
            header_read_timeout: Duration::from_secs(20),
            body_idle_timeout: Duration::from_secs(30),
            body_min_rate: 16 << 10,
            body_rate_grace: Duration::from_secs(10),
            max_buffered_bytes: 512 << 20,
            h2_max_concurrent_streams: 128,
            h2_max_pending_resets: 32,
        }
    }
}

impl Default for RelaySettings {
    fn default() -> Self {
        RelaySettings {
            failover_budget: 3,
            max_acquires: 8,
            max_wait: Duration::from_secs(30),
            ping_after: Duration::from_secs(10),
            ping_every: Duration::from_secs(10),
            conflict_retries: 3,
            conflict_delay: Duration::from_millis(500),
            hard_block_threshold: Duration::from_secs(60),
            upstream_timeout: Duration::from_secs(600),
            auth_cache_ttl: Duration::from_millis(500),
            max_body_bytes: 32 << 20,
            cancel_linger: Duration::from_secs(1),
            edge: EdgeSettings::default(),
            sockets: Default::default(),
        }
    }
}

/// What went wrong with the client's request itself (before any account is involved).
pub type Refusal = RelayError;

/// The head of the answer, then its body.
pub enum Answer {
    Upstream {
        status: StatusCode,
        headers: HeaderMap,
        body: Body,
    },
    Error(RelayError),
}

pub enum Body {
    Full(Bytes),
    Stream(mpsc::Receiver<Bytes>),
}

/// A parsed client request.
pub struct Inbound {
    pub api: Api,
    /// Upstream path, e.g. `/v1/messages`.
    pub path: &'static str,
    /// The client's query string, passed upstream as it came (`beta=true`).
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The body's top level, raw (`body.rs`): what the relay reads and rewrites of it.
    pub top: TopLevel,
    pub model: String,
    pub stream: bool,
    pub caller: Caller,
    pub session_hash: Option<String>,
    /// The request opens its conversation (`session::opens_conversation`).
    pub opens_conversation: bool,
    pub previous_response_id: Option<String>,
    /// count_tokens: no account limits, no Messages RPM, no health change; its own per-user
    /// rate and per-account cap instead (`auth.rs`).
    pub ungoverned: bool,
    /// The share of the edge's body budget `body` holds, given back with it.
    pub buffered: crate::edge::Hold,
    /// A turn that came over a client's Responses socket: its upstream socket
    /// (`upstream_socket.rs`).
    pub socket: Option<upstream_socket::SocketTurn>,
    /// What the request asks of an account.
    pub service: Service,
    /// A rerank request: what its passthrough needs, and whether the client asked for it.
    pub rerank: Option<rerank::Rerank>,
}

pub struct Relay {
    pub selection: Arc<dyn SelectionApi>,
    pub leases: Arc<dyn LeaseApi>,
    /// Usage records on their way to the selection API, in batches (`usage_sink.rs`).
    pub usage: UsageSink,
    /// Wall time for what the relay judges itself (a cached key's expiry, an answer's reset
    /// times, usage records): the engines' clock in standalone mode, the system's otherwise.
    pub clock: Clock,
    pub settings: RelaySettings,
    pub metrics: Metrics,
    /// The upstream HTTP clients, direct and per account proxy (`clients.rs`).
    http: HttpClients,
    /// Upstreams that answered a socket's upgrade with "none here" (`upstream_socket.rs`).
    no_socket: upstream_socket::NoSocket,
    /// The selector's key checks, reused for `auth_cache_ttl` (`auth.rs`).
    auth_cache: TtlCache<KeyCheck>,
    /// Key lookups in flight at the selector: a flood of random keys (each a cache miss) waits
    /// for a permit instead of multiplying selector calls (`auth.rs`).
    auth_lookups: tokio::sync::Semaphore,
    /// Self-service descriptions by key, reused for `keys::DESCRIPTION_TTL`: each costs the
    /// selector four ledger sums, and a key holder polling its view must not load Postgres.
    descriptions: TtlCache<KeyDescription>,
    /// Models already logged as having no price (each once; bounded).
    unpriced_models: UnpricedModels,
}

/// What one upstream call came to.
enum Called {
    /// 2xx: the answer is on its way to the client; bookkeeping follows its last byte.
    Served(Answer),
    /// Admission said the lease is gone for good before the first byte reached the client.
    LeaseLost(Box<dyn Lease>),
    /// A non-2xx answer (or a network failure), classified, with the body kept for passing on.
    Failed {
        classified: Classified,
        status: u16,
        headers: HeaderMap,
        body: Bytes,
        lease: Box<dyn Lease>,
    },
}

impl Relay {
    pub fn new(
        selection: Arc<dyn SelectionApi>,
        leases: Arc<dyn LeaseApi>,
        settings: RelaySettings,
        metrics: Metrics,
    ) -> Result<Self, HttpClientError> {
        Ok(Relay {
            http: HttpClients::new(settings.upstream_timeout)?,
            no_socket: upstream_socket::NoSocket::default(),
            usage: UsageSink::start(
                ApiUsage(selection.clone()),
                metrics.usage_lost.clone(),
                SinkSettings::default(),
            ),
            selection,
            clock: Clock::system(),
            leases: Arc::new(crate::ports::Lingering::new(leases, settings.cancel_linger)),
            auth_cache: TtlCache::new(settings.auth_cache_ttl, auth::MAX_CACHED_CHECKS),
            settings,
            metrics,
            auth_lookups: tokio::sync::Semaphore::new(auth::MAX_KEY_LOOKUPS),
            descriptions: TtlCache::new(keys::DESCRIPTION_TTL, keys::MAX_CACHED_DESCRIPTIONS),
            unpriced_models: UnpricedModels::default(),
        })
    }

    /// The same relay on `clock` (the standalone engines' own).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Runs the request to its answer; one that reached an upstream is timed in
    /// `relay_added_seconds` (all of its time here but its upstream calls).
    pub async fn run(self: Arc<Self>, inbound: Inbound) -> Answer {
        let started = Instant::now();
        let platform = inbound.api.platform();
        let mut upstream = UpstreamTime::default();
        let answer = self
            .clone()
            .plan_and_call(inbound, started, &mut upstream)
            .await;
        if upstream.calls > 0 {
            self.metrics.added_latency(
                platform.as_str(),
                started.elapsed().saturating_sub(upstream.spent),
            );
        }
        answer
    }

    /// select → lease → call → fail over, to the answer: one [`RequestRun`] moving through
    /// its steps (`run.rs`).
    async fn plan_and_call(
        self: Arc<Self>,
        inbound: Inbound,
        started: Instant,
        upstream: &mut UpstreamTime,
    ) -> Answer {
        let mut run = RequestRun::new(&self, &inbound, started);
        let answer = loop {
            let plan = match run.plan().await {
                Step::Go(plan) => plan,
                Step::Again => continue,
                Step::Answer(answer) => break answer,
            };
            let (account, lease) = match run.lease(&plan).await {
                Step::Go(leased) => leased,
                Step::Again => continue,
                Step::Answer(answer) => break answer,
            };
            let called = self
                .clone()
                .call_with_retries(&inbound, &account, lease, started, upstream)
                .await;
            if let Some(answer) = run.outcome(&account, called).await {
                break answer;
            }
        };
        self.pool_out(&inbound, &run, answer)
    }

    /// A request's answer when the pool could not serve it now (`run.out`), for the paths that
    /// wait in no queue (docs/DESIGN.md §6, "Embeddings and rerank"): a rerank whose client or
    /// group asked for the passthrough gets the recall order; otherwise a 429 at once, with
    /// `retry-after` the soonest an account is known to have room (else a second), so a batch
    /// goes back to its client's queue. A group with no account for the endpoint keeps its 404;
    /// chat keeps its answer.
    fn pool_out(&self, inbound: &Inbound, run: &RequestRun<'_>, answer: Answer) -> Answer {
        let Some(out) = run.out else {
            return answer;
        };
        if inbound.service == Service::Chat {
            return answer;
        }
        if let Some(rerank) = &inbound.rerank
            && rerank.passthrough(run.group_rerank_passthrough)
        {
            self.metrics
                .rerank_degraded
                .with_label_values(&[out.reason])
                .inc();
            return rerank.passthrough_answer(out.reason);
        }
        if out.reason == NoneReason::NoAccounts.as_str() {
            return answer;
        }
        self.metrics
            .pool_refusals
            .with_label_values(&[inbound.service.as_str(), out.reason])
            .inc();
        let retry_after_ms = if out.retry_after_ms == 0 {
            POOL_OUT_RETRY_MS
        } else {
            out.retry_after_ms
        };
        Answer::Error(
            RelayError {
                openai_code: Some("pool_busy"),
                ..RelayError::new(
                    inbound.api,
                    ErrorKind::RateLimited,
                    format!(
                        "no account can take this {} request now ({}); retry after the time in retry-after",
                        inbound.service.as_str(),
                        out.reason
                    ),
                )
            }
            .retry_after_ms(retry_after_ms),
        )
    }

    fn terms(
        &self,
        inbound: &Inbound,
        account: &PlannedAccount,
        charge_user: bool,
        bound: bool,
    ) -> LeaseTerms {
        let caller = &inbound.caller;
        LeaseTerms {
            account_id: account.id,
            concurrency_limit: if inbound.ungoverned {
                0
            } else {
                account.concurrency_limit
            },
            rpm_limit: if inbound.ungoverned {
                0
            } else {
                account.rpm_limit
            },
            // count_tokens takes no account limit and no Messages RPM: its user's rate was
            // charged apart (`charge_count_tokens`), and the user bucket here is the account's
            // count_tokens cap, so it cannot hammer one upstream.
            user: if inbound.ungoverned {
                Some(UserLimit {
                    user_id: auth::count_tokens_account_bucket(account.id),
                    rpm_limit: auth::COUNT_TOKENS_ACCOUNT_RPM,
                })
            } else {
                (charge_user && caller.user_rpm_limit > 0).then(|| UserLimit {
                    user_id: caller.user.clone(),
                    rpm_limit: caller.user_rpm_limit,
                })
            },
            session_hash: inbound.session_hash.clone(),
            session_window_limit_micros: if inbound.ungoverned {
                0
            } else {
                usd_to_micros(account.session_window_limit_usd.max(0.0)).unwrap_or(0)
            },
            session_bound: bound,
            ignore_cooldown: false,
            // count_tokens holds no slot of the key and charges it nothing: its budget and TPM
            // were asked once, with the user's rate (`charge_count_tokens`).
            key: if inbound.ungoverned {
                None
            } else {
                caller.key_limits()
            },
        }
    }

    /// The answer to a request its key's own limit refused (docs/DESIGN.md §4): nothing was
    /// leased, reported or recorded, and no upstream was called. Counted by limit, never by key.
    fn key_limited(&self, api: Api, denial: Denial) -> Answer {
        let Some(limit) = KeyLimit::of(denial.reason) else {
            return overloaded(api, "every account is busy; try again shortly");
        };
        self.metrics.key_limited(limit);
        tracing::debug!(limit = limit.as_str(), "client key limit reached");
        Answer::Error(RelayError::key_limit(
            api,
            limit,
            denial.retry_after_ms,
            self.clock.wall_ms(),
        ))
    }

    /// Calls one account, retrying the same account on conflicts (keeping the lease).
    async fn call_with_retries(
        self: Arc<Self>,
        inbound: &Inbound,
        account: &PlannedAccount,
        mut lease: Box<dyn Lease>,
        started: Instant,
        upstream: &mut UpstreamTime,
    ) -> Called {
        let mut retries = 0;
        loop {
            match self
                .clone()
                .call(inbound, account, lease, started, upstream)
                .await
            {
                Called::Failed {
                    classified,
                    status,
                    headers,
                    body,
                    lease: mut returned,
                } if classified.class == OutcomeClass::Conflict
                    && retries < self.settings.conflict_retries =>
                {
                    retries += 1;
                    tokio::time::sleep(self.settings.conflict_delay).await;
                    self.metrics.same_account_retries.inc();
                    if !returned.attempt().await {
                        // The account's RPM refused the retry: try a sibling.
                        self.metrics.failover("rpm", "local");
                        return Called::Failed {
                            classified,
                            status,
                            headers,
                            body,
                            lease: returned,
                        };
                    }
                    self.metrics.failover("same_account", "retry");
                    lease = returned;
                }
                other => return other,
            }
        }
    }
}

/// The time one request spent in upstream calls; `relay_added_seconds` is the rest of its time
/// in the relay (docs/METRICS.md).
#[derive(Debug, Default)]
struct UpstreamTime {
    spent: Duration,
    calls: u32,
}

impl UpstreamTime {
    /// An upstream call sent at `sent` is over as far as the relay waits on it: its failure, its
    /// error answer read, a streamed answer's first byte, or a whole answer's last byte.
    fn ended(&mut self, sent: Instant) {
        self.spent += sent.elapsed();
        self.calls += 1;
    }
}
