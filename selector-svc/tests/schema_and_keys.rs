//! The schema check, key rotation, and credentials bound to their rows, against a real Postgres.

use crate::support;

use std::sync::Arc;

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use poolgate_core::account::{CredentialKind, Secret};
use poolgate_select::crypto::{BlobFormat, BlobPlace, CryptoError, Keyring};
use selector_svc::store::{
    AccountInput, PostgresSource, ReencryptOutcome, ReencryptReport, StoreError,
    known_schema_version,
};
use support::{api_account, oauth};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_selector_refuses_a_schema_it_does_not_know() {
    let postgres = poolgate_testkit::PostgresServer::start()
        .await
        .expect("postgres");
    let keyring = Arc::new(
        Keyring::parse(&format!("k1:{}", Keyring::generate_key()), None).expect("keyring"),
    );
    let store = PostgresSource::connect(&postgres.url(), keyring)
        .await
        .expect("connect");
    match store.check_schema().await {
        Err(StoreError::Schema { found: 0, hint, .. }) => {
            assert!(hint.contains("migrate"), "{hint}")
        }
        other => panic!("an empty database must be refused, got {other:?}"),
    }
    store.migrate().await.expect("migrate");
    store
        .check_schema()
        .await
        .expect("the known schema is accepted");
    sqlx::query("INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES ($1, 'future', true, '\\x00', 0)")
        .bind(known_schema_version() + 1)
        .execute(store.pool())
        .await
        .expect("a newer migration row");
    // Newer, but its newest migration recorded no oldest release (tests/schema_releases.rs has
    // the recorded cases).
    match store.check_schema().await {
        Err(error @ StoreError::Schema { .. }) => {
            assert!(error.to_string().contains("no oldest release"), "{error}")
        }
        other => panic!("an unrecorded newer schema must be refused, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reencrypt_moves_every_credential_to_the_active_key() {
    let postgres = poolgate_testkit::PostgresServer::start()
        .await
        .expect("postgres");
    let (k1, k2) = (Keyring::generate_key(), Keyring::generate_key());
    let old = Arc::new(Keyring::parse(&format!("k1:{k1}"), None).expect("keyring"));
    let store = PostgresSource::connect(&postgres.url(), old)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let id = store
        .upsert_account(&api_account("rotated", "g"))
        .await
        .expect("account");
    let both = Arc::new(Keyring::parse(&format!("k1:{k1},k2:{k2}"), Some("k2")).expect("keyring"));
    let rotating = PostgresSource::connect(&postgres.url(), both)
        .await
        .expect("connect");
    assert_eq!(
        rotating.reencrypt_all().await.expect("reencrypt").upgraded,
        1
    );
    assert_eq!(
        rotating.reencrypt_all().await.expect("again"),
        ReencryptReport {
            already_current: 1,
            ..Default::default()
        },
        "nothing left on the old key"
    );
    let only_new = Arc::new(Keyring::parse(&format!("k2:{k2}"), None).expect("keyring"));
    let after = PostgresSource::connect(&postgres.url(), only_new)
        .await
        .expect("connect");
    let account = after
        .load_account(id)
        .await
        .expect("readable with the new key alone");
    assert_eq!(
        account.credential.expose(),
        "sk-ant-rotated-secret-credential"
    );
}

/// A blob exactly as the selector wrote it before row binding (v1): `nonce ‖ ciphertext` with a
/// constant associated string. Written here with aes-gcm directly, not with the code under test.
fn v1_blob(key: &str, plain: &str) -> Vec<u8> {
    let bytes = STANDARD.decode(key).expect("base64 key");
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&bytes));
    let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
    let sealed = cipher
        .encrypt(
            &nonce,
            Payload {
                msg: plain.as_bytes(),
                aad: b"poolgate:credential:v1",
            },
        )
        .expect("seal");
    [nonce.as_slice(), &sealed].concat()
}

/// Whether `blob` still opens the v1 way (constant associated data) under `key`.
fn opens_as_v1(key: &str, blob: &[u8]) -> bool {
    let bytes = STANDARD.decode(key).expect("base64 key");
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&bytes));
    blob.len() > 12
        && cipher
            .decrypt(
                aes_gcm::Nonce::from_slice(&blob[..12]),
                Payload {
                    msg: &blob[12..],
                    aad: b"poolgate:credential:v1",
                },
            )
            .is_ok()
}

async fn store_with(
    postgres: &poolgate_testkit::PostgresServer,
    keys: &str,
    active: Option<&str>,
) -> PostgresSource {
    let keyring = Arc::new(Keyring::parse(keys, active).expect("keyring"));
    PostgresSource::connect(&postgres.url(), keyring)
        .await
        .expect("connect")
}

