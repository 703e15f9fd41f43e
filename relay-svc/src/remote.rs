//! The gRPC-client backends: the selector (with usage records batched) and admission (one lease
//! per stream, heartbeats every ttl/3, `Resume` on another replica when a stream breaks, and the
//! upstream call finishing anyway when that fails). Channels balance over every endpoint given.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::account::{CredentialKind, Price, Secret};
use poolgate_core::lease::{Denial, DenyReason, LeaseTerms};
use poolgate_core::money::micros_to_usd;
use poolgate_core::outcome::OutcomeClass;
use poolgate_proto::admission::v1 as apb;
use poolgate_proto::admission::v1::admission_client::AdmissionClient;
use poolgate_proto::selector::v1 as spb;
use poolgate_proto::selector::v1::selector_client::SelectorClient;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use crate::backends::Backends;
use crate::backends::{
    Acquired, BackendError, Caller, Lease, Leases, Plan, PlanRequest, Planned, Selection,
    UsageRecord,
};
use crate::metrics::Metrics;
use crate::usage_sink::{SinkSettings, UsageSink, UsageWriter, WriteError};
use poolgate_core::classify::Classified;
use poolgate_runtime::service_auth::WithToken;

fn endpoint(
    url: &str,
    tls: Option<&tonic::transport::ClientTlsConfig>,
) -> Result<Endpoint, String> {
    let mut endpoint =
        Endpoint::from_shared(url.to_owned()).map_err(|e| format!("bad endpoint {url:?}: {e}"))?;
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls.clone())
            .map_err(|e| format!("tls for {url:?}: {e}"))?;
    }
    Ok(endpoint
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true))
}

/// How often DNS names of endpoints are resolved again (replicas come and go).
const RESOLVE_EVERY: Duration = Duration::from_secs(5);
/// How often every replica's address is probed (a TCP connect).
const PROBE_EVERY: Duration = Duration::from_secs(1);
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A channel balanced over every replica: one HTTP/2 connection each, since a gRPC stream pins to
/// its connection (a ClusterIP would send all of a relay's leases to one pod). An endpoint whose
/// host is a DNS name (a Kubernetes headless Service) is resolved every few seconds, and each
/// address it resolves to is a replica; an IP endpoint is one replica. Every replica is probed
/// each second: one that does not accept connections leaves the balancer until it does again
/// (the balancer would otherwise keep sending calls to a dead replica, which fail at once).
/// With a CA, `https://` endpoints are verified against it and the name in the URL; with an
/// identity, the relay presents that client certificate (mutual TLS).
pub fn balanced_channel(endpoints: &[String], client: &GrpcClient) -> Result<Channel, String> {
    if endpoints.is_empty() {
        return Err("no endpoints".into());
    }
    let (channel, changes) = Channel::balance_channel::<String>(64);
    for url in endpoints {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("bad endpoint {url:?}: {e}"))?;
        let scheme = uri.scheme_str().unwrap_or("http").to_owned();
        let host = uri
            .host()
            .ok_or_else(|| format!("endpoint {url:?} has no host"))?
            .to_owned();
        let port = uri
            .port_u16()
            .unwrap_or(if scheme == "https" { 443 } else { 80 });
        let bare_host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let tls = client
            .tls_ca
            .as_ref()
            .filter(|_| scheme == "https")
            .map(|ca| {
                let tls = tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca))
                    .domain_name(bare_host.clone());
                match &client.tls_identity {
                    Some((cert, key)) => {
                        tls.identity(tonic::transport::Identity::from_pem(cert, key))
                    }
                    None => tls,
                }
            });
        endpoint(url, tls.as_ref())?;
        let mut current = std::collections::HashSet::new();
        if let Ok(ip) = bare_host.parse::<std::net::IpAddr>() {
            // Usable at once; the watcher takes it out if it does not answer.
            let address = std::net::SocketAddr::new(ip, port);
            let key = format!("{scheme}://{address}");
            changes
                .try_send(tonic::transport::channel::Change::Insert(
                    key.clone(),
                    endpoint(&key, tls.as_ref())?,
                ))
                .map_err(|_| "balancer queue full".to_string())?;
            current.insert(address);
        }
        tokio::spawn(watch_replicas(
            Replicas {
                scheme,
                host: bare_host,
                port,
                tls,
            },
            current,
            changes.clone(),
        ));
    }
    Ok(channel)
}

struct Replicas {
    scheme: String,
    host: String,
    port: u16,
    tls: Option<tonic::transport::ClientTlsConfig>,
}

impl Replicas {
    fn key(&self, address: &std::net::SocketAddr) -> String {
        format!("{}://{address}", self.scheme)
    }

    async fn resolve(&self) -> std::io::Result<Vec<std::net::SocketAddr>> {
        if let Ok(ip) = self.host.parse::<std::net::IpAddr>() {
            return Ok(vec![std::net::SocketAddr::new(ip, self.port)]);
        }
        Ok(tokio::net::lookup_host((self.host.as_str(), self.port))
            .await?
            .collect())
    }
}

