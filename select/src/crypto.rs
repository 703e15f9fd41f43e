//! Credentials at rest: AES-256-GCM under named keys, several accepted at once so keys can be
//! rotated (new writes use the active key; `selector-svc reencrypt` moves old rows to it), each
//! blob bound to the account row and the field it is stored in. Client API keys: random, shown
//! once, stored as SHA-256.
//!
//! Two blob formats, told apart per blob (a row may hold one of each during an upgrade):
//! - v1 (written before row binding): `nonce(12) ‖ ciphertext`, associated data the constant
//!   [`V1_AAD`]. Such a blob decrypts in any row and any field: whoever can write to Postgres can
//!   move account B's blob into account A's row. Still read, so a rolling upgrade works; never
//!   written; `reencrypt` upgrades it.
//! - v2: `"pgv2" ‖ nonce(12) ‖ ciphertext`, associated data `poolgate:v2:accounts:<id>:<field>`
//!   ([`BlobPlace`]), so a blob moved to another row or column does not authenticate.
//!
//! The header cannot be told from a v1 blob by its bytes alone: a v1 blob starts with a random
//! nonce, which begins with `"pgv2"` once in 2^32 blobs. So the format is decided by which
//! authentication succeeds, never by the header alone: a blob with the header is opened as v2
//! first and, only if that fails, as v1 (the collision case); a blob without it only as v1. The
//! fallback accepts nothing new: a v1 open succeeds only for bytes sealed under the v1 associated
//! data, which a v2 blob (other associated data, other nonce bytes) is not, so a v2 blob moved
//! elsewhere cannot pass as v1.

use std::collections::HashMap;

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use sha2::{Digest, Sha256};

use poolgate_core::AccountId;
use poolgate_core::account::Secret;

/// The associated data of every v1 blob: binds nothing but the format.
pub const V1_AAD: &[u8] = b"poolgate:credential:v1";
/// The first bytes of a v2 blob.
pub const V2_HEADER: &[u8] = b"pgv2";
const NONCE_BYTES: usize = 12;

/// The encrypted columns of an account row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `credential_ciphertext`: the API key or OAuth access token.
    Credential,
    /// `refresh_token_ciphertext`: the OAuth refresh token.
    RefreshToken,
}

impl Field {
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Credential => "credential",
            Field::RefreshToken => "refresh_token",
        }
    }
}

/// Where a blob is stored: the row and column a v2 blob is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobPlace {
    pub account_id: AccountId,
    pub field: Field,
}

impl BlobPlace {
    pub fn credential(account_id: AccountId) -> Self {
        BlobPlace {
            account_id,
            field: Field::Credential,
        }
    }

    pub fn refresh_token(account_id: AccountId) -> Self {
        BlobPlace {
            account_id,
            field: Field::RefreshToken,
        }
    }

    /// The v2 associated data.
    fn associated_data(&self) -> String {
        format!(
            "poolgate:v2:accounts:{}:{}",
            self.account_id,
            self.field.as_str()
        )
    }
}

impl std::fmt::Display for BlobPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of account {}", self.field.as_str(), self.account_id)
    }
}

