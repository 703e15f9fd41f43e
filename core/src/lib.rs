//! poolgate-core: the domain, with no I/O. Accounts and credentials, lease terms and denials,
//! the outcome classes and what each does to an account, classification of upstream answers,
//! the selection order, money. Every service and the relay speak these types; the gRPC
//! conversions live in `poolgate-proto`.

use std::time::Duration;

pub mod account;
pub mod classify;
pub mod health;
pub mod lease;
pub mod money;
pub mod outcome;
pub mod select;
pub mod upstream;

/// Upstream account ids are positive 64-bit integers.
pub type AccountId = i64;

/// Users, groups, account names and session hashes are non-empty strings of at most this many
/// bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// Duration in whole milliseconds, saturating.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(2 * bytes.len()), |mut text, byte| {
            let _ = write!(text, "{byte:02x}");
            text
        })
}

/// The first 16 bytes of `text`'s SHA-256, in hex: a name for a value that must not be shown or
/// kept as it is (a long session id, the credential a saved token replaced).
pub fn short_hash(text: &str) -> String {
    use sha2::{Digest, Sha256};
    hex(&Sha256::digest(text.as_bytes())[..16])
}

/// Wall-clock ms since the epoch (used only where Redis `TIME` cannot be: Postgres timestamps,
/// upstream reset headers).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
