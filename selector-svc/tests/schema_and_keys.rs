//! The schema check and key rotation, against a real Postgres.

mod support;

use std::sync::Arc;

use selector_svc::crypto::Keyring;
use selector_svc::store::{ConfigStore, StoreError, known_schema_version};
use support::api_account;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_selector_refuses_a_schema_it_does_not_know() {
    let postgres = poolgate_testkit::PostgresServer::start()
        .await
        .expect("postgres");
    let keyring = Arc::new(
        Keyring::parse(&format!("k1:{}", Keyring::generate_key()), None).expect("keyring"),
    );
    let store = ConfigStore::connect(&postgres.url(), keyring)
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
    match store.check_schema().await {
        Err(error @ StoreError::Schema { .. }) => {
            assert!(error.to_string().contains("newer"), "{error}")
        }
        other => panic!("a newer schema must be refused, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reencrypt_moves_every_credential_to_the_active_key() {
    let postgres = poolgate_testkit::PostgresServer::start()
        .await
        .expect("postgres");
    let (k1, k2) = (Keyring::generate_key(), Keyring::generate_key());
    let old = Arc::new(Keyring::parse(&format!("k1:{k1}"), None).expect("keyring"));
    let store = ConfigStore::connect(&postgres.url(), old)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let id = store
        .upsert_account(&api_account("rotated", "g"))
        .await
        .expect("account");
    let both = Arc::new(Keyring::parse(&format!("k1:{k1},k2:{k2}"), Some("k2")).expect("keyring"));
    let rotating = ConfigStore::connect(&postgres.url(), both)
        .await
        .expect("connect");
    assert_eq!(rotating.reencrypt_all().await.expect("reencrypt"), 1);
    assert_eq!(
        rotating.reencrypt_all().await.expect("again"),
        0,
        "nothing left on the old key"
    );
    let only_new = Arc::new(Keyring::parse(&format!("k2:{k2}"), None).expect("keyring"));
    let after = ConfigStore::connect(&postgres.url(), only_new)
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