/// The format a blob was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobFormat {
    /// Constant associated data: readable anywhere (written before row binding).
    V1,
    /// Bound to its row and field.
    V2,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CryptoError {
    #[error("credential keys: {0}")]
    BadKeys(String),
    #[error("no credential key with id {0:?} (is the key ring complete?)")]
    UnknownKey(String),
    /// Wrong key, damaged bytes, or a blob written for another row or field.
    #[error(
        "{place} could not be decrypted with key {key_id:?} (wrong key, or not written for this row and field)"
    )]
    Decrypt { key_id: String, place: BlobPlace },
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

    /// `N` bytes from the operating system's random source (what keys, nonces and the sign-in
    /// flows' PKCE verifiers and states are made of).
    pub fn random_bytes<const N: usize>() -> [u8; N] {
        use aes_gcm::aead::rand_core::RngCore;
        let mut bytes = [0u8; N];
        OsRng.fill_bytes(&mut bytes);
        bytes
    }

    /// A fresh random key, base64: for `selector-svc genkey` and tests.
    pub fn generate_key() -> String {
        STANDARD.encode(Aes256Gcm::generate_key(&mut OsRng))
    }

    pub fn active_id(&self) -> &str {
        &self.active
    }

    /// Encrypts under the active key as a v2 blob bound to `place`: returns (key id, blob).
    pub fn encrypt(
        &self,
        plaintext: &str,
        place: BlobPlace,
    ) -> Result<(String, Vec<u8>), CryptoError> {
        let cipher = self
            .keys
            .get(&self.active)
            .ok_or_else(|| CryptoError::UnknownKey(self.active.clone()))?;
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let associated_data = place.associated_data();
        let sealed = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext.as_bytes(),
                    aad: associated_data.as_bytes(),
                },
            )
            .map_err(|_| CryptoError::Encrypt)?;
        let mut blob = Vec::with_capacity(V2_HEADER.len() + NONCE_BYTES + sealed.len());
        blob.extend_from_slice(V2_HEADER);
        blob.extend_from_slice(&nonce);
        blob.extend_from_slice(&sealed);
        Ok((self.active.clone(), blob))
    }

    /// Decrypts a blob read from `place` (either format).
    pub fn decrypt(
        &self,
        key_id: &str,
        blob: &[u8],
        place: BlobPlace,
    ) -> Result<Secret, CryptoError> {
        self.decrypt_versioned(key_id, blob, place)
            .map(|(secret, _)| secret)
    }

    /// Decrypts a blob read from `place` and says which format it was (see the module comment for
    /// why the header alone does not decide).
    pub fn decrypt_versioned(
        &self,
        key_id: &str,
        blob: &[u8],
        place: BlobPlace,
    ) -> Result<(Secret, BlobFormat), CryptoError> {
        let cipher = self
            .keys
            .get(key_id)
            .ok_or_else(|| CryptoError::UnknownKey(key_id.to_owned()))?;
        let opened = blob
            .strip_prefix(V2_HEADER)
            .and_then(|bound| open(cipher, bound, place.associated_data().as_bytes()))
            .map(|plain| (plain, BlobFormat::V2))
            .or_else(|| open(cipher, blob, V1_AAD).map(|plain| (plain, BlobFormat::V1)));
        let unreadable = || CryptoError::Decrypt {
            key_id: key_id.to_owned(),
            place,
        };
        let (plain, format) = opened.ok_or_else(unreadable)?;
        let secret = String::from_utf8(plain).map_err(|_| unreadable())?;
        Ok((Secret::new(secret), format))
    }
}

