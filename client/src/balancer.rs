//! A gRPC channel balanced over every replica of an endpoint: DNS names resolved again every few
//! seconds, every replica probed each second, TLS and client identity from [`GrpcClient`].

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tonic::transport::channel::Change;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// An endpoint list the relay cannot use (a configuration mistake).
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("no endpoints")]
    NoEndpoints,
    #[error("bad endpoint {url:?}: {reason}")]
    BadEndpoint { url: String, reason: String },
    #[error("tls for {url:?}: {reason}")]
    Tls { url: String, reason: String },
    #[error("balancer queue full")]
    QueueFull,
}

fn endpoint(url: &str, tls: Option<&ClientTlsConfig>) -> Result<Endpoint, ChannelError> {
    let mut endpoint =
        Endpoint::from_shared(url.to_owned()).map_err(|e| ChannelError::BadEndpoint {
            url: url.to_owned(),
            reason: e.to_string(),
        })?;
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls.clone())
            .map_err(|e| ChannelError::Tls {
                url: url.to_owned(),
                reason: e.to_string(),
            })?;
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
pub fn balanced_channel(
    endpoints: &[String],
    client: &GrpcClient,
) -> Result<Channel, ChannelError> {
    balanced_channel_with_replicas(endpoints, client).map(|(channel, _)| channel)
}

/// The replicas a balanced channel spreads over, by key (`scheme://address`), as its watchers
/// keep them: the lease channels open their own connection to each.
pub type ReplicaSet = watch::Receiver<BTreeMap<String, Endpoint>>;

/// [`balanced_channel`], and the replicas it balances over.
pub fn balanced_channel_with_replicas(
    endpoints: &[String],
    client: &GrpcClient,
) -> Result<(Channel, ReplicaSet), ChannelError> {
    if endpoints.is_empty() {
        return Err(ChannelError::NoEndpoints);
    }
    let (channel, changes) = Channel::balance_channel::<String>(64);
    let (published, replica_set) = watch::channel(BTreeMap::new());
    for url in endpoints {
        let bad = |reason: String| ChannelError::BadEndpoint {
            url: url.clone(),
            reason,
        };
        let uri: http::Uri = url.parse().map_err(|e| bad(format!("{e}")))?;
        let scheme = uri.scheme_str().unwrap_or("http").to_owned();
        let host = uri.host().ok_or_else(|| bad("no host".into()))?.to_owned();
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
                let tls = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(ca))
                    .domain_name(bare_host.clone());
                match &client.tls_identity {
                    Some((cert, key)) => tls.identity(Identity::from_pem(cert, key)),
                    None => tls,
                }
            });
        endpoint(url, tls.as_ref())?;
        let mut current = HashSet::new();
        if let Ok(ip) = bare_host.parse::<IpAddr>() {
            // Usable at once; the watcher takes it out if it does not answer.
            let address = SocketAddr::new(ip, port);
            let key = format!("{scheme}://{address}");
            let endpoint = endpoint(&key, tls.as_ref())?;
            changes
                .try_send(Change::Insert(key.clone(), endpoint.clone()))
                .map_err(|_| ChannelError::QueueFull)?;
            published.send_modify(|replicas| {
                replicas.insert(key, endpoint);
            });
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
            published.clone(),
        ));
    }
    Ok((channel, replica_set))
}

struct Replicas {
    scheme: String,
    host: String,
    port: u16,
    tls: Option<ClientTlsConfig>,
}

impl Replicas {
    fn key(&self, address: &SocketAddr) -> String {
        format!("{}://{address}", self.scheme)
    }

    async fn resolve(&self) -> std::io::Result<Vec<SocketAddr>> {
        if let Ok(ip) = self.host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, self.port)]);
        }
        Ok(tokio::net::lookup_host((self.host.as_str(), self.port))
            .await?
            .collect())
    }
}

async fn accepts_connections(address: SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await,
        Ok(Ok(_))
    )
}

/// Keeps the balancer's endpoints (and the published replica set) equal to the replicas that
/// resolve and accept connections (all that resolve when none does, so calls fail with an error
/// rather than wait for a replica).
async fn watch_replicas(
    replicas: Replicas,
    mut current: HashSet<SocketAddr>,
    changes: mpsc::Sender<Change<String, Endpoint>>,
    published: watch::Sender<BTreeMap<String, Endpoint>>,
) {
    let mut resolved: Vec<SocketAddr> = current.iter().copied().collect();
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
        let mut live = HashSet::new();
        while let Some(probe) = probes.join_next().await {
            if let Ok((address, true)) = probe {
                live.insert(address);
            }
        }
        let wanted: HashSet<SocketAddr> = if live.is_empty() {
            resolved.iter().copied().collect()
        } else {
            live
        };
        for gone in current.difference(&wanted) {
            let key = replicas.key(gone);
            published.send_modify(|published| {
                published.remove(&key);
            });
            if changes.send(Change::Remove(key)).await.is_err() {
                return;
            }
        }
        for new in wanted.difference(&current) {
            let key = replicas.key(new);
            if let Ok(endpoint) = endpoint(&key, replicas.tls.as_ref()) {
                published.send_modify(|published| {
                    published.insert(key.clone(), endpoint.clone());
                });
                if changes.send(Change::Insert(key, endpoint)).await.is_err() {
                    return;
                }
            }
        }
        if wanted != current {
            tracing::info!(host = %replicas.host, replicas = wanted.len(), "endpoint replicas changed");
        }
        current = wanted;
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

/// How the relay reaches and authenticates to the selector and admission.
#[derive(Debug, Clone)]
pub struct GrpcClient {
    /// PEM CA of their certificates (for `https://` endpoints).
    pub tls_ca: Option<Vec<u8>>,
    /// PEM client certificate and key, for servers that require mutual TLS.
    pub tls_identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Sent in `x-poolgate-service-token` on every call.
    pub service_token: Option<String>,
    /// Lease channels toward admission (`--lease-channels`); 0: one `Lease` stream per lease.
    pub lease_channels: usize,
}

/// The lease channels a relay opens toward admission unless told otherwise.
pub const DEFAULT_LEASE_CHANNELS: usize = 4;

impl Default for GrpcClient {
    fn default() -> Self {
        GrpcClient {
            tls_ca: None,
            tls_identity: None,
            service_token: None,
            lease_channels: DEFAULT_LEASE_CHANNELS,
        }
    }
}
