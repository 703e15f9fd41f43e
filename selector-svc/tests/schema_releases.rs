//! The schema across releases, against a real Postgres: a selector starts on a schema a newer
//! release migrated when its release is at least the oldest release that schema's newest
//! migration records, and its `migrate` (the chart's hook) leaves such a schema alone; a newer
//! schema needing a later release, or recording none, is refused naming both, as is one behind
//! this build.

use crate::support;

use std::process::{Command, Output};
use std::sync::Arc;

use poolgate_select::crypto::Keyring;
use poolgate_testkit::PostgresServer;
use selector_svc::release::Release;
use selector_svc::store::{
    MIGRATOR, PostgresSource, SchemaStatus, StoreError, known_schema_version,
};
use support::api_account;

/// A private Postgres, the store on it and the key ring it was opened with (as the binary's
/// `POOLGATE_CREDENTIAL_KEYS`).
async fn database() -> (PostgresServer, PostgresSource, String) {
    let postgres = PostgresServer::start().await.expect("postgres");
    let keys = format!("k1:{}", Keyring::generate_key());
    let keyring = Arc::new(Keyring::parse(&keys, None).expect("keyring"));
    let store = PostgresSource::connect(&postgres.url(), keyring)
        .await
        .expect("connect");
    (postgres, store, keys)
}

/// What a newer release's `migrate` leaves: its migration `version` applied as sqlx applies one,
/// in one transaction: its statements (an additive column), its `schema_releases` row, and the
/// `_sqlx_migrations` row with a SHA-384 checksum (48 bytes) this build cannot know.
async fn apply_a_newer_release_migration(store: &PostgresSource, version: i64, oldest: &str) {
    let mut tx = store.pool().begin().await.expect("begin");
    sqlx::query("ALTER TABLE groups ADD COLUMN future_setting BOOLEAN NOT NULL DEFAULT false")
        .execute(&mut *tx)
        .await
        .expect("the newer release's change");
    sqlx::query("INSERT INTO schema_releases (migration, oldest_release) VALUES ($1, $2)")
        .bind(version)
        .bind(oldest)
        .execute(&mut *tx)
        .await
        .expect("its schema_releases row");
    record_applied(&mut tx, version).await;
    tx.commit().await.expect("commit");
}

/// `_sqlx_migrations`' row for an applied migration `version`, as sqlx writes it.
async fn record_applied(connection: &mut sqlx::PgConnection, version: i64) {
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, 'future setting', TRUE, $2, 1234567)",
    )
    .bind(version)
    .bind(vec![0xa5_u8; 48])
    .execute(connection)
    .await
    .expect("the migration's row");
}

/// Every applied migration with its checksum and success, and the newer release's column: what
/// an older release's `migrate` must leave as it is.
async fn schema_state(store: &PostgresSource) -> (Vec<(i64, Vec<u8>, bool)>, bool) {
    let applied =
        sqlx::query_as("SELECT version, checksum, success FROM _sqlx_migrations ORDER BY version")
            .fetch_all(store.pool())
            .await
            .expect("applied migrations");
    let column: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns \
         WHERE table_name = 'groups' AND column_name = 'future_setting')",
    )
    .fetch_one(store.pool())
    .await
    .expect("columns");
    (applied, column)
}

/// `selector-svc migrate`, the command the chart's hook runs, on the database.
fn migrate_command(postgres: &PostgresServer, keys: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_selector-svc"))
        .arg("migrate")
        .env("POOLGATE_DATABASE_URL", postgres.url())
        .env("POOLGATE_CREDENTIAL_KEYS", keys)
        .env_remove("POOLGATE_CREDENTIAL_KEYS_FILE")
        .env_remove("POOLGATE_CREDENTIAL_KEY_ID")
        .output()
        .expect("selector-svc runs")
}

