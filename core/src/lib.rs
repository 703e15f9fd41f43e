//! poolgate-core: the domain, with no I/O. Accounts and credentials, lease terms and denials,
//! the outcome classes and what each does to an account, classification of upstream answers,
//! the selection order, money. Every service and the relay speak these types; the gRPC
//! conversions live in `poolgate-proto`.

use std::time::Duration;

pub mod account;
pub mod api;
pub mod caller;
pub mod classify;
pub mod clock;
pub mod health;
pub mod keys;
pub mod lease;
pub mod money;
pub mod outcome;
pub mod plan;
pub mod price;
pub mod select;
pub mod service;
pub mod status;
pub mod upstream;
pub mod view;
pub mod windows;

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

/// `short_hash` of a JSON value's compact text, without writing the text out first: the
/// serializer feeds the hash (the same result as `short_hash(&value.to_string())`).
pub fn short_hash_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    use sha2::{Digest, Sha256};
    struct Feed(Sha256);
    impl std::io::Write for Feed {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.update(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut feed = Feed(Sha256::new());
    // Writing into a hash cannot fail, and a Value always serializes.
    let _ = serde_json::to_writer(&mut feed, value);
    hex(&feed.0.finalize()[..16])
}

pub use clock::{Clock, ManualClock, SystemClock, TimeSource};

/// The system's wall-clock ms since the epoch. Engines and backends read the [`Clock`] they are
/// given instead; this is for code outside them that has none (the relay's proxy, CLIs).
pub fn now_ms() -> i64 {
    clock::TimeSource::wall_ms(&SystemClock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_hash_is_the_hash_of_its_text() {
        let value = serde_json::json!([{"a": "b\u{e9}\"q"}, null, [1, 2.5], "x".repeat(10_000)]);
        assert_eq!(short_hash_json(&value), short_hash(&value.to_string()));
    }
}