async fn accepts_connections(address: std::net::SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await,
        Ok(Ok(_))
    )
}

/// Keeps the balancer's endpoints equal to the replicas that resolve and accept connections (all
/// that resolve when none does, so calls fail with an error rather than wait for a replica).
async fn watch_replicas(
    replicas: Replicas,
    mut current: std::collections::HashSet<std::net::SocketAddr>,
    changes: mpsc::Sender<tonic::transport::channel::Change<String, Endpoint>>,
) {
    use tonic::transport::channel::Change;
    let mut resolved: Vec<std::net::SocketAddr> = current.iter().copied().collect();
    let mut resolved_at: Option<tokio::time::Instant> = None;
    loop {
        if resolved_at.is_none_or(|at| at.elapsed() >= RESOLVE_EVERY) {
            match replicas.resolve().await {
                Ok(addresses) => {
                    resolved = addresses;
                    resolved_at = Some(tokio::time::Instant::now());
                }
                Err(error) => {
                    tracing::warn!(host = %replicas.host, %error, "endpoint name did not resolve; keeping the last replicas")
                }
            }
        }
        let mut probes = tokio::task::JoinSet::new();
        for address in resolved.iter().copied() {
            probes.spawn(async move { (address, accepts_connections(address).await) });
        }
        let mut live = std::collections::HashSet::new();
        while let Some(probe) = probes.join_next().await {
            if let Ok((address, true)) = probe {
                live.insert(address);
            }
        }
        let wanted: std::collections::HashSet<std::net::SocketAddr> = if live.is_empty() {
            resolved.iter().copied().collect()
        } else {
            live
        };
        for gone in current.difference(&wanted) {
            if changes
                .send(Change::Remove(replicas.key(gone)))
                .await
                .is_err()
            {
                return;
            }
        }
        for new in wanted.difference(&current) {
            let key = replicas.key(new);
            if let Ok(endpoint) = endpoint(&key, replicas.tls.as_ref())
                && changes.send(Change::Insert(key, endpoint)).await.is_err()
            {
                return;
            }
        }
        if wanted != current {
            tracing::info!(host = %replicas.host, replicas = wanted.len(), "endpoint replicas changed");
        }
        current = wanted;
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

/// A balanced channel that carries the current trace context in every request's metadata, and
/// counts every call (`grpc_client_*` metrics).
pub type Traced = poolgate_runtime::grpc_metrics::GrpcMetricsService<
    poolgate_runtime::telemetry::Inject<WithToken<Channel>>,
>;

fn traced(
    channel: WithToken<Channel>,
    metrics: &poolgate_runtime::grpc_metrics::GrpcMetrics,
) -> Traced {
    tower::Layer::layer(metrics, poolgate_runtime::telemetry::Inject::new(channel))
}

fn backend(status: tonic::Status) -> BackendError {
    BackendError(format!("{:?}: {}", status.code(), status.message()))
}

/// The selector over gRPC.
pub struct RemoteSelection {
    client: SelectorClient<Traced>,
    usage: UsageSink,
    report_failures: Arc<Throttle>,
    /// Successes waiting to be reported, per account (the last status). Most outcomes are
    /// successes and most change nothing, so they are coalesced: at most one report per account
    /// every `SUCCESS_FLUSH`, instead of a call per request. Any other outcome of an account
    /// sends that account's pending success first, so the selector sees them in order.
    successes: Arc<std::sync::Mutex<HashMap<i64, u16>>>,
}

/// How often coalesced success reports are sent (a breaker probe's success closes the breaker
/// this much later at most).
const SUCCESS_FLUSH: Duration = Duration::from_millis(50);

/// Lets a repeated warning through at most once per `every` and counts what it held back, so an
/// outage behind the selector does not write one log line per request.
struct Throttle {
    every: Duration,
    last: std::sync::Mutex<Option<tokio::time::Instant>>,
    held_back: std::sync::atomic::AtomicU64,
}

impl Throttle {
    fn new(every: Duration) -> Self {
        Throttle {
            every,
            last: std::sync::Mutex::new(None),
            held_back: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last one)` when this occurrence may be logged.
    fn allow(&self) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = tokio::time::Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < self.every) {
            self.held_back
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.held_back.swap(0, std::sync::atomic::Ordering::Relaxed))
    }
}

impl RemoteSelection {
    pub fn new(
        channel: WithToken<Channel>,
        grpc_metrics: &poolgate_runtime::grpc_metrics::GrpcMetrics,
        usage_lost: prometheus::IntCounter,
    ) -> Self {
        let client = SelectorClient::new(traced(channel, grpc_metrics));
        let usage = UsageSink::start(
            SelectorUsage(client.clone()),
            usage_lost,
            SinkSettings::default(),
        );
        let successes = Arc::new(std::sync::Mutex::new(HashMap::new()));
        let report_failures = Arc::new(Throttle::new(Duration::from_secs(5)));
        tokio::spawn(flush_successes(
            client.clone(),
            Arc::downgrade(&successes),
            report_failures.clone(),
        ));
        RemoteSelection {
            client,
            usage,
            report_failures,
            successes,
        }
    }
}

fn success_report(account_id: i64, status: u16) -> spb::ReportOutcomeRequest {
    spb::ReportOutcomeRequest {
        account_id,
        class: spb::OutcomeClass::Success as i32,
        status: u32::from(status),
        reset_at_ms: 0,
        reason: String::new(),
        after_refresh: false,
    }
}

/// Sends the coalesced success reports every `SUCCESS_FLUSH` (ends with the selection).
async fn flush_successes(
    client: SelectorClient<Traced>,
    successes: std::sync::Weak<std::sync::Mutex<HashMap<i64, u16>>>,
    failures: Arc<Throttle>,
) {
    loop {
        tokio::time::sleep(SUCCESS_FLUSH).await;
        let Some(successes) = successes.upgrade() else {
            return;
        };
        let pending: Vec<(i64, u16)> =
            std::mem::take(&mut *successes.lock().unwrap_or_else(|p| p.into_inner()))
                .into_iter()
                .collect();
        drop(successes);
        for (account_id, status) in pending {
            if let Err(status) = client
                .clone()
                .report_outcome(success_report(account_id, status))
                .await
                && let Some(held_back) = failures.allow()
            {
                tracing::warn!(account_id, code = ?status.code(), held_back, "outcome report failed (held_back: failures not logged since the last line)");
            }
        }
    }
}

impl RemoteSelection {
    /// Sends a non-success outcome, after a success of the account held back for coalescing
    /// (in order: it happened first). `None` when the selector could not be reached.
    async fn send_report(
        &self,
        account_id: i64,
        outcome: Classified,
        status: u16,
        reason: &str,
        after_refresh: bool,
    ) -> Option<spb::ReportOutcomeResponse> {
        let pending_success = self
            .successes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&account_id);
        if let Some(success_status) = pending_success {
            let _ = self
                .client
                .clone()
                .report_outcome(success_report(account_id, success_status))
                .await;
        }
        let request = spb::ReportOutcomeRequest {
            account_id,
            class: class_pb(outcome.class) as i32,
            status: u32::from(status),
            reset_at_ms: outcome.reset_at_ms.map(|ms| ms.max(0) as u64).unwrap_or(0),
            reason: reason.chars().take(400).collect(),
            after_refresh,
        };
        match self.client.clone().report_outcome(request).await {
            Ok(answer) => Some(answer.into_inner()),
            Err(status) => {
                if let Some(held_back) = self.report_failures.allow() {
                    tracing::warn!(account_id, code = ?status.code(), held_back, "outcome report failed (held_back: failures not logged since the last line)");
                }
                None
            }
        }
    }
}

/// The selector's `RecordUsage`, as the usage sink's writer.
struct SelectorUsage(SelectorClient<Traced>);

#[async_trait]
impl UsageWriter for SelectorUsage {
    async fn write(&self, records: Vec<UsageRecord>) -> Result<(), WriteError> {
        let records = records
            .into_iter()
            .map(|r| spb::UsageRecord {
                api_key_id: r.api_key_id,
                user: r.user,
                account_id: r.account_id,
                model: r.model,
                input_tokens: r.input_tokens,
                output_tokens: r.output_tokens,
                cache_write_tokens: r.cache_write_tokens,
                cache_read_tokens: r.cache_read_tokens,
                cost_usd: r.cost_usd,
                status: u32::from(r.status),
                latency_ms: r.latency_ms,
                at_ms: r.at_ms,
            })
            .collect();
        match self
            .0
            .clone()
            .record_usage(spb::RecordUsageRequest { records })
            .await
        {
            Ok(_) => Ok(()),
            Err(status) if status.code() == tonic::Code::InvalidArgument => {
                tracing::warn!(code = ?status.code(), "the selector refused a usage batch");
                Err(WriteError::Refused)
            }
            Err(_) => Err(WriteError::Retry),
        }
    }
}

fn platform_pb(platform: poolgate_core::account::Platform) -> spb::Platform {
    match platform {
        poolgate_core::account::Platform::Anthropic => spb::Platform::Anthropic,
        poolgate_core::account::Platform::OpenAi => spb::Platform::Openai,
    }
}

fn class_pb(class: OutcomeClass) -> spb::OutcomeClass {
    match class {
        OutcomeClass::Success => spb::OutcomeClass::Success,
        OutcomeClass::Conflict => spb::OutcomeClass::Conflict,
        OutcomeClass::Busy => spb::OutcomeClass::Busy,
        OutcomeClass::WindowExhausted => spb::OutcomeClass::WindowExhausted,
        OutcomeClass::Broken => spb::OutcomeClass::Broken,
        OutcomeClass::Unauthorized => spb::OutcomeClass::Unauthorized,
        OutcomeClass::QuotaGone => spb::OutcomeClass::QuotaGone,
        OutcomeClass::ClientError => spb::OutcomeClass::ClientError,
    }
}

#[async_trait]
impl Selection for RemoteSelection {
    async fn authenticate(&self, api_key: &str) -> Result<Option<Caller>, BackendError> {
        match self
            .client
            .clone()
            .authenticate(spb::AuthenticateRequest {
                api_key: api_key.to_owned(),
            })
            .await
        {
            Ok(answer) => {
                let answer = answer.into_inner();
                Ok(Some(Caller {
                    api_key_id: answer.api_key_id,
                    user: answer.user,
                    group: answer.group,
                    user_rpm_limit: answer.user_rpm_limit,
                }))
            }
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::Unauthenticated | tonic::Code::InvalidArgument
                ) =>
            {
                Ok(None)
            }
            Err(status) => Err(backend(status)),
        }
    }

    async fn select(&self, request: &PlanRequest) -> Result<Plan, BackendError> {
        let platform = platform_pb(request.platform);
        let answer = self
            .client
            .clone()
            .select(spb::SelectRequest {
                group: request.group.clone(),
                platform: platform as i32,
                model: request.model.clone(),
                session_hash: request.session_hash.clone().unwrap_or_default(),
                previous_response_id: request.previous_response_id.clone().unwrap_or_default(),
                exclude_account_ids: request.exclude.clone(),
                max_accounts: 0,
            })
            .await;
        let answer = match answer {
            Ok(answer) => answer.into_inner(),
            // An unknown group is "nothing eligible" to the client, not an outage.
            Err(status) if status.code() == tonic::Code::NotFound => {
                return Ok(Plan {
                    none_reason: Some("no_accounts".into()),
                    ..Plan::default()
                });
            }
            Err(status) => return Err(backend(status)),
        };
        Ok(Plan {
            accounts: answer
                .accounts
                .into_iter()
                .map(|a| {
                    let price = a.price.unwrap_or_default();
                    Planned {
                        id: a.account_id,
                        name: a.name,
                        base_url: a.base_url,
                        credential: Secret::new(a.credential),
                        credential_kind: CredentialKind::parse(&a.credential_kind)
                            .unwrap_or(CredentialKind::ApiKey),
                        mapped_model: a.mapped_model,
                        concurrency_limit: a.concurrency_limit,
                        rpm_limit: a.rpm_limit,
                        session_window_limit_usd: a.session_window_limit_usd,
                        proxy_url: (!a.proxy_url.is_empty()).then_some(a.proxy_url),
                        stream_usage: !a.disable_stream_usage,
                        price: Price {
                            input_per_mtok: price.input_per_mtok,
                            output_per_mtok: price.output_per_mtok,
                            cache_write_per_mtok: price.cache_write_per_mtok,
                            cache_read_per_mtok: price.cache_read_per_mtok,
                        },
                        soft_blocked: a.soft_blocked,
                        inflight: u32::try_from(a.inflight).ok(),
                    }
                })
                .collect(),
            sticky: answer.sticky,
            none_reason: (!answer.none_reason.is_empty()).then_some(answer.none_reason),
            retry_after_ms: answer.retry_after_ms,
        })
    }

    async fn report(&self, account_id: i64, outcome: Classified, status: u16, reason: &str) {
        if outcome.class == OutcomeClass::Success {
            self.successes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(account_id, status);
            return;
        }
        let _ = self
            .send_report(account_id, outcome, status, reason, false)
            .await;
    }

    async fn report_refused(
        &self,
        account_id: i64,
        outcome: Classified,
        status: u16,
        reason: &str,
        after_refresh: bool,
    ) -> Option<Secret> {
        let answer = self
            .send_report(account_id, outcome, status, reason, after_refresh)
            .await?;
        (answer.applied == "refreshed" && !answer.refreshed_credential.is_empty())
            .then(|| Secret::new(answer.refreshed_credential))
    }

    async fn bind_session(&self, group: &str, session_hash: &str, account_id: i64) {
        let request = spb::BindSessionRequest {
            group: group.to_owned(),
            session_hash: session_hash.to_owned(),
            account_id,
        };
        if let Err(status) = self.client.clone().bind_session(request).await {
            tracing::debug!(code = ?status.code(), "session bind failed");
        }
    }

    async fn bind_response(&self, response_id: &str, account_id: i64) {
        let request = spb::BindResponseRequest {
            response_id: response_id.to_owned(),
            account_id,
        };
        if let Err(status) = self.client.clone().bind_response(request).await {
            tracing::debug!(code = ?status.code(), "response bind failed");
        }
    }

    fn record_usage(&self, record: UsageRecord) {
        self.usage.record(record);
    }

    async fn models(&self, group: &str, platform: poolgate_core::account::Platform) -> Vec<String> {
        let platform = platform_pb(platform);
        match self
            .client
            .clone()
            .list_models(spb::ListModelsRequest {
                group: group.to_owned(),
                platform: platform as i32,
            })
            .await
        {
            Ok(answer) => answer.into_inner().models,
            Err(status) => {
                tracing::warn!(code = ?status.code(), "model list unavailable");
                Vec::new()
            }
        }
    }
}

/// Admission over gRPC.
pub struct RemoteLeases {
    client: AdmissionClient<Traced>,
    metrics: Metrics,
}

impl RemoteLeases {
    pub fn new(
        channel: WithToken<Channel>,
        metrics: Metrics,
        grpc_metrics: &poolgate_runtime::grpc_metrics::GrpcMetrics,
    ) -> Self {
        RemoteLeases {
            client: AdmissionClient::new(traced(channel, grpc_metrics)),
            metrics,
        }
    }
}

fn acquire_pb(terms: &LeaseTerms, wait: Duration) -> apb::Acquire {
    apb::Acquire {
        account_id: terms.account_id,
        concurrency_limit: terms.concurrency_limit,
        rpm_limit: terms.rpm_limit,
        user_id: terms.user.as_ref().map(|u| u.user_id.clone()),
        user_rpm_limit: terms.user.as_ref().map(|u| u.rpm_limit).unwrap_or(0),
        session_hash: terms.session_hash.clone(),
        session_window_limit_usd: micros_to_usd(terms.session_window_limit_micros),
        session_bound: terms.session_bound,
        wait_ms: wait.as_millis().min(600_000) as u32,
    }
}

fn deny_reason(reason: i32) -> DenyReason {
    match apb::DenyReason::try_from(reason) {
        Ok(apb::DenyReason::Rpm) => DenyReason::Rpm,
        Ok(apb::DenyReason::UserRpm) => DenyReason::UserRpm,
        Ok(apb::DenyReason::SessionWindow) => DenyReason::SessionWindow,
        Ok(apb::DenyReason::Cooling) => DenyReason::Cooling,
        Ok(apb::DenyReason::QueueFull) => DenyReason::QueueFull,
        Ok(apb::DenyReason::BackendUnavailable) => DenyReason::BackendUnavailable,
        Ok(apb::DenyReason::LeaseUnknown) => DenyReason::LeaseUnknown,
        _ => DenyReason::Concurrency,
    }
}

fn message(kind: apb::lease_request::Kind) -> apb::LeaseRequest {
    apb::LeaseRequest { kind: Some(kind) }
}

type Events = tonic::Streaming<apb::LeaseEvent>;

/// Opens a lease stream whose first message is `first`.
async fn start(
    client: &AdmissionClient<Traced>,
    first: apb::lease_request::Kind,
) -> Result<(mpsc::Sender<apb::LeaseRequest>, Events), tonic::Status> {
    let (sender, receiver) = mpsc::channel(8);
    sender
        .send(message(first))
        .await
        .map_err(|_| tonic::Status::internal("lease stream closed"))?;
    let events = client
        .clone()
        .lease(ReceiverStream::new(receiver))
        .await?
        .into_inner();
    Ok((sender, events))
}

/// Reads a lease stream until the answer to its first message (`Queued` events skipped).
async fn answer(events: &mut Events) -> Result<Result<apb::Granted, Denial>, tonic::Status> {
    loop {
        match events.next().await {
            Some(Ok(apb::LeaseEvent {
                kind: Some(apb::lease_event::Kind::Queued(_)),
            })) => continue,
            Some(Ok(apb::LeaseEvent {
                kind: Some(apb::lease_event::Kind::Granted(granted)),
            })) => return Ok(Ok(granted)),
            Some(Ok(apb::LeaseEvent {
                kind: Some(apb::lease_event::Kind::Denied(denied)),
            })) => {
                return Ok(Err(Denial::new(
                    deny_reason(denied.reason),
                    denied.retry_after_ms,
                )));
            }
            // The answer to a `Resume` of a released lease: it is gone for good.
            Some(Ok(apb::LeaseEvent {
                kind: Some(apb::lease_event::Kind::Lost(_)),
            })) => return Ok(Err(Denial::new(DenyReason::LeaseUnknown, 0))),
            Some(Ok(_)) => return Err(tonic::Status::internal("unexpected lease event")),
            Some(Err(status)) => return Err(status),
            None => {
                return Err(tonic::Status::unavailable(
                    "lease stream ended without an answer",
                ));
            }
        }
    }
}

/// Opens a lease stream with `first` and reads until the answer.
async fn open(
    client: &AdmissionClient<Traced>,
    first: apb::lease_request::Kind,
) -> Result<
    (
        mpsc::Sender<apb::LeaseRequest>,
        Events,
        Result<apb::Granted, Denial>,
    ),
    BackendError,
> {
    let (sender, mut events) = start(client, first).await.map_err(backend)?;
    let answer = answer(&mut events).await.map_err(backend)?;
    Ok((sender, events, answer))
}

#[async_trait]
impl Leases for RemoteLeases {
    async fn acquire(&self, terms: LeaseTerms, wait: Duration) -> Result<Acquired, BackendError> {
        let (reply, answer) = oneshot::channel();
        // In the request's span, so the lease call carries its trace context.
        tokio::spawn(tracing::Instrument::instrument(
            acquire_task(
                self.client.clone(),
                self.metrics.clone(),
                terms,
                wait,
                reply,
            ),
            tracing::Span::current(),
        ));
        answer
            .await
            .unwrap_or_else(|_| Err(BackendError("lease task ended".into())))
    }
}

/// How long an acquire whose call breaks before its answer (a replica died or is unreachable)
/// is tried again: long enough for the balancer to drop a dead replica (`PROBE_EVERY`).
const ACQUIRE_RETRY_FOR: Duration = Duration::from_secs(2);

/// A call that broke in transport, or a replica that could not reach its backend: another
/// replica may answer. (A lease the broken call may have been granted is reaped at its TTL.)
fn worth_another_replica(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::Internal
    )
}

/// One acquire, on its own task so that a caller that goes away (the client left) never strands
/// a lease: a waiting acquire is withdrawn, and a grant that raced the departure is released at
/// once instead of waiting out the orphan grace. A call that breaks before its answer is tried
/// again, on whichever replica the balanced channel picks, within the caller's wait.
async fn acquire_task(
    client: AdmissionClient<Traced>,
    metrics: Metrics,
    terms: LeaseTerms,
    wait: Duration,
    mut reply: oneshot::Sender<Result<Acquired, BackendError>>,
) {
    let started = tokio::time::Instant::now();
    let deadline = started + wait;
    let mut tries = 0u64;
    loop {
        tries += 1;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        // Not raced with the caller's departure: once sent, the acquire must be answered (and
        // a grant released), or the lease would be left to the orphan grace.
        let first = apb::lease_request::Kind::Acquire(acquire_pb(&terms, left));
        let status = match start(&client, first).await {
            Err(status) => status,
            Ok((sender, mut events)) => {
                let answer = tokio::select! {
                    answer = answer(&mut events) => Some(answer),
                    _ = reply.closed() => None,
                };
                let Some(answer) = answer else {
                    withdraw(&sender, &mut events).await;
                    return;
                };
                match answer {
                    Ok(Ok(granted)) => {
                        let (commands, receiver) = mpsc::channel(4);
                        let (lost, lost_signal) = tokio::sync::watch::channel(false);
                        let keeper = Keeper {
                            client: client.clone(),
                            terms,
                            lease_id: granted.lease_id,
                            ttl: Duration::from_millis(u64::from(granted.ttl_ms.max(300))),
                            metrics,
                            lost,
                        };
                        tokio::spawn(keeper.run(sender, events, receiver));
                        // A caller that left just now drops the lease with the unsent reply;
                        // the keeper sees its commands end and releases.
                        let _ = reply.send(Ok(Acquired::Granted(Box::new(RemoteLease {
                            commands: Some(commands),
                            lost: lost_signal,
                        }))));
                        return;
                    }
                    Ok(Err(denial)) => {
                        let _ = reply.send(Ok(Acquired::Denied(denial)));
                        return;
                    }
                    Err(status) => status,
                }
            }
        };
        if started.elapsed() < ACQUIRE_RETRY_FOR
            && worth_another_replica(&status)
            && !reply.is_closed()
        {
            tracing::debug!(code = ?status.code(), tries, "lease call broke before its answer; trying again");
            tokio::time::sleep(Duration::from_millis((50 * tries).min(250))).await;
            continue;
        }
        let _ = reply.send(Err(backend(status)));
        return;
    }
}

/// Withdraws an unanswered acquire (`Release` before the answer): admission cancels the wait or
/// releases what it granted meanwhile, and answers `Released`.
async fn withdraw(sender: &mpsc::Sender<apb::LeaseRequest>, events: &mut Events) {
    let release = apb::lease_request::Kind::Release(apb::Release { spend_usd: 0.0 });
    if sender.send(message(release)).await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(event)) = events.next().await {
            if matches!(
                event.kind,
                Some(apb::lease_event::Kind::Released(_)) | Some(apb::lease_event::Kind::Denied(_))
            ) {
                return;
            }
        }
    })
    .await;
}

enum Command {
    Attempt(oneshot::Sender<bool>),
    Release(f64, oneshot::Sender<()>),
}

/// Owns one lease stream: heartbeats, attempts, release, and resume when it breaks.
struct Keeper {
    client: AdmissionClient<Traced>,
    terms: LeaseTerms,
    lease_id: String,
    ttl: Duration,
    metrics: Metrics,
    /// Set when the lease is gone for good (see `Lease::lost`).
    lost: tokio::sync::watch::Sender<bool>,
}

impl Keeper {
    async fn run(
        self,
        sender: mpsc::Sender<apb::LeaseRequest>,
        events: Events,
        mut commands: mpsc::Receiver<Command>,
    ) {
        let mut stream = Some((sender, events));
        let mut heartbeat = tokio::time::interval(self.ttl / 3);
        heartbeat.tick().await;
        loop {
            let Some((sender, events)) = stream.as_mut() else {
                // No stream: the lease is lost; serve commands so the request finishes anyway.
                match commands.recv().await {
                    Some(Command::Attempt(reply)) => {
                        let _ = reply.send(true);
                    }
                    Some(Command::Release(spend, reply)) => {
                        // No stream carried this release: the unary one keeps the spend.
                        let _ = self
                            .client
                            .clone()
                            .release(apb::ReleaseRequest {
                                lease_id: self.lease_id.clone(),
                                spend_usd: spend_usd(spend),
                            })
                            .await;
                        let _ = reply.send(());
                        return;
                    }
                    None => return,
                }
                continue;
            };
            tokio::select! {
                _ = heartbeat.tick() => {
                    if sender.send(message(apb::lease_request::Kind::Heartbeat(apb::Heartbeat {}))).await.is_err() {
                        stream = self.resume().await;
                    }
                }
                event = events.next() => match event {
                    Some(Ok(apb::LeaseEvent { kind: Some(apb::lease_event::Kind::Renewed(_)) })) => {}
                    Some(Ok(apb::LeaseEvent { kind: Some(apb::lease_event::Kind::Lost(lost)) })) => {
                        stream = self.lost(lost.lost_reason()).await;
                    }
                    Some(Err(_)) | None => {
                        stream = self.resume().await;
                    }
                    Some(Ok(_)) => {}
                },
                command = commands.recv() => {
                    let (kind, reply) = match command {
                        Some(Command::Attempt(reply)) => (apb::lease_request::Kind::Attempt(apb::Attempt {}), Reply::Attempt(reply)),
                        Some(Command::Release(spend, reply)) => (
                            apb::lease_request::Kind::Release(apb::Release { spend_usd: spend_usd(spend) }),
                            Reply::Release(reply, spend_usd(spend)),
                        ),
                        // The holder dropped the lease without releasing: release it now.
                        None => (apb::lease_request::Kind::Release(apb::Release { spend_usd: 0.0 }), Reply::Dropped),
                    };
                    let sent = sender.send(message(kind)).await.is_ok();
                    let answer = if sent { self.await_answer(events).await } else { None };
                    match reply {
                        Reply::Attempt(reply) => {
                            // Unknown (stream trouble) counts as accepted: the request goes on.
                            let _ = reply.send(!matches!(answer, Some(Answer::Refused)));
                            if let Some(Answer::Lost(reason)) = answer {
                                stream = self.lost(reason).await;
                            }
                        }
                        Reply::Release(reply, spend) => {
                            if !matches!(answer, Some(Answer::Accepted)) {
                                // A release that went out on the stream without an answer may
                                // have landed with its spend; one that never went out, or that
                                // the stream's `Lost` overtook, did not: the unary one carries it.
                                let landed_maybe = sent && answer.is_none();
                                let spend_usd = if landed_maybe { 0.0 } else { spend };
                                let _ = self.client.clone().release(apb::ReleaseRequest { lease_id: self.lease_id.clone(), spend_usd }).await;
                            }
                            let _ = reply.send(());
                            return;
                        }
                        Reply::Dropped => {
                            if !matches!(answer, Some(Answer::Accepted)) {
                                let _ = self.client.clone().release(apb::ReleaseRequest { lease_id: self.lease_id.clone(), spend_usd: 0.0 }).await;
                            }
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Reads events until the answer to the last command (heartbeat answers are skipped).
    async fn await_answer(&self, events: &mut Events) -> Option<Answer> {
        loop {
            match tokio::time::timeout(Duration::from_secs(5), events.next()).await {
                Ok(Some(Ok(apb::LeaseEvent { kind: Some(kind) }))) => match kind {
                    apb::lease_event::Kind::Renewed(_)
                    | apb::lease_event::Kind::NotRenewed(_)
                    | apb::lease_event::Kind::Queued(_) => {
                        continue;
                    }
                    apb::lease_event::Kind::AttemptAccepted(_)
                    | apb::lease_event::Kind::Released(_) => return Some(Answer::Accepted),
                    apb::lease_event::Kind::Denied(_) => return Some(Answer::Refused),
                    apb::lease_event::Kind::Lost(lost) => {
                        return Some(Answer::Lost(lost.lost_reason()));
                    }
                    _ => return None,
                },
                _ => return None,
            }
        }
    }

    /// Admission answered `Lost`. A released lease, or one the backend lost with no room left
    /// for it, is not resumed (resuming would take a slot that went to someone else); the
    /// request finishes anyway. A backend outage is resumed elsewhere.
    async fn lost(
        &self,
        reason: apb::LostReason,
    ) -> Option<(mpsc::Sender<apb::LeaseRequest>, Events)> {
        let label = match reason {
            apb::LostReason::Released => "released",
            apb::LostReason::NoRoom => "no_room",
            apb::LostReason::Expired => "expired",
            // An older admission sends no reason: it only ever meant an outage.
            apb::LostReason::BackendUnavailable | apb::LostReason::Unspecified => {
                return self.resume().await;
            }
        };
        tracing::warn!(lease_id = %self.lease_id, reason = label, "lease lost; not resumed");
        self.metrics.leases_lost.with_label_values(&[label]).inc();
        self.lost.send_replace(true);
        None
    }

    /// Resumes the lease on any admission replica within the orphan grace; `None` when it cannot
    /// (the upstream call finishes anyway, counted in a metric). A released lease answers the
    /// resume with `Lost` (read as a refusal by `answer`).
    async fn resume(&self) -> Option<(mpsc::Sender<apb::LeaseRequest>, Events)> {
        // Within half the ttl: the lease outlives its broken stream by the orphan grace (or the
        // ttl since the last heartbeat); a replica that just died takes a moment to be skipped.
        let give_up = tokio::time::Instant::now() + self.ttl / 2;
        let mut attempt = 0u64;
        while tokio::time::Instant::now() < give_up {
            attempt += 1;
            let resume = apb::lease_request::Kind::Resume(apb::Resume {
                lease_id: self.lease_id.clone(),
                terms: Some(acquire_pb(&self.terms, Duration::ZERO)),
            });
            match open(&self.client, resume).await {
                Ok((sender, events, Ok(_))) => {
                    tracing::info!(lease_id = %self.lease_id, "lease resumed after its stream broke");
                    self.metrics.leases_resumed.inc();
                    return Some((sender, events));
                }
                Ok((_, _, Err(_))) => break,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis((100 * attempt).min(1000))).await
                }
            }
        }
        tracing::warn!(lease_id = %self.lease_id, "lease lost: stream broke and could not be resumed");
        self.metrics
            .leases_lost
            .with_label_values(&["not_resumed"])
            .inc();
        self.lost.send_replace(true);
        None
    }
}

enum Reply {
    Attempt(oneshot::Sender<bool>),
    /// With the spend, for a unary release if the stream one got no answer.
    Release(oneshot::Sender<()>, f64),
    Dropped,
}

/// A spend admission accepts: finite and >= 0.
fn spend_usd(spend: f64) -> f64 {
    if spend.is_finite() {
        spend.max(0.0)
    } else {
        0.0
    }
}

enum Answer {
    Accepted,
    Refused,
    /// The stream ended with `Lost` before the command's answer (the command was not served).
    Lost(apb::LostReason),
}

struct RemoteLease {
    commands: Option<mpsc::Sender<Command>>,
    lost: tokio::sync::watch::Receiver<bool>,
}

#[async_trait]
impl Lease for RemoteLease {
    async fn attempt(&mut self) -> bool {
        let Some(commands) = &self.commands else {
            return false;
        };
        let (reply, answer) = oneshot::channel();
        if commands.send(Command::Attempt(reply)).await.is_err() {
            return true;
        }
        answer.await.unwrap_or(true)
    }

    fn lost(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        Some(self.lost.clone())
    }

    async fn release(mut self: Box<Self>, spend_usd: f64) {
        if let Some(commands) = self.commands.take() {
            let (reply, done) = oneshot::channel();
            if commands
                .send(Command::Release(spend_usd, reply))
                .await
                .is_ok()
            {
                let _ = done.await;
            }
        }
    }
}

/// How the relay reaches and authenticates to the selector and admission.
#[derive(Debug, Clone, Default)]
pub struct GrpcClient {
    /// PEM CA of their certificates (for `https://` endpoints).
    pub tls_ca: Option<Vec<u8>>,
    /// PEM client certificate and key, for servers that require mutual TLS.
    pub tls_identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Sent in `x-poolgate-service-token` on every call.
    pub service_token: Option<String>,
}

/// Shared by both backends' constructors.
pub fn remote_backends(
    selector: &[String],
    admission: &[String],
    client: &GrpcClient,
    metrics: Metrics,
) -> Result<Backends, String> {
    let grpc_metrics = poolgate_runtime::grpc_metrics::GrpcMetrics::client(&metrics.registry);
    let token = client.service_token.as_deref();
    let selection = RemoteSelection::new(
        WithToken::new(
            balanced_channel(selector, client).map_err(|e| format!("--selector-url: {e}"))?,
            token,
        ),
        &grpc_metrics,
        metrics.usage_lost.clone(),
    );
    let leases = RemoteLeases::new(
        WithToken::new(
            balanced_channel(admission, client).map_err(|e| format!("--admission-url: {e}"))?,
            token,
        ),
        metrics,
        &grpc_metrics,
    );
    Ok((Arc::new(selection), Arc::new(leases)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_throttled_warning_passes_once_per_period_and_counts_the_rest() {
        let throttle = Throttle::new(Duration::from_millis(50));
        assert_eq!(throttle.allow(), Some(0));
        assert_eq!(throttle.allow(), None);
        assert_eq!(throttle.allow(), None);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(throttle.allow(), Some(2), "the two held back are reported");
        assert_eq!(throttle.allow(), None);
    }
}
