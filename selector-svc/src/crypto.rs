//! Credentials at rest: AES-256-GCM under named keys, several accepted at once so keys can be
//! rotated (new writes use the active key; `selector-svc reencrypt` moves old rows to it).
//! Client API keys: random, shown once, stored as SHA-256.

use std::collections::HashMap;

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use sha2::{Digest, Sha256};

use crate::domain::Secret;

/// Bound into every ciphertext, so a credential blob cannot be replayed as some other blob.
const AAD: &[u8] = b"poolgate:credential:v1";
const NONCE_BYTES: usize = 12;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CryptoError {
    #[error("credential keys: {0}")]
    BadKeys(String),
    #[error("no credential key with id {0:?} (is the key ring complete?)")]
    UnknownKey(String),
    #[error("credential could not be decrypted with key {0:?}")]
    Decrypt(String),
    #[error("credential could not be encrypted")]
    Encrypt,
}

/// Named 256-bit keys; `active` encrypts, all decrypt.
#[derive(Clone)]
pub struct Keyring {
    keys: HashMap<String, Aes256Gcm>,
    active: String,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<&String> = self.keys.keys().collect();
        ids.sort();
        f.debug_struct("Keyring")
            .field("ids", &ids)
            .field("active", &self.active)
            .finish()
    }
}

impl Keyring {
    /// Parses `id:base64key[,id:base64key...]` (or one per line); the first is active unless
    /// `active` names another.
    pub fn parse(spec: &str, active: Option<&str>) -> Result<Self, CryptoError> {
        let mut keys = HashMap::new();
        let mut first = None;
        for entry in spec
            .split([',', '\n'])
            .map(str::trim)
            .filter(|e| !e.is_empty() && !e.starts_with('#'))
        {
            let (id, encoded) = entry
                .split_once(':')
                .or_else(|| entry.split_once('='))
                .ok_or_else(|| CryptoError::BadKeys("each key is written id:base64".into()))?;
            let id = id.trim();
            if id.is_empty() || id.len() > 64 {
                return Err(CryptoError::BadKeys("a key id is 1..=64 characters".into()));
            }
            let bytes = STANDARD
                .decode(encoded.trim())
                .map_err(|_| CryptoError::BadKeys(format!("key {id:?} is not base64")))?;
            let cipher = Aes256Gcm::new_from_slice(&bytes).map_err(|_| {
                CryptoError::BadKeys(format!("key {id:?} must be 32 bytes, got {}", bytes.len()))
            })?;
            if keys.insert(id.to_owned(), cipher).is_some() {
                return Err(CryptoError::BadKeys(format!("key {id:?} given twice")));
            }
            first.get_or_insert_with(|| id.to_owned());
        }
        let active = match active {
            Some(id) => id.to_owned(),
            None => first.ok_or_else(|| CryptoError::BadKeys("no key given".into()))?,
        };
        if !keys.contains_key(&active) {
            return Err(CryptoError::UnknownKey(active));
        }
        Ok(Keyring { keys, active })
    }

    /// A fresh random key, base64: for `selector-svc genkey` and tests.
    pub fn generate_key() -> String {
        STANDARD.encode(Aes256Gcm::generate_key(&mut OsRng))
    }

    pub fn active_id(&self) -> &str {
        &self.active
    }

    /// Encrypts under the active key: returns (key id, nonce ‖ ciphertext).
    pub fn encrypt(&self, plaintext: &str) -> Result<(String, Vec<u8>), CryptoError> {
        let cipher = self
            .keys
            .get(&self.active)
            .ok_or_else(|| CryptoError::UnknownKey(self.active.clone()))?;
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let sealed = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext.as_bytes(),
                    aad: AAD,
                },
            )
            .map_err(|_| CryptoError::Encrypt)?;
        let mut blob = nonce.to_vec();
        blob.extend_from_slice(&sealed);
        Ok((self.active.clone(), blob))
    }

    pub fn decrypt(&self, key_id: &str, blob: &[u8]) -> Result<Secret, CryptoError> {
        let cipher = self
            .keys
            .get(key_id)
            .ok_or_else(|| CryptoError::UnknownKey(key_id.to_owned()))?;
        if blob.len() < NONCE_BYTES {
            return Err(CryptoError::Decrypt(key_id.to_owned()));
        }
        let (nonce, sealed) = blob.split_at(NONCE_BYTES);
        let plain = cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: AAD,
                },
            )
            .map_err(|_| CryptoError::Decrypt(key_id.to_owned()))?;
        String::from_utf8(plain)
            .map(Secret::new)
            .map_err(|_| CryptoError::Decrypt(key_id.to_owned()))
    }
}

