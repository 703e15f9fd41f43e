//! The standalone relay's state file: what must survive a restart (refreshed tokens, status
//! changes, client key disables, the usage ledger, the usage windows' readings), its format (1,
//! and 0 read for upgrades) and its atomic write.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::source::StoreError;
use poolgate_core::account::Secret;
use poolgate_core::windows::WindowReading;

/// Where the standalone relay keeps what must survive a restart.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

/// Serializes a `Secret` as its text (the state file holds credentials in clear, as the config
/// does); everything else only ever prints it masked.
mod secret_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use poolgate_core::account::Secret;

    pub fn serialize<S: Serializer>(secret: &Secret, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(secret.expose())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Secret, D::Error> {
        String::deserialize(deserializer).map(Secret::new)
    }
}

/// Tokens a refresh wrote, with the fingerprint of the config credential they replaced: a
/// config that names another credential since (the operator signed in again) wins over them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StoredTokens {
    #[serde(with = "secret_text")]
    pub(super) access_token: Secret,
    #[serde(with = "secret_text")]
    pub(super) refresh_token: Secret,
    pub(super) expires_at_ms: i64,
    pub(super) replaces: String,
    /// Who the upstream says the account is, when these tokens came from a sign-in (`login`,
    /// `import`) rather than a refresh. Added within format 1: absent reads as not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) identity: Option<StoredIdentity>,
}

fn active() -> String {
    "active".to_owned()
}

/// An account's identity (`poolgate_core::account::AccountIdentity`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct StoredIdentity {
    pub(super) upstream_id: String,
    #[serde(default)]
    pub(super) email: String,
    #[serde(default)]
    pub(super) plan: String,
}

/// An account signed in (or imported) at run time, kept here rather than in the config: all of
/// it, since the config does not name it. Its refreshed tokens and status are kept as a
/// configured account's are (`tokens`, `statuses`, by name).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StoredAccount {
    pub(super) id: i64,
    pub(super) group: String,
    pub(super) platform: String,
    pub(super) kind: String,
    pub(super) base_url: String,
    #[serde(with = "secret_text")]
    pub(super) access_token: Secret,
    #[serde(with = "secret_text", default)]
    pub(super) refresh_token: Secret,
    #[serde(default)]
    pub(super) expires_at_ms: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) token_url: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) client_id: String,
    pub(super) identity: StoredIdentity,
    /// Its status and reason (`active` unless the engine or an operator changed it).
    #[serde(default = "active")]
    pub(super) status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) status_reason: String,
    #[serde(default)]
    pub(super) priority: i32,
    #[serde(default)]
    pub(super) concurrency_limit: i32,
    #[serde(default)]
    pub(super) rpm_limit: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) proxy_url: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) model_mapping: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StoredStatus {
    pub(super) status: String,
    pub(super) reason: String,
}

/// An operator's change to a client key that differs from the config (`disabled` the opposite
/// of the key's `disabled` in the YAML).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct StoredKey {
    pub(super) disabled: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct UsageBucket {
    /// The client key's hash (hex), which names the key whatever its place in the config; empty
    /// for a key the config does not list (then `api_key_id` alone says whose it is).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) key: String,
    pub(super) api_key_id: i64,
    pub(super) hour_start_ms: i64,
    pub(super) requests: i64,
    pub(super) input_tokens: i64,
    pub(super) output_tokens: i64,
    pub(super) cost_usd: f64,
}

/// One client key's usage of one model at one price source in one hour (docs/DESIGN.md §6,
/// "Prices"): what the operator's `usage` shows per model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ModelUsageBucket {
    /// The client key's hash (hex); empty for a key the config does not list.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) key: String,
    pub(super) api_key_id: i64,
    pub(super) hour_start_ms: i64,
    pub(super) model: String,
    /// `operator`, `catalogue`, `fallback`, `none`; empty: not said.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) price_source: String,
    pub(super) requests: i64,
    pub(super) input_tokens: i64,
    pub(super) output_tokens: i64,
    pub(super) cost_usd: f64,
}

/// A price the operator set (`set-price`) or removed (`remove-price`, `None`) at run time,
/// over the config's `prices`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(super) struct StoredPrice {
    pub(super) input: f64,
    pub(super) output: f64,
    pub(super) cache_write: f64,
    pub(super) cache_read: f64,
    /// Rerank: USD per search unit; absent (an older relay's file): none. An older relay
    /// reading it ignores it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) search_unit: f64,
}

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

/// The state file format this build writes. Format 1 names accounts by name and client keys by
/// hash, so a config whose entries moved (ids default to the place in the file) applies no
/// retirement or usage to another account or key. Format 0 (the first release) named them by id;
/// it is read, and written back as format 1.
pub(super) const FORMAT: u32 = 1;

/// The format of a file that keeps accounts signed in at run time: format 1 plus `accounts`. A
/// file without them is still written as format 1, so a downgrade reads it; one with them is
/// refused by an older build (which would otherwise drop them, and their refresh tokens, on its
/// first write) with a message naming the format.
pub(super) const FORMAT_WITH_ACCOUNTS: u32 = 2;

