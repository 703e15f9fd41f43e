//! poolgate's test harness: private Redis servers (one node or a 3-master cluster) and Postgres
//! servers on free loopback ports, owned by the test that started them and stopped when dropped,
//! a bounded `eventually` wait instead of fixed sleeps, and the project's fake upstream LLM
//! server (`fake_upstream`; `mock-upstream` runs it as a process for demos and benches).
//!
//! Each test owns its servers, so a test that stops Redis or counts its commands never disturbs
//! another. Binaries come from `PATH` (or `REDIS_SERVER` / `REDIS_CLI`); `bash .ci/run` installs
//! them on a fresh machine.

pub mod fake_oauth;
pub mod fake_upstream;

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

/// How many of a flood of wrong admin tokens waited out the refusal delay, per flood: up to
/// three floods of `flood` concurrent `wrong` calls (each returns how long its refusal took),
/// with one `right` call during each, until a flood's count is in `expected`. A refusal
/// answered at once can still take the delay's length on a loaded machine and read as delayed,
/// so one flood may miscount; without a cap on delayed refusals every flood counts them all.
pub async fn delayed_per_flood<W, WF, R, RF>(
    flood: usize,
    delay: Duration,
    expected: std::ops::RangeInclusive<usize>,
    wrong: W,
    right: R,
) -> Vec<usize>
where
    W: Fn() -> WF,
    WF: Future<Output = Duration> + Send + 'static,
    R: Fn() -> RF,
    RF: Future<Output = ()>,
{
    let mut counts = Vec::new();
    for _ in 0..3 {
        let calls: Vec<_> = (0..flood).map(|_| tokio::spawn(wrong())).collect();
        tokio::time::sleep(delay / 5).await;
        right().await;
        let mut delayed = 0;
        for call in calls {
            // A call that failed its own checks fails the test here.
            if call.await.expect("a wrong-token call") >= delay {
                delayed += 1;
            }
        }
        counts.push(delayed);
        if expected.contains(&delayed) {
            break;
        }
        // Let this flood's delayed refusals leave the cap before the next.
        tokio::time::sleep(2 * delay).await;
    }
    counts
}

/// Ports this process has handed out: a port is handed out once, so two services one test
/// starts never get the same port (the kernel's own `bind(0)` may answer a released port again).
static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

/// The range free ports are drawn from: below the kernel's ephemeral range (32768–60999 on
/// Linux), so no outgoing connection's local port and no other `bind(0)` lands on a port a test
/// handed out before its service binds it; a Redis cluster node's bus port (port + 10 000) stays
/// below it too.
const FREE_PORTS: std::ops::Range<u16> = 15_000..22_000;