/// A new client API key: `pgk-` and 32 random bytes, URL-safe base64.
pub fn new_api_key() -> Secret {
    let bytes = Aes256Gcm::generate_key(&mut OsRng);
    Secret::new(format!("pgk-{}", URL_SAFE_NO_PAD.encode(bytes)))
}

/// What is stored for an API key: its SHA-256.
pub fn api_key_hash(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}

/// The first characters of a key, shown to operators to tell keys apart.
pub fn api_key_prefix(key: &str) -> String {
    key.chars().take(8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(spec: &str) -> Keyring {
        Keyring::parse(spec, None).expect("keyring")
    }

    #[test]
    fn round_trips_and_rotates() {
        let (k1, k2) = (Keyring::generate_key(), Keyring::generate_key());
        let old = ring(&format!("k1:{k1}"));
        let (id, blob) = old.encrypt("sk-ant-secret").expect("encrypt");
        assert_eq!(id, "k1");
        assert!(
            !blob.windows(6).any(|w| w == b"sk-ant"),
            "no clear text in the blob"
        );
        let rotated = Keyring::parse(&format!("k1:{k1},k2:{k2}"), Some("k2")).expect("keyring");
        assert_eq!(
            rotated
                .decrypt("k1", &blob)
                .expect("old key still decrypts")
                .expose(),
            "sk-ant-secret"
        );
        let (id, blob2) = rotated.encrypt("sk-ant-secret").expect("encrypt");
        assert_eq!(id, "k2");
        assert_ne!(blob, blob2);
        assert_eq!(
            old.decrypt("k2", &blob2),
            Err(CryptoError::UnknownKey("k2".into()))
        );
    }

    #[test]
    fn tampering_is_detected() {
        let keys = ring(&format!("a:{}", Keyring::generate_key()));
        let (id, mut blob) = keys.encrypt("token").expect("encrypt");
        let last = blob.len() - 1;
        blob[last] ^= 1;
        assert_eq!(
            keys.decrypt(&id, &blob),
            Err(CryptoError::Decrypt("a".into()))
        );
        assert_eq!(
            keys.decrypt(&id, &[1, 2]),
            Err(CryptoError::Decrypt("a".into()))
        );
    }

    #[test]
    fn bad_key_specs_are_refused_with_a_reason() {
        assert!(matches!(
            Keyring::parse("", None),
            Err(CryptoError::BadKeys(_))
        ));
        assert!(matches!(
            Keyring::parse("k1:notbase64!!", None),
            Err(CryptoError::BadKeys(_))
        ));
        assert!(matches!(
            Keyring::parse("k1:AAAA", None),
            Err(CryptoError::BadKeys(_))
        ));
        let key = Keyring::generate_key();
        assert!(matches!(
            Keyring::parse(&format!("k1:{key}"), Some("k9")),
            Err(CryptoError::UnknownKey(_))
        ));
        assert!(matches!(
            Keyring::parse(&format!("k1:{key},k1:{key}"), None),
            Err(CryptoError::BadKeys(_))
        ));
    }

    #[test]
    fn api_keys_are_random_and_hashed() {
        let (a, b) = (new_api_key(), new_api_key());
        assert_ne!(a, b);
        assert!(a.expose().starts_with("pgk-"));
        assert_eq!(api_key_hash(a.expose()).len(), 32);
        assert_ne!(api_key_hash(a.expose()), api_key_hash(b.expose()));
    }
}
