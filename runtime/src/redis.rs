//! Redis connections for poolgate services: a bb8 pool of multiplexed connections for one node,
//! or the redis crate's cluster client for a Redis Cluster (bb8-redis has no cluster manager).
//!
//! Every request goes through [`Conn`], which counts round trips (a command, a pipeline or a
//! script is one trip; `INFO commandstats` would count the commands inside scripts instead) and
//! marks a connection broken on I/O errors so the pool replaces it instead of handing it out
//! again after Redis restarts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bb8_redis::RedisConnectionManager;
use prometheus::IntCounter;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use crate::error::StateError;

/// How to reach Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    Single(String),
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// `redis://host:port` is one node; `redis+cluster://h1:p1,h2:p2` or a comma-separated list of
    /// `redis://` URLs is a cluster.
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        if let Some(rest) = url.strip_prefix("redis+cluster://") {
            let (auth, hosts) = match rest.rsplit_once('@') {
                Some((auth, hosts)) => (format!("{auth}@"), hosts),
                None => (String::new(), rest),
            };
            let nodes: Vec<String> = hosts
                .split(',')
                .filter(|h| !h.trim().is_empty())
                .map(|h| format!("redis://{auth}{}", h.trim()))
                .collect();
            if nodes.is_empty() {
                return Err("redis+cluster:// needs at least one host:port".into());
            }
            return Ok(RedisTarget::Cluster(nodes));
        }
        let mut nodes: Vec<String> = url
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        for node in &nodes {
            if !(node.starts_with("redis://")
                || node.starts_with("rediss://")
                || node.starts_with("unix://"))
            {
                return Err(
                    "a Redis URL must start with redis://, rediss://, unix:// or redis+cluster://"
                        .into(),
                );
            }
        }
        match nodes.len() {
            0 => Err("the Redis URL is empty".into()),
            1 => Ok(RedisTarget::Single(nodes.swap_remove(0))),
            _ => Ok(RedisTarget::Cluster(nodes)),
        }
    }
}

/// Pool settings.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Bound on every Redis operation (and on taking a connection from the pool).
    pub timeout: Duration,
    /// Connections in the single-node pool (each multiplexed: shared by many callers).
    pub pool_size: u32,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            timeout: Duration::from_millis(1000),
            pool_size: 4,
        }
    }
}

/// A multiplexed connection with a flag the pool reads when the connection comes back, and the
/// failure generation it was made in.
pub struct TrackedConnection {
    connection: MultiplexedConnection,
    broken: AtomicBool,
    generation: u64,
    failures: Arc<AtomicU64>,
}

/// bb8-redis's manager, plus broken-connection detection (its own `has_broken` always says no,
/// so a connection to a restarted Redis would stay in the pool forever). An I/O error on any
/// connection starts a new failure generation: every pooled connection made before it is
/// dropped at its next checkout instead of failing one more request each.
struct TrackingManager {
    inner: RedisConnectionManager,
    failures: Arc<AtomicU64>,
}

impl bb8::ManageConnection for TrackingManager {
    type Connection = TrackedConnection;
    type Error = RedisError;

    async fn connect(&self) -> Result<Self::Connection, Self::Error> {
        let generation = self.failures.load(Ordering::Relaxed);
        Ok(TrackedConnection {
            connection: self.inner.connect().await?,
            broken: AtomicBool::new(false),
            generation,
            failures: self.failures.clone(),
        })
    }

    async fn is_valid(&self, conn: &mut Self::Connection) -> Result<(), Self::Error> {
        self.inner.is_valid(&mut conn.connection).await
    }