fn oauth_account(name: &str) -> AccountInput {
    let mut input = api_account(name, "g");
    input.credential_kind = CredentialKind::OAuth;
    input.credential = Some(Secret::new(format!("access-{name}")));
    input.oauth = Some(oauth(
        &format!("refresh-{name}"),
        4_000_000_000_000,
        "http://127.0.0.1:9/token",
    ));
    input
}

async fn ciphertexts(store: &PostgresSource, id: i64) -> (Vec<u8>, Option<Vec<u8>>) {
    let row: (Vec<u8>, Option<Vec<u8>>) = sqlx::query_as(
        "SELECT credential_ciphertext, refresh_token_ciphertext FROM accounts WHERE id = $1",
    )
    .bind(id)
    .fetch_one(store.pool())
    .await
    .expect("row");
    row
}

/// Rewrites a row's blobs as the selector wrote them before row binding.
async fn write_v1(
    store: &PostgresSource,
    key: &str,
    id: i64,
    credential: &str,
    refresh: Option<&str>,
) {
    sqlx::query(
        "UPDATE accounts SET credential_ciphertext = $2, refresh_token_ciphertext = $3, credential_key_id = 'k1' WHERE id = $1",
    )
    .bind(id)
    .bind(v1_blob(key, credential))
    .bind(refresh.map(|r| v1_blob(key, r)))
    .execute(store.pool())
    .await
    .expect("v1 row");
}

