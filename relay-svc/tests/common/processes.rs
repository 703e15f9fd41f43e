//! The workspace's service binaries as child processes, for tests that kill and restart them.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// Path of a binary built next to `relay-svc` (the workspace's tests build all of them).
pub fn binary(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_BIN_EXE_relay-svc"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run the workspace's tests (`cargo nextest run --workspace` or `bash scripts/test.sh`)",
        path.display()
    );
    path
}

/// A child process, killed (SIGKILL) on drop.
pub struct Process(pub Child);

impl Process {
    /// SIGTERM: the graceful shutdown path.
    pub fn terminate(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
    }

    /// `kill -9`: no shutdown path runs.
    pub fn kill9(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where this test process's services write their output: `POOLGATE_TEST_LOGS` when set, else
/// a directory of the test's own under the system's temporary directory.
pub fn log_dir() -> PathBuf {
    match std::env::var_os("POOLGATE_TEST_LOGS") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::temp_dir()
            .join("poolgate-test-logs")
            .join(std::process::id().to_string()),
    }
}

/// The last `lines` lines a service started as `label` wrote, for a failure's message.
pub fn log_tail(label: &str, lines: usize) -> String {
    let text = std::fs::read_to_string(log_dir().join(format!("{label}.log"))).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let tail = all[all.len().saturating_sub(lines)..].join("\n");
    format!("--- {label} (last {lines} lines) ---\n{tail}")
}

/// The environment every service process gets.
pub struct Env {
    pub vars: Vec<(String, String)>,
}

/// The previous release's service binaries (`scripts/previous_release.sh` builds them once;
/// `bash scripts/test.sh` exports their directory as `POOLGATE_PREVIOUS_BIN`).
pub fn previous_release_binary(name: &str) -> PathBuf {
    let dir = std::env::var_os("POOLGATE_PREVIOUS_BIN").map(PathBuf::from);
    let path = dir.map(|dir| dir.join(name)).unwrap_or_default();
    assert!(
        path.exists(),
        "the previous release's {name} is not built: run `bash scripts/test.sh`, or set POOLGATE_PREVIOUS_BIN to the directory `bash scripts/previous_release.sh` prints"
    );
    path
}

impl Env {
    pub fn command(&self, name: &str) -> Command {
        self.command_of(binary(name))
    }

    /// [`Env::command`] for the binary at `path` (another release's).
    pub fn command_of(&self, path: PathBuf) -> Command {
        let mut command = Command::new(path);
        // Every service requires, and the relay sends, the service token.
        command.env("POOLGATE_SERVICE_TOKEN", super::SERVICE_TOKEN);
        command.envs(self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        command.env_remove("RUST_LOG").stdin(Stdio::null());
        command
    }

    /// Starts a service. Its output goes to `<label>.log` in [`log_dir`] (appended, so a
    /// restarted service keeps one file); [`log_tail`] reads it back for a failure's message.
    pub fn spawn(&self, name: &str, label: &str, args: &[&str]) -> Process {
        self.spawn_of(binary(name), label, args)
    }

    /// [`Env::spawn`] of the binary at `path` (another release's).
    pub fn spawn_of(&self, path: PathBuf, label: &str, args: &[&str]) -> Process {
        let log = std::fs::create_dir_all(log_dir())
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log_dir().join(format!("{label}.log")))
            })
            .and_then(|file| Ok((file.try_clone()?, file)));
        let (stdout, stderr) = match log {
            Ok((out, err)) => (Stdio::from(out), Stdio::from(err)),
            Err(_) => (Stdio::null(), Stdio::null()),
        };
        Process(
            self.command_of(path)
                .args(args)
                .stdout(stdout)
                .stderr(stderr)
                .spawn()
                .expect("service starts"),
        )
    }

    /// Creates a client key of `user` in `group` through `selector-svc admin create-key` and
    /// answers the key, printed once.
    pub fn create_key(&self, user: &str, group: &str) -> String {
        let created = self.run(
            "selector-svc",
            &["admin", "create-key", "--user", user, "--group", group],
            &[],
        );
        created
            .lines()
            .find_map(|line| line.strip_prefix("api_key="))
            .expect("the new key is printed once")
            .to_owned()
    }

    /// Runs a command to completion; panics with its stderr when it fails.
    pub fn run(&self, name: &str, args: &[&str], extra_env: &[(&str, &str)]) -> String {
        let output = self
            .command(name)
            .args(args)
            .envs(extra_env.iter().copied())
            .output()
            .expect("command runs");
        assert!(
            output.status.success(),
            "{name} {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

/// A Redis, a migrated Postgres with its store (a fresh credential key), and the environment
/// every service process gets over them.
pub struct Databases {
    pub postgres: poolgate_testkit::PostgresServer,
    pub redis: poolgate_testkit::RedisServer,
    pub store: selector_svc::store::PostgresSource,
    pub env: Env,
}

impl Databases {
    pub async fn start() -> Databases {
        let (postgres, redis) = tokio::join!(
            poolgate_testkit::PostgresServer::start(),
            poolgate_testkit::RedisServer::start()
        );
        let (postgres, redis) = (postgres.expect("postgres"), redis.expect("redis"));
        let keys = format!("k1:{}", poolgate_select::crypto::Keyring::generate_key());
        let keyring = poolgate_select::crypto::Keyring::parse(&keys, None).expect("keyring");
        let store = selector_svc::store::PostgresSource::connect(
            &postgres.url(),
            std::sync::Arc::new(keyring),
        )
        .await
        .expect("connect");
        store.migrate().await.expect("migrate");
        let env = Env {
            vars: vec![
                ("POOLGATE_DATABASE_URL".into(), postgres.url()),
                ("POOLGATE_REDIS_URL".into(), redis.url()),
                ("POOLGATE_CREDENTIAL_KEYS".into(), keys),
                ("SELECTOR_ADMIN_TOKEN".into(), "admin-token".into()),
            ],
        };
        Databases {
            postgres,
            redis,
            store,
            env,
        }
    }
}