/// A free loopback port: drawn at random from [`FREE_PORTS`], never one this process handed out
/// before, and free when drawn (bound and released). Another process's test may draw it in the
/// moment before its service binds; the range's size makes that rare, and the harness's own
/// servers retry with another port.
pub fn free_port() -> HarnessResult<u16> {
    let mut handed_out = HANDED_OUT
        .lock()
        .map_err(|_| "the port book is poisoned".to_owned())?;
    for _ in 0..1_000 {
        let port = fastrand::u16(FREE_PORTS);
        if handed_out.contains(&port) {
            continue;
        }
        // The bus port of a Redis cluster node must be free as well.
        let bus = port + 10_000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", bus)).is_ok()
        {
            handed_out.push(port);
            return Ok(port);
        }
    }
    Err(format!("no free port in {FREE_PORTS:?}"))
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

/// One private `redis-server` process (no persistence unless `stop_keeping_data` asks for it),
/// killed on drop.
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

    /// Stops the server as a restart with persistence does: it saves its data (`SHUTDOWN
    /// SAVE`) and exits. `start_again` brings it back on the same port with that data, so what
    /// a client could not write while it was down is not hidden by an empty server.
    pub async fn stop_keeping_data(&mut self) -> HarnessResult<()> {
        let mut conn = self.client().await?;
        // The server closes the connection as it exits: no reply is the expected answer.
        let _ = redis::cmd("SHUTDOWN")
            .arg("SAVE")
            .query_async::<String>(&mut conn)
            .await;
        if let Some(mut child) = self.child.take() {
            let exited = tokio::task::spawn_blocking(move || child.wait())
                .await
                .map_err(|e| format!("wait for redis-server: {e}"))?;
            exited.map_err(|e| format!("wait for redis-server: {e}"))?;
        }
        Ok(())
    }

    /// Starts a stopped server again on the same port, with the data it saved.
    pub async fn start_again(&mut self) -> HarnessResult<()> {
        if self.child.is_some() {
            return Err("redis-server is still running".into());
        }
        self.spawn().await
    }

    /// Starts the server again on the same port, empty.
    pub async fn restart(&mut self) -> HarnessResult<()> {
        self.kill();
        // Data an earlier `stop_keeping_data` saved would be loaded again.
        let _ = std::fs::remove_file(self.scratch.path().join("dump.rdb"));
        self.spawn().await
    }

    /// Drops every key (`FLUSHALL`): the data loss of an eviction or a restart, on a server
    /// that keeps running (connections survive).
    pub async fn flush(&self) -> HarnessResult<()> {
        let mut conn = self.client().await?;
        redis::cmd("FLUSHALL")
            .query_async::<String>(&mut conn)
            .await
            .map(|_| ())
            .map_err(|e| format!("flushall on {}: {e}", self.url()))
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

    /// Restarts master `n` empty (SIGKILL, then the same port and `nodes.conf`, so it comes back
    /// with its slots), and waits until the cluster is ok again.
    pub async fn restart_node(&mut self, n: usize) -> HarnessResult<()> {
        let node = self
            .nodes
            .get_mut(n)
            .ok_or_else(|| format!("no node {n}"))?;
        node.restart().await?;
        for url in self.node_urls() {
            eventually(Duration::from_secs(20), || {
                let url = url.clone();
                async move { cluster_ok(&url).await.then_some(()) }
            })
            .await
            .map_err(|e| format!("cluster_state never became ok again: {e}"))?;
        }
        Ok(())
    }

    /// Drops every key on every master (the cluster keeps its slots and connections).
    pub async fn flush(&self) -> HarnessResult<()> {
        for node in &self.nodes {
            node.flush().await?;
        }
        Ok(())
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

/// A private PostgreSQL server (a copy of a once-made `initdb` template), stopped on drop.
///
/// As root (CI), `initdb` and the server refuse to run, so both run as the `postgres` user
/// through `runuser`, in directories owned by it.
pub struct PostgresServer {
    port: u16,
    data: PathBuf,
    _scratch: Scratch,
}

/// One of PostgreSQL's programs (`pg_dump`, `pg_restore`, `psql`) from the server's bin directory.
pub fn pg_tool(name: &str) -> HarnessResult<PathBuf> {
    Ok(pg_bin()?.join(name))
}

fn pg_bin() -> HarnessResult<PathBuf> {
    if let Some(dir) = std::env::var_os("POOLGATE_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| {
            format!("no PostgreSQL under /usr/lib/postgresql (run `bash scripts/test.sh`): {e}")
        })?
        .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    found.sort();
    found
        .pop()
        .ok_or_else(|| "no initdb under /usr/lib/postgresql/*/bin".into())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs a PostgreSQL tool, as the `postgres` user when we are root.
fn pg_command(tool: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(tool);
        command
    } else {
        Command::new(tool)
    }
}

fn give_to_postgres(path: &Path) -> HarnessResult<()> {
    if !is_root() {
        return Ok(());
    }
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()
        .map_err(|e| format!("chown: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("chown {} failed", path.display()))
}

/// The `initdb` template, made once per machine and user (guarded by a lock file).
fn pg_template(bin: &Path) -> HarnessResult<PathBuf> {
    let root = std::env::temp_dir().join("poolgate-pg-template");
    let data = root.join("data");
    let done = root.join("ready");
    if done.exists() {
        return Ok(data);
    }
    std::fs::create_dir_all(&root).map_err(|e| format!("mkdir {}: {e}", root.display()))?;
    let lock = root.join("lock");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match std::fs::File::create_new(&lock) {
            Ok(_) => break,
            Err(_) if done.exists() => return Ok(data),
            Err(_) if Instant::now() > deadline => {
                let _ = std::fs::remove_file(&lock);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    let made = (|| {
        let _ = std::fs::remove_dir_all(&data);
        give_to_postgres(&root)?;
        let output = pg_command(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ])
            .output()
            .map_err(|e| format!("spawn initdb: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        std::fs::write(&done, b"").map_err(|e| format!("mark template ready: {e}"))
    })();
    let _ = std::fs::remove_file(&lock);
    made.map(|()| data)
}

impl PostgresServer {
    /// Starts a server on a free port; `url()` names its `postgres` database.
    pub async fn start() -> HarnessResult<Self> {
        let bin = pg_bin()?;
        let template = tokio::task::spawn_blocking({
            let bin = bin.clone();
            move || pg_template(&bin)
        })
        .await
        .map_err(|e| format!("template task: {e}"))??;
        let scratch = Scratch::new("pg")?;
        let data = scratch.path().join("data");
        let copied = Command::new("cp")
            .arg("-a")
            .arg(&template)
            .arg(&data)
            .status()
            .map_err(|e| format!("cp: {e}"))?;
        if !copied.success() {
            return Err("copying the postgres template failed".into());
        }
        give_to_postgres(scratch.path())?;
        let mut last_error = String::new();
        for _ in 0..3 {
            let port = free_port()?;
            let options = format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
                data.display()
            );
            let output = pg_command(&bin.join("pg_ctl"))
                .arg("-D")
                .arg(&data)
                .args(["-o", &options, "-w", "-t", "30", "-l"])
                .arg(data.join("server.log"))
                .arg("start")
                .output()
                .map_err(|e| format!("spawn pg_ctl: {e}"))?;
            if output.status.success() {
                return Ok(PostgresServer {
                    port,
                    data,
                    _scratch: scratch,
                });
            }
            last_error = String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr);
        }
        Err(format!("postgres did not start: {last_error}"))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Ok(bin) = pg_bin() {
            let _ = pg_command(&bin.join("pg_ctl"))
                .arg("-D")
                .arg(&self.data)
                .args(["-m", "immediate", "-w", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Every RPC path (`/package.Service/Method`) of the named services (`package.Service`) in an
/// encoded file descriptor set: tests that must cover every RPC read the list from the protos.
pub fn rpc_paths(descriptor_set: &[u8], services: &[&str]) -> HarnessResult<Vec<String>> {
    use prost::Message;
    let set = prost_types::FileDescriptorSet::decode(descriptor_set)
        .map_err(|e| format!("descriptor set: {e}"))?;
    let mut paths = Vec::new();
    for file in &set.file {
        let package = file.package();
        for service in &file.service {
            let full = format!("{package}.{}", service.name());
            if services.contains(&full.as_str()) {
                for method in &service.method {
                    paths.push(format!("/{full}/{}", method.name()));
                }
            }
        }
    }
    Ok(paths)
}

/// Calls `path` with an empty message and the given metadata; the status code the call ends
/// with (`Ok` for an answer).
pub async fn call_empty(
    channel: tonic::transport::Channel,
    path: &str,
    metadata: &[(&str, &str)],
) -> HarnessResult<(tonic::Code, String)> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| format!("not ready: {e}"))?;
    let mut request = tonic::Request::new(());
    for (key, value) in metadata {
        let key = tonic::metadata::MetadataKey::from_bytes(key.as_bytes())
            .map_err(|e| format!("metadata key {key}: {e}"))?;
        let value = value
            .parse()
            .map_err(|_| format!("metadata value for {key}"))?;
        request.metadata_mut().insert(key, value);
    }
    let path: http::uri::PathAndQuery = path.parse().map_err(|e| format!("{path}: {e}"))?;
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    Ok(match grpc.unary(request, path, codec).await {
        Ok(_) => (tonic::Code::Ok, String::new()),
        Err(status) => (status.code(), status.message().to_owned()),
    })
}

#[cfg(test)]
mod harness_tests {
    use super::*;

    #[tokio::test]
    async fn postgres_starts_answers_and_stops() {
        let server = PostgresServer::start().await.expect("postgres starts");
        let port = server.port();
        let answered = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        assert!(answered, "postgres listens on {port}");
        drop(server);
        let gone = std::net::TcpStream::connect(("127.0.0.1", port)).is_err();
        assert!(gone, "postgres stopped on drop");
    }

    #[tokio::test]
    async fn redis_restart_keeps_the_port_and_loses_the_data() {
        let mut server = RedisServer::start().await.expect("redis starts");
        let mut conn = server.client().await.expect("client");
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .query_async(&mut conn)
            .await
            .expect("set");
        server.restart().await.expect("restart");
        let mut conn = server.client().await.expect("client");
        let value: Option<String> = redis::cmd("GET")
            .arg("k")
            .query_async(&mut conn)
            .await
            .expect("get");
        assert_eq!(value, None);
    }
}