    fn has_broken(&self, conn: &mut Self::Connection) -> bool {
        conn.broken.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
enum Backend {
    Single(bb8::Pool<TrackingManager>),
    Cluster(ClusterConnection),
}

/// A cheap-to-clone handle on Redis (one node or a cluster), with a round-trip counter.
#[derive(Clone)]
pub struct RedisHandle {
    backend: Backend,
    /// Shared with the service's metrics (`*_redis_round_trips_total`).
    round_trips: IntCounter,
    timeout: Duration,
    /// Until when (ms since the handle was made) Redis counts as unreachable: after a failed
    /// connect, callers fail fast for a moment instead of each waiting out the connect timeout.
    unreachable_until: Arc<AtomicU64>,
    epoch: std::time::Instant,
}

/// How long a failed connect makes callers fail fast before the next one tries again.
const FAIL_FAST: Duration = Duration::from_millis(1000);

impl RedisHandle {
    /// Connects lazily for a single node (the service starts while Redis is down); a cluster
    /// needs its topology, so it is read now. Every round trip (a command, a script or a
    /// pipeline) counts one in `round_trips`.
    pub async fn connect(
        target: &RedisTarget,
        options: &RedisOptions,
        round_trips: IntCounter,
    ) -> Result<Self, StateError> {
        let backend = match target {
            RedisTarget::Single(url) => {
                let manager = RedisConnectionManager::new(url.as_str())
                    .map_err(|e| StateError::Failed(format!("bad redis url: {:?}", e.kind())))?;
                let pool = bb8::Pool::builder()
                    .max_size(options.pool_size.max(1))
                    .connection_timeout(options.timeout)
                    .test_on_check_out(false)
                    .build_unchecked(TrackingManager {
                        inner: manager,
                        failures: Arc::new(AtomicU64::new(0)),
                    });
                Backend::Single(pool)
            }
            RedisTarget::Cluster(nodes) => {
                let client =
                    redis::cluster::ClusterClient::builder(nodes.iter().map(String::as_str))
                        .connection_timeout(options.timeout)
                        .response_timeout(options.timeout)
                        .retries(2)
                        .build()
                        .map_err(StateError::from)?;
                let connection =
                    tokio::time::timeout(options.timeout * 3, client.get_async_connection())
                        .await
                        .map_err(|_| StateError::Timeout)?
                        .map_err(StateError::from)?;
                Backend::Cluster(connection)
            }
        };
        Ok(RedisHandle {
            backend,
            round_trips,
            unreachable_until: Arc::new(AtomicU64::new(0)),
            epoch: std::time::Instant::now(),
            timeout: options.timeout,
        })
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.backend, Backend::Cluster(_))
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Round trips made through this handle (and its clones) so far.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.get()
    }

    /// Takes a connection for one operation (bounded by the pool's connection timeout).
    ///
    /// A multiplexed connection serves many callers at once, so the pool only hands out a
    /// *clone* and gets its entry back at once: callers never queue behind each other for a
    /// pool slot, and the pool still replaces connections that broke (see [`TrackingManager`]).
    pub async fn conn(&self) -> Result<Conn, StateError> {
        let inner = match &self.backend {
            Backend::Single(pool) => {
                let mut tries = pool.state().connections + 1;
                loop {
                    let now = self.epoch.elapsed().as_millis() as u64;
                    if now < self.unreachable_until.load(Ordering::Relaxed) {
                        return Err(StateError::Failed(
                            "redis unreachable (a connect failed just now)".into(),
                        ));
                    }
                    let pooled = pool.get().await.map_err(|e| {
                        let until =
                            self.epoch.elapsed().as_millis() as u64 + FAIL_FAST.as_millis() as u64;
                        self.unreachable_until.store(until, Ordering::Relaxed);
                        match e {
                            bb8::RunError::User(e) => StateError::from(e),
                            bb8::RunError::TimedOut => {
                                StateError::Failed("no redis connection in time".into())
                            }
                        }
                    })?;
                    let stale = pooled.generation < pooled.failures.load(Ordering::Relaxed);
                    if stale && tries > 0 {
                        // Dropped by the pool when this guard returns it.
                        pooled.broken.store(true, Ordering::Relaxed);
                        tries -= 1;
                        continue;
                    }
                    break ConnInner::Single {
                        connection: pooled.connection.clone(),
                        generation: pooled.generation,
                        failures: pooled.failures.clone(),
                    };
                }
            }
            Backend::Cluster(cluster) => ConnInner::Cluster(cluster.clone()),
        };
        Ok(Conn {
            inner,
            round_trips: self.round_trips.clone(),
        })
    }

    /// Bounds one Redis operation by the handle's timeout and translates its error.
    pub async fn bounded<T>(
        &self,
        operation: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StateError> {
        tokio::time::timeout(self.timeout, operation)
            .await
            .map_err(|_| StateError::Timeout)?
            .map_err(StateError::from)
    }
}

enum ConnInner {
    Single {
        connection: MultiplexedConnection,
        generation: u64,
        failures: Arc<AtomicU64>,
    },
    Cluster(ClusterConnection),
}

/// One connection, held for one operation. Implements the redis crate's `ConnectionLike`, so
/// commands, pipelines and scripts run on it as usual.
pub struct Conn {
    inner: ConnInner,
    round_trips: IntCounter,
}

impl Conn {
    fn note_result<T>(&self, result: &Result<T, RedisError>) {
        if let (
            ConnInner::Single {
                generation,
                failures,
                ..
            },
            Err(error),
        ) = (&self.inner, result)
            && (error.is_io_error()
                || error.is_connection_dropped()
                || error.is_unrecoverable_error())
        {
            // Every connection made before this failure is suspect: replaced at next checkout.
            failures.fetch_max(generation + 1, Ordering::Relaxed);
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.round_trips.inc();
        Box::pin(async move {
            let result = match &mut self.inner {
                ConnInner::Single { connection, .. } => connection.req_packed_command(cmd).await,
                ConnInner::Cluster(conn) => conn.req_packed_command(cmd).await,
            };
            self.note_result(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.round_trips.inc();
        Box::pin(async move {
            let result = match &mut self.inner {
                ConnInner::Single { connection, .. } => {
                    connection
                        .req_packed_commands(pipeline, offset, count)
                        .await
                }
                ConnInner::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count).await,
            };
            self.note_result(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            ConnInner::Single { connection, .. } => connection.get_db(),
            ConnInner::Cluster(conn) => conn.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_and_cluster_targets() {
        assert_eq!(
            RedisTarget::parse("redis://127.0.0.1:6379"),
            Ok(RedisTarget::Single("redis://127.0.0.1:6379".into()))
        );
        assert_eq!(
            RedisTarget::parse("redis+cluster://:pw@a:1,b:2"),
            Ok(RedisTarget::Cluster(vec![
                "redis://:pw@a:1".into(),
                "redis://:pw@b:2".into()
            ]))
        );
        assert_eq!(
            RedisTarget::parse("redis://a:1, redis://b:2"),
            Ok(RedisTarget::Cluster(vec![
                "redis://a:1".into(),
                "redis://b:2".into()
            ]))
        );
        assert!(RedisTarget::parse("http://a").is_err());
        assert!(RedisTarget::parse("").is_err());
        assert!(RedisTarget::parse("redis+cluster://").is_err());
    }
}