fn this_release() -> Release {
    selector_svc::release::BuildVersion::this_build()
        .expect("semver")
        .release
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migrated_schema_records_its_oldest_release_and_is_current() {
    let (_postgres, store, _) = database().await;
    let known = known_schema_version();
    assert_eq!(
        store.migrate().await.expect("migrate"),
        SchemaStatus::Current { version: known }
    );
    assert_eq!(
        store.check_schema().await.expect("the migrated schema"),
        SchemaStatus::Current { version: known }
    );
    let rows: Vec<(i64, String)> =
        sqlx::query_as("SELECT migration, oldest_release FROM schema_releases ORDER BY migration")
            .fetch_all(store.pool())
            .await
            .expect("schema_releases");
    assert_eq!(rows.first(), Some(&(9, "0.1.0".to_owned())));
    let (newest, oldest) = rows.last().expect("a row");
    assert_eq!(*newest, known, "the newest migration recorded its row");
    assert!(
        Release::parse(oldest).expect("X.Y.Z") <= this_release(),
        "this build runs on its own schema"
    );
    for malformed in ["v1.0.0", "1.0", "01.0.0", "1.0.0-rc.1"] {
        let refused = sqlx::query("INSERT INTO schema_releases VALUES ($1, $2)")
            .bind(known + 1)
            .bind(malformed)
            .execute(store.pool())
            .await;
        assert!(refused.is_err(), "{malformed} is not a release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_selector_starts_and_migrates_on_a_newer_schema_that_still_runs_its_release() {
    let (postgres, store, keys) = database().await;
    store.migrate().await.expect("migrate");
    let known = known_schema_version();
    let newer = known + 1;
    apply_a_newer_release_migration(&store, newer, "0.1.0").await;
    let expected = SchemaStatus::Newer {
        found: newer,
        known,
        oldest_release: Release::parse("0.1.0").expect("release"),
    };
    assert_eq!(
        store.check_schema().await.expect("this release runs on it"),
        expected
    );
    // It serves on it: the snapshot loads, and its writes leave the new column to its default.
    let id = store
        .upsert_account(&api_account("still-served", "g"))
        .await
        .expect("an admin write");
    let snapshot = store.load_snapshot().await.expect("the snapshot");
    assert!(snapshot.account(id).is_some());

    let before = schema_state(&store).await;
    assert_eq!(
        store.migrate().await.expect("migrate leaves it alone"),
        expected
    );
    let command = migrate_command(&postgres, &keys);
    let stdout = String::from_utf8_lossy(&command.stdout);
    assert!(
        command.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&command.stderr)
    );
    assert!(
        stdout.contains(&format!("schema version {newer} is newer"))
            && stdout.contains("nothing applied"),
        "{stdout}"
    );
    assert_eq!(
        schema_state(&store).await,
        before,
        "nothing applied or removed"
    );
    assert!(before.1, "the newer release's column is there");
    assert_eq!(
        store.check_schema().await.expect("still accepted"),
        expected
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_selector_refuses_a_newer_schema_that_needs_a_later_release_naming_both() {
    let (postgres, store, keys) = database().await;
    store.migrate().await.expect("migrate");
    let known = known_schema_version();
    let newer = known + 1;
    apply_a_newer_release_migration(&store, newer, "9.0.0").await;
    let this = env!("CARGO_PKG_VERSION");
    let names_both = |message: &str| {
        message.contains(&format!("migration {newer} runs releases from 9.0.0 on"))
            && message.contains(&format!("this selector is release {this}"))
    };
    match store.check_schema().await {
        Err(error @ StoreError::Schema { .. }) => {
            assert!(names_both(&error.to_string()), "{error}")
        }
        other => panic!("a schema needing 9.0.0 must be refused, got {other:?}"),
    }
    let before = schema_state(&store).await;
    match store.migrate().await {
        Err(error @ StoreError::Schema { .. }) => {
            assert!(names_both(&error.to_string()), "{error}")
        }
        other => panic!("migrate must refuse it too, got {other:?}"),
    }
    let command = migrate_command(&postgres, &keys);
    let stderr = String::from_utf8_lossy(&command.stderr);
    assert_eq!(command.status.code(), Some(1), "{stderr}");
    assert!(names_both(&stderr), "{stderr}");
    assert_eq!(
        schema_state(&store).await,
        before,
        "nothing applied or removed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_without_its_oldest_release_is_refused() {
    let (_postgres, store, _) = database().await;
    store.migrate().await.expect("migrate");
    let newer = known_schema_version() + 1;
    let mut connection = store.pool().acquire().await.expect("a connection");
    record_applied(&mut connection, newer).await;
    drop(connection);
    for result in [store.check_schema().await, store.migrate().await] {
        match result {
            Err(error @ StoreError::Schema { .. }) => {
                let message = error.to_string();
                assert!(
                    message.contains(&format!(
                        "migration {newer} recorded no oldest release in schema_releases"
                    )),
                    "{message}"
                )
            }
            other => panic!("an unrecorded newer schema must be refused, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_behind_this_build_is_refused_until_migrated() {
    let (_postgres, store, _) = database().await;
    let known = known_schema_version();
    MIGRATOR
        .run_to(8, store.pool())
        .await
        .expect("the schema before schema_releases");
    match store.check_schema().await {
        Err(StoreError::Schema {
            found: 8,
            known: k,
            hint,
        }) if k == known => assert!(hint.contains("run `selector-svc migrate` first"), "{hint}"),
        other => panic!("a schema behind this build must be refused, got {other:?}"),
    }
    assert_eq!(
        store.migrate().await.expect("migrate"),
        SchemaStatus::Current { version: known }
    );
    store.check_schema().await.expect("migrated");
}