/// The state file's content.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Persisted {
    #[serde(default)]
    pub(super) format: u32,
    /// By account name (format 0: by account id).
    #[serde(default)]
    pub(super) tokens: BTreeMap<String, StoredTokens>,
    /// Only statuses that differ from the config's; by account name (format 0: by id).
    #[serde(default)]
    pub(super) statuses: BTreeMap<String, StoredStatus>,
    #[serde(default)]
    pub(super) usage: Vec<UsageBucket>,
    /// Client keys an operator disabled or enabled against the config, by the key's hash (hex),
    /// so a reordered config applies nothing to another key. Added within format 1: a file
    /// without them reads as none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) keys: BTreeMap<String, StoredKey>,
    /// The usage windows' readings (docs/DESIGN.md §5) by account name, only those whose reset
    /// is ahead. Added within format 1: a file without them reads as none, and a build without
    /// them ignores them.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "readable_windows"
    )]
    pub(super) windows: BTreeMap<String, Vec<WindowReading>>,
    /// Accounts signed in or imported at run time, by name, with their tokens and status. A
    /// file that has any is format 2 ([`FORMAT_WITH_ACCOUNTS`]), which older builds refuse.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) accounts: BTreeMap<String, StoredAccount>,
    /// Prices the operator set (`Some`) or removed (`None`) against the config's, by model.
    /// Added within format 1: a file without them reads as none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) prices: BTreeMap<String, Option<StoredPrice>>,
    /// Usage per client key, hour, model and price source. Added within format 1: a file
    /// without it reads as none (the per-key totals in `usage` stay whole).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) model_usage: Vec<ModelUsageBucket>,
}

/// The readings this build can read, the others skipped: a reading is worth an answer or two
/// from the upstream, not a relay that refuses its state file (a later build may know more
/// windows than this one).
fn readable_windows<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, Vec<WindowReading>>, D::Error> {
    let serde_json::Value::Object(accounts) = serde_json::Value::deserialize(deserializer)? else {
        return Ok(BTreeMap::new());
    };
    Ok(accounts
        .into_iter()
        .map(|(account, readings)| {
            let readings = match readings {
                serde_json::Value::Array(readings) => readings
                    .into_iter()
                    .filter_map(|reading| serde_json::from_value(reading).ok())
                    .collect(),
                _ => Vec::new(),
            };
            (account, readings)
        })
        .collect())
}

impl StateFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        StateFile { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The saved state; `None` when there is no file yet. A file that cannot be read or parsed
    /// is an error: starting without it could serve a refresh token that was already used.
    pub(super) fn read(&self) -> Result<Option<Persisted>, StoreError> {
        let bytes = match fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(StoreError::StateFile(format!(
                    "reading {}: {error}",
                    self.path.display()
                )));
            }
        };
        // serde's message can quote a value; the position is enough to find the fault.
        serde_json::from_slice(&bytes).map(Some).map_err(|error| {
            StoreError::StateFile(format!(
                "{} is not a valid state file ({:?} error at line {} column {})",
                self.path.display(),
                error.classify(),
                error.line(),
                error.column()
            ))
        })
    }

    /// Writes the state atomically, readable by this user only.
    pub(super) fn write(&self, state: &Persisted) -> Result<(), StoreError> {
        let failed = |what: &str, error: std::io::Error| {
            StoreError::StateFile(format!("{what} {}: {error}", self.path.display()))
        };
        let bytes = serde_json::to_vec_pretty(state)
            .map_err(|e| StoreError::StateFile(format!("encoding the state: {e}")))?;
        let directory = match self.path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = self
            .path
            .file_name()
            .ok_or_else(|| StoreError::StateFile(format!("{} names no file", self.path.display())))?
            .to_string_lossy()
            .into_owned();
        // A fresh file under a random name, created exclusively (`O_EXCL`, never through a
        // symlink) with mode 0600 from the start: a file or symlink planted at a path that
        // could be predicted (the pid-named temporary of earlier releases) is never opened, so
        // the tokens in clear cannot be steered into another file. A failed write removes it.
        let written = (|| {
            let prefix = format!(".{name}.");
            let mut builder = tempfile::Builder::new();
            builder.prefix(&prefix).suffix(".tmp");
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                builder.permissions(fs::Permissions::from_mode(0o600));
            }
            let mut temporary = builder.tempfile_in(&directory)?;
            temporary.write_all(&bytes)?;
            temporary.as_file().sync_all()?;
            temporary
                .persist(&self.path)
                .map(drop)
                .map_err(|error| error.error)
        })();
        if let Err(error) = written {
            return Err(failed("writing", error));
        }
        // The rename is durable only once the directory entry is.
        File::open(&directory)
            .and_then(|dir| dir.sync_all())
            .map_err(|error| failed("syncing the directory of", error))
    }
}
