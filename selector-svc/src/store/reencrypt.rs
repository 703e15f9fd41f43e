//! `selector-svc reencrypt`: every account row sealed again as v2 under the active key, each
//! write a compare-and-set on the ciphertext read, so a concurrent token refresh always wins.

use sqlx::Row;

use super::{PostgresSource, StoreError, convert};
use poolgate_core::AccountId;
use poolgate_select::crypto::{BlobFormat, BlobPlace};

/// One account's encrypted columns as read, for `reencrypt_one`'s compare-and-set.
#[derive(Clone)]
pub struct StoredCiphertexts {
    pub id: AccountId,
    key_id: String,
    credential: Vec<u8>,
    refresh_token: Option<Vec<u8>>,
}

/// What `reencrypt_one` did with a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReencryptOutcome {
    /// Sealed again as v2 under the active key.
    Upgraded,
    /// v2 under the active key already.
    AlreadyCurrent,
    /// Written by someone else since it was read (a token refresh): left as they wrote it.
    ChangedMeanwhile,
    /// Does not decrypt for its row (wrong key ring, or moved from elsewhere): left as it is.
    Unreadable,
}

/// Counts of a `reencrypt_all` run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReencryptReport {
    pub upgraded: u64,
    pub already_current: u64,
    pub changed_meanwhile: u64,
    pub unreadable: u64,
}

impl PostgresSource {
    /// Brings every row to v2 under the active key (`selector-svc reencrypt`): after a key
    /// rotation, and once after the upgrade to row-bound blobs. Safe while selectors serve: a row
    /// whose ciphertext changed since it was read (a token refresh, an admin update) is left as
    /// its writer wrote it (bound, under that writer's active key); a second run checks it.
    pub async fn reencrypt_all(&self) -> Result<ReencryptReport, StoreError> {
        let mut report = ReencryptReport::default();
        for stored in self.stored_ciphertexts().await? {
            match self.reencrypt_one(&stored).await? {
                ReencryptOutcome::Upgraded => report.upgraded += 1,
                ReencryptOutcome::AlreadyCurrent => report.already_current += 1,
                ReencryptOutcome::ChangedMeanwhile => report.changed_meanwhile += 1,
                ReencryptOutcome::Unreadable => report.unreadable += 1,
            }
        }
        Ok(report)
    }

    /// Every account's ciphertexts as stored now: what `reencrypt_one` compares against.
    pub async fn stored_ciphertexts(&self) -> Result<Vec<StoredCiphertexts>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, credential_key_id, credential_ciphertext, refresh_token_ciphertext FROM accounts ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(convert)?;
        rows.iter()
            .map(|row| {
                Ok(StoredCiphertexts {
                    id: row.try_get("id").map_err(convert)?,
                    key_id: row.try_get("credential_key_id").map_err(convert)?,
                    credential: row.try_get("credential_ciphertext").map_err(convert)?,
                    refresh_token: row.try_get("refresh_token_ciphertext").map_err(convert)?,
                })
            })
            .collect()
    }

    /// Re-seals one row read by `stored_ciphertexts` as v2 under the active key, unless it is
    /// current already. The write is a compare-and-set on what was read: a token refreshed
    /// between the read and the write is never replaced by the older token.
    pub async fn reencrypt_one(
        &self,
        stored: &StoredCiphertexts,
    ) -> Result<ReencryptOutcome, StoreError> {
        let id = stored.id;
        let opened = self
            .keyring
            .decrypt_versioned(
                &stored.key_id,
                &stored.credential,
                BlobPlace::credential(id),
            )
            .and_then(|credential| {
                let refresh_token = match &stored.refresh_token {
                    Some(blob) => Some(self.keyring.decrypt_versioned(
                        &stored.key_id,
                        blob,
                        BlobPlace::refresh_token(id),
                    )?),
                    None => None,
                };
                Ok((credential, refresh_token))
            });
        let ((credential, credential_format), refresh_token) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                // Left as it is: sealing it again would need the clear text, and a blob moved
                // here from another row must not be made to fit this one.
                tracing::error!(account_id = id, %error, "account not re-encrypted: unreadable");
                return Ok(ReencryptOutcome::Unreadable);
            }
        };
        let current = stored.key_id == self.keyring.active_id()
            && credential_format == BlobFormat::V2
            && refresh_token
                .as_ref()
                .is_none_or(|(_, format)| *format == BlobFormat::V2);
        if current {
            return Ok(ReencryptOutcome::AlreadyCurrent);
        }
        let (key_id, credential_blob) = self
            .keyring
            .encrypt(credential.expose(), BlobPlace::credential(id))?;
        let refresh_blob = match &refresh_token {
            Some((token, _)) => Some(
                self.keyring
                    .encrypt(token.expose(), BlobPlace::refresh_token(id))?
                    .1,
            ),
            None => None,
        };
        let updated = sqlx::query(
            "UPDATE accounts SET credential_ciphertext = $2, credential_key_id = $3, refresh_token_ciphertext = $4 \
             WHERE id = $1 AND credential_key_id = $5 AND credential_ciphertext = $6 \
               AND refresh_token_ciphertext IS NOT DISTINCT FROM $7",
        )
        .bind(id)
        .bind(credential_blob)
        .bind(key_id)
        .bind(refresh_blob)
        .bind(&stored.key_id)
        .bind(&stored.credential)
        .bind(&stored.refresh_token)
        .execute(&self.pool)
        .await
        .map_err(convert)?;
        Ok(if updated.rows_affected() == 1 {
            ReencryptOutcome::Upgraded
        } else {
            ReencryptOutcome::ChangedMeanwhile
        })
    }
}