fn is_unreadable(result: &Result<impl std::fmt::Debug, StoreError>, place: BlobPlace) -> bool {
    matches!(result, Err(StoreError::Crypto(CryptoError::Decrypt { place: p, .. })) if *p == place)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_moved_to_another_row_or_column_never_yields_a_credential() {
    let postgres = poolgate_testkit::PostgresServer::start()
        .await
        .expect("postgres");
    let key = Keyring::generate_key();
    let store = store_with(&postgres, &format!("k1:{key}"), None).await;
    store.migrate().await.expect("migrate");
    let a = store
        .upsert_account(&api_account("a", "g"))
        .await
        .expect("a");
    let b = store.upsert_account(&oauth_account("b")).await.expect("b");
    assert_ne!(a, b);

    // Someone with write access to Postgres copies b's credential into a's row.
    sqlx::query(
        "UPDATE accounts SET credential_ciphertext = (SELECT credential_ciphertext FROM accounts WHERE id = $2) WHERE id = $1",
    )
    .bind(a)
    .bind(b)
    .execute(store.pool())
    .await
    .expect("swap");
    let loaded = store.load_account(a).await;
    assert!(
        is_unreadable(&loaded, BlobPlace::credential(a)),
        "{loaded:?}"
    );
    let message = loaded.expect_err("refused").to_string();
    assert!(
        message.contains(&format!("credential of account {a}")),
        "{message}"
    );
    assert!(!message.contains("access-b"), "no credential in the error");
    // The served snapshot skips a and still has b, with b's own credential.
    let snapshot = store.load_snapshot().await.expect("snapshot");
    assert!(
        snapshot.account(a).is_none(),
        "the account with a moved blob is not served"
    );
    assert_eq!(
        snapshot.account(b).expect("b served").credential.expose(),
        "access-b"
    );
    assert!(snapshot.accounts().all(|account| account.id != a));
    // `reencrypt` leaves such a row alone rather than sealing the moved blob for its new row.
    let before = ciphertexts(&store, a).await;
    let report = store.reencrypt_all().await.expect("reencrypt");
    assert_eq!(
        report,
        ReencryptReport {
            already_current: 1,
            unreadable: 1,
            ..Default::default()
        }
    );
    assert_eq!(ciphertexts(&store, a).await, before);

    // b's refresh-token blob moved into b's own credential column.
    sqlx::query(
        "UPDATE accounts SET credential_ciphertext = refresh_token_ciphertext WHERE id = $1",
    )
    .bind(b)
    .execute(store.pool())
    .await
    .expect("swap columns");
    let loaded = store.load_account(b).await;
    assert!(
        is_unreadable(&loaded, BlobPlace::credential(b)),
        "{loaded:?}"
    );
    let snapshot = store.load_snapshot().await.expect("snapshot");
    assert!(snapshot.account(b).is_none());
    assert!(
        snapshot
            .accounts()
            .all(|account| account.credential.expose() != "refresh-b"),
        "the refresh token is never served as a credential"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_row_written_the_old_way_still_loads_and_a_new_credential_rebinds_it() {
    let postgres = poolgate_testkit::PostgresServer::start()
        .await
        .expect("postgres");
    let key = Keyring::generate_key();
    let store = store_with(&postgres, &format!("k1:{key}"), None).await;
    store.migrate().await.expect("migrate");
    let id = store
        .upsert_account(&oauth_account("old"))
        .await
        .expect("old");
    write_v1(&store, &key, id, "access-v1", Some("refresh-v1")).await;

    let account = store.load_account(id).await.expect("a v1 row loads");
    assert_eq!(account.credential.expose(), "access-v1");
    assert_eq!(
        account.oauth.expect("oauth").refresh_token.expose(),
        "refresh-v1"
    );
    let snapshot = store.load_snapshot().await.expect("snapshot");
    assert_eq!(
        snapshot.account(id).expect("served").credential.expose(),
        "access-v1"
    );
    // An update without a credential keeps the stored blobs as they are.
    let mut keep = oauth_account("old");
    keep.credential = None;
    keep.priority = 3;
    assert_eq!(store.upsert_account(&keep).await.expect("update"), id);
    let account = store.load_account(id).await.expect("still loads");
    assert_eq!(
        (account.credential.expose(), account.priority),
        ("access-v1", 3)
    );
    let (credential_blob, _) = ciphertexts(&store, id).await;
    assert!(opens_as_v1(&key, &credential_blob), "untouched");
    // A new credential without a refresh token: both blobs are written bound to the row, the
    // kept refresh token sealed again.
    let mut replace = oauth_account("old");
    replace.credential = Some(Secret::new("access-new"));
    replace.oauth = Some(oauth("", 0, ""));
    assert_eq!(store.upsert_account(&replace).await.expect("update"), id);
    let account = store.load_account(id).await.expect("loads");
    assert_eq!(account.credential.expose(), "access-new");
    assert_eq!(
        account.oauth.expect("oauth").refresh_token.expose(),
        "refresh-v1"
    );
    let (credential_blob, refresh_blob) = ciphertexts(&store, id).await;
    let refresh_blob = refresh_blob.expect("refresh kept");
    let keyring = store.keyring();
    for (blob, place) in [
        (&credential_blob, BlobPlace::credential(id)),
        (&refresh_blob, BlobPlace::refresh_token(id)),
    ] {
        assert!(!opens_as_v1(&key, blob));
        assert_eq!(
            keyring.decrypt_versioned("k1", blob, place).expect("v2").1,
            BlobFormat::V2
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reencrypt_upgrades_v1_rows_and_never_overwrites_a_token_refreshed_meanwhile() {
    let postgres = poolgate_testkit::PostgresServer::start()
        .await
        .expect("postgres");
    let (k1, k2) = (Keyring::generate_key(), Keyring::generate_key());
    let store = store_with(&postgres, &format!("k1:{k1}"), None).await;
    store.migrate().await.expect("migrate");
    let legacy = store
        .upsert_account(&oauth_account("legacy"))
        .await
        .expect("legacy");
    let current = store
        .upsert_account(&api_account("current", "g"))
        .await
        .expect("current");
    let refreshed = store
        .upsert_account(&oauth_account("refreshed"))
        .await
        .expect("refreshed");
    write_v1(&store, &k1, legacy, "access-legacy", Some("refresh-legacy")).await;
    write_v1(
        &store,
        &k1,
        refreshed,
        "access-stale",
        Some("refresh-stale"),
    )
    .await;

    // reencrypt reads every row; a serving selector refreshes one token before reencrypt writes.
    let read = store.stored_ciphertexts().await.expect("read");
    assert_eq!(read.len(), 3);
    store
        .store_tokens(
            refreshed,
            &Secret::new("access-fresh"),
            &Secret::new("refresh-fresh"),
            4_000_000_000_000,
        )
        .await
        .expect("refresh written");
    let mut outcomes = Vec::new();
    for stored in &read {
        outcomes.push((
            stored.id,
            store.reencrypt_one(stored).await.expect("reencrypt"),
        ));
    }
    assert_eq!(
        outcomes,
        vec![
            (legacy, ReencryptOutcome::Upgraded),
            (current, ReencryptOutcome::AlreadyCurrent),
            (refreshed, ReencryptOutcome::ChangedMeanwhile),
        ]
    );
    let account = store.load_account(refreshed).await.expect("refreshed");
    assert_eq!(
        account.credential.expose(),
        "access-fresh",
        "the refresh is kept"
    );
    assert_eq!(
        account.oauth.expect("oauth").refresh_token.expose(),
        "refresh-fresh"
    );
    // The upgraded row is bound now: no longer a v1 blob, and useless in another row.
    let (credential_blob, refresh_blob) = ciphertexts(&store, legacy).await;
    assert!(!opens_as_v1(&k1, &credential_blob));
    assert!(!opens_as_v1(&k1, &refresh_blob.expect("refresh")));
    let account = store.load_account(legacy).await.expect("legacy");
    assert_eq!(account.credential.expose(), "access-legacy");
    assert_eq!(
        account.oauth.expect("oauth").refresh_token.expose(),
        "refresh-legacy"
    );
    sqlx::query("UPDATE accounts SET credential_ciphertext = $2 WHERE id = $1")
        .bind(current)
        .bind(&credential_blob)
        .execute(store.pool())
        .await
        .expect("move");
    let moved = store.load_account(current).await;
    assert!(
        is_unreadable(&moved, BlobPlace::credential(current)),
        "{moved:?}"
    );
    store
        .upsert_account(&api_account("current", "g"))
        .await
        .expect("repaired");

    // Rotation: every row moves to k2, and k2 alone reads them all.
    let rotating = store_with(&postgres, &format!("k1:{k1},k2:{k2}"), Some("k2")).await;
    assert_eq!(
        rotating.reencrypt_all().await.expect("rotate"),
        ReencryptReport {
            upgraded: 3,
            ..Default::default()
        }
    );
    assert_eq!(
        rotating
            .reencrypt_all()
            .await
            .expect("again")
            .already_current,
        3
    );
    let only_k2 = store_with(&postgres, &format!("k2:{k2}"), None).await;
    for (id, credential) in [
        (legacy, "access-legacy"),
        (current, "sk-ant-current-secret-credential"),
        (refreshed, "access-fresh"),
    ] {
        let account = only_k2.load_account(id).await.expect("readable with k2");
        assert_eq!(account.credential.expose(), credential);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_upserts_of_a_new_name_make_one_row_whose_blobs_fit_it() {
    let postgres = poolgate_testkit::PostgresServer::start()
        .await
        .expect("postgres");
    let store = store_with(&postgres, &format!("k1:{}", Keyring::generate_key()), None).await;
    store.migrate().await.expect("migrate");
    // Each writer takes its own id from the sequence; the losers of the insert must find the
    // winner's row and update it under that row's id, or their blobs would be bound to an id
    // the row does not have.
    // Interleaving is up to the scheduler: several rounds make a lost race likely in each run.
    for round in 0..4 {
        let name = format!("raced-{round}");
        let writers = (0..8).map(|n| {
            let (store, name) = (store.clone(), name.clone());
            async move {
                let mut input = api_account(&name, "g");
                input.credential = Some(Secret::new(format!("sk-writer-{n}")));
                store.upsert_account(&input).await
            }
        });
        let ids = futures_util::future::join_all(writers).await;
        let first = *ids[0].as_ref().expect("upsert");
        for id in &ids {
            assert_eq!(id.as_ref().expect("every upsert succeeds"), &first);
        }
        let account = store.load_account(first).await.expect("the row loads");
        assert!(account.credential.expose().starts_with("sk-writer-"));
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(store.pool())
        .await
        .expect("count");
    assert_eq!(rows, 4);
}

/// Migration 0005: a group's own usage-window thresholds load into its settings, NULL keeps the
/// deployment's, and the database refuses a share out of range or a shed threshold above the move
/// one (so no selector ever reads one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_window_thresholds_load_and_the_schema_refuses_bad_ones() {
    let (_postgres, store) = support::migrated_store().await;
    store
        .upsert_account(&api_account("a", "team"))
        .await
        .expect("account");
    store
        .upsert_account(&api_account("b", "other"))
        .await
        .expect("account");
    sqlx::query(
        "UPDATE groups SET window_shed_at = 0.8, window_move_at = 0.95 WHERE name = 'team'",
    )
    .execute(store.pool())
    .await
    .expect("thresholds set");
    let snapshot = store.load_snapshot().await.expect("snapshot");
    let team = snapshot.group_settings("team");
    assert_eq!(
        (team.window_shed_at, team.window_move_at),
        (Some(0.8), Some(0.95))
    );
    let other = snapshot.group_settings("other");
    assert_eq!((other.window_shed_at, other.window_move_at), (None, None));
    for bad in [
        "UPDATE groups SET window_shed_at = 1.5 WHERE name = 'other'",
        "UPDATE groups SET window_move_at = 0 WHERE name = 'other'",
        "UPDATE groups SET window_shed_at = 0.99, window_move_at = 0.9 WHERE name = 'other'",
    ] {
        assert!(
            sqlx::query(bad).execute(store.pool()).await.is_err(),
            "refused: {bad}"
        );
    }
}
