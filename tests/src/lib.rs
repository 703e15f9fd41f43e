//! poolgate's test harness: private Redis servers (one node or a 3-master cluster) on free
//! loopback ports, owned by the test that started them and stopped when dropped, and a bounded
//! `eventually` wait instead of fixed sleeps.
//!
//! Each test owns its servers, so a test that stops Redis or counts its commands never disturbs
//! another. Binaries come from `PATH` (or `REDIS_SERVER` / `REDIS_CLI`); `bash .ci/run` installs
//! them on a fresh machine.

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A harness failure: what was being started and why it failed.
pub type HarnessResult<T> = Result<T, String>;

/// Waits until `check` returns `Some`, polling every 20 ms, for at most `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, mut check: F) -> HarnessResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(format!("condition not met within {timeout:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A free loopback port (bound and released; good enough for tests on one machine).
pub fn free_port() -> HarnessResult<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("local_addr: {e}"))
}

fn binary(env: &str, name: &str) -> PathBuf {
    std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(name))
}

static SCRATCH: AtomicU32 = AtomicU32::new(0);

/// A fresh scratch directory under the system temp dir, removed by [`Scratch`]'s drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(label: &str) -> HarnessResult<Self> {
        let n = SCRATCH.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("poolgate-{label}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        Ok(Scratch(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One private `redis-server` process (no persistence), killed on drop.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    scratch: Scratch,
    extra_args: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    pub async fn start() -> HarnessResult<Self> {
        Self::start_with(&[]).await
    }

    pub async fn start_with(extra_args: &[&str]) -> HarnessResult<Self> {
        let mut last_error = String::new();
        // A port taken between `free_port` and the bind is retried with another.
        for _ in 0..5 {
            let port = free_port()?;
            let mut server = RedisServer {
                port,
                child: None,
                scratch: Scratch::new("redis")?,
                extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            };
            match server.spawn().await {
                Ok(()) => return Ok(server),
                Err(error) => last_error = error,
            }
        }
        Err(format!("redis-server did not start: {last_error}"))
    }

    async fn spawn(&mut self) -> HarnessResult<()> {
        let child = Command::new(binary("REDIS_SERVER", "redis-server"))
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no"])
            .arg("--dir")
            .arg(self.scratch.path())
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("spawn redis-server (is it installed? run `bash .ci/run`): {e}")
            })?;
        self.child = Some(child);
        let url = self.url();
        let ready = eventually(Duration::from_secs(10), || {
            let url = url.clone();
            async move { ping(&url).await.then_some(()) }
        })
        .await;
        if ready.is_err() {
            self.kill();
            if let Some(mut child) = self.child.take() {
                let _ = child.wait();
            }
            return Err(format!("redis on port {} did not answer PING", self.port));
        }
        Ok(())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Stops the server at once (SIGKILL: no persistence, nothing survives).
    pub fn kill(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.child = None;
    }

    /// Starts the server again on the same port, empty.
    pub async fn restart(&mut self) -> HarnessResult<()> {
        self.kill();
        self.spawn().await
    }

    /// A plain client connection, for the test's own reads.
    pub async fn client(&self) -> HarnessResult<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("connect {}: {e}", self.url()))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn ping(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(Ok(mut conn)) = tokio::time::timeout(
        Duration::from_millis(500),
        client.get_multiplexed_async_connection(),
    )
    .await
    else {
        return false;
    };
    matches!(
        redis::cmd("PING").query_async::<String>(&mut conn).await,
        Ok(pong) if pong == "PONG"
    )
}

/// A 3-master Redis Cluster on loopback, killed on drop.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub async fn start() -> HarnessResult<Self> {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let node = RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "2000",
            ])
            .await?;
            nodes.push(node);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new(binary("REDIS_CLI", "redis-cli"))
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("spawn redis-cli: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&output.stdout)
            ));
        }
        let cluster = RedisCluster { nodes };
        for url in cluster.node_urls() {
            eventually(Duration::from_secs(20), || {
                let url = url.clone();
                async move { cluster_ok(&url).await.then_some(()) }
            })
            .await
            .map_err(|e| format!("cluster_state never became ok: {e}"))?;
        }
        Ok(cluster)
    }

    /// `redis+cluster://h1:p1,h2:p2,h3:p3`
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    pub fn node_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

async fn cluster_ok(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return false;
    };
    match redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async::<String>(&mut conn)
        .await
    {
        Ok(info) => info.contains("cluster_state:ok"),
        Err(_) => false,
    }
}