/// `nonce ‖ ciphertext` opened with `associated_data`; `None` when it does not authenticate.
fn open(cipher: &Aes256Gcm, blob: &[u8], associated_data: &[u8]) -> Option<Vec<u8>> {
    if blob.len() < NONCE_BYTES {
        return None;
    }
    let (nonce, sealed) = blob.split_at(NONCE_BYTES);
    cipher
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: sealed,
                aad: associated_data,
            },
        )
        .ok()
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

    /// A blob as the selector wrote it before row binding (v1), with a chosen nonce.
    fn seal_v1(keys: &Keyring, key_id: &str, nonce: [u8; NONCE_BYTES], plain: &str) -> Vec<u8> {
        let sealed = keys.keys[key_id]
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plain.as_bytes(),
                    aad: V1_AAD,
                },
            )
            .expect("seal");
        [nonce.as_slice(), &sealed].concat()
    }

    const A: BlobPlace = BlobPlace {
        account_id: 7,
        field: Field::Credential,
    };

    #[test]
    fn round_trips_and_rotates() {
        let (k1, k2) = (Keyring::generate_key(), Keyring::generate_key());
        let old = ring(&format!("k1:{k1}"));
        let (id, blob) = old.encrypt("sk-ant-secret", A).expect("encrypt");
        assert_eq!(id, "k1");
        assert!(blob.starts_with(V2_HEADER));
        assert!(
            !blob.windows(6).any(|w| w == b"sk-ant"),
            "no clear text in the blob"
        );
        let rotated = Keyring::parse(&format!("k1:{k1},k2:{k2}"), Some("k2")).expect("keyring");
        assert_eq!(
            rotated
                .decrypt_versioned("k1", &blob, A)
                .map(|(secret, format)| (secret.expose().to_owned(), format)),
            Ok(("sk-ant-secret".to_owned(), BlobFormat::V2)),
            "the old key still decrypts"
        );
        let (id, blob2) = rotated.encrypt("sk-ant-secret", A).expect("encrypt");
        assert_eq!(id, "k2");
        assert_ne!(blob, blob2);
        assert_eq!(
            old.decrypt("k2", &blob2, A),
            Err(CryptoError::UnknownKey("k2".into()))
        );
    }

    #[test]
    fn a_v2_blob_opens_only_in_its_own_row_and_field() {
        let keys = ring(&format!("a:{}", Keyring::generate_key()));
        let (id, blob) = keys.encrypt("token", A).expect("encrypt");
        assert_eq!(
            keys.decrypt(&id, &blob, A).expect("own place").expose(),
            "token"
        );
        for elsewhere in [BlobPlace::credential(8), BlobPlace::refresh_token(7)] {
            assert_eq!(
                keys.decrypt(&id, &blob, elsewhere),
                Err(CryptoError::Decrypt {
                    key_id: "a".into(),
                    place: elsewhere
                }),
                "{elsewhere}"
            );
        }
        // Without its header it is not a v1 blob either (other associated data).
        assert!(keys.decrypt(&id, &blob[V2_HEADER.len()..], A).is_err());
        let message = keys
            .decrypt(&id, &blob, BlobPlace::credential(8))
            .expect_err("moved")
            .to_string();
        assert!(message.contains("credential of account 8"), "{message}");
    }

    #[test]
    fn v1_blobs_are_read_anywhere_and_a_header_collision_is_still_v1() {
        let keys = ring(&format!("a:{}", Keyring::generate_key()));
        let blob = seal_v1(&keys, "a", [9; NONCE_BYTES], "old-token");
        for place in [A, BlobPlace::refresh_token(99)] {
            let (secret, format) = keys.decrypt_versioned("a", &blob, place).expect("v1");
            assert_eq!((secret.expose(), format), ("old-token", BlobFormat::V1));
        }
        // A v1 blob whose random nonce starts with the v2 header (one in 2^32).
        let mut nonce = [3; NONCE_BYTES];
        nonce[..V2_HEADER.len()].copy_from_slice(V2_HEADER);
        let colliding = seal_v1(&keys, "a", nonce, "unlucky");
        assert!(colliding.starts_with(V2_HEADER));
        let (secret, format) = keys.decrypt_versioned("a", &colliding, A).expect("v1");
        assert_eq!((secret.expose(), format), ("unlucky", BlobFormat::V1));
    }

    #[test]
    fn tampering_is_detected() {
        let keys = ring(&format!("a:{}", Keyring::generate_key()));
        let unreadable = Err(CryptoError::Decrypt {
            key_id: "a".into(),
            place: A,
        });
        let (id, mut blob) = keys.encrypt("token", A).expect("encrypt");
        let last = blob.len() - 1;
        blob[last] ^= 1;
        assert_eq!(keys.decrypt(&id, &blob, A), unreadable);
        assert_eq!(keys.decrypt(&id, &[1, 2], A), unreadable);
        assert_eq!(keys.decrypt(&id, V2_HEADER, A), unreadable);
        let mut v1 = seal_v1(&keys, "a", [5; NONCE_BYTES], "token");
        v1[NONCE_BYTES] ^= 1;
        assert_eq!(keys.decrypt(&id, &v1, A), unreadable);
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
