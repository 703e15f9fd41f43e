//! The schema a selector runs on: `selector-svc migrate`, and the check every selector makes at
//! start. Operators upgrade one service at a time while it serves, and the Helm chart migrates
//! before the new pods start, so a selector of the previous release restarts on a schema newer
//! than it knows. Each migration from 0009 on records the oldest release that runs on the schema
//! it produces (`schema_releases`; the rules are `migration_rules.rs`'s): a newer schema is
//! accepted when this build is that release or later, refused otherwise, naming both.

use std::cmp::Ordering;

use sqlx::migrate::{MigrateError, Migrator};

use super::{MIGRATOR, PostgresSource, StoreError, convert, known_schema_version};
use crate::release::{BuildVersion, Release};

/// A schema this build runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaStatus {
    /// The schema this build migrates to.
    Current { version: i64 },
    /// A newer release migrated it (to `found`, past this build's `known`); its newest migration
    /// runs releases from `oldest_release` on, this build among them.
    Newer {
        found: i64,
        known: i64,
        oldest_release: Release,
    },
}

/// Postgres' "undefined table": the migrations table or `schema_releases` is not there.
const UNDEFINED_TABLE: &str = "42P01";

impl PostgresSource {
    /// Applies the migrations this build knows that the database lacks.
    ///
    /// On a schema a newer release migrated it applies nothing and leaves the newer migrations
    /// alone (sqlx's migrator would fail on applied migrations it does not know): it succeeds when
    /// this build runs on the schema, so a previous release's migrate job (a downgrade through
    /// the chart's hook) does not stop a rollout the schema allows; and fails as `check_schema`
    /// refuses when it does not, before any pod of a release too old for the schema is started.
    pub async fn migrate(&self) -> Result<SchemaStatus, StoreError> {
        let known = known_schema_version();
        let found = self.applied_version().await?;
        if found <= known {
            MIGRATOR.run(&self.pool).await.map_err(migration_failed)?;
            return Ok(SchemaStatus::Current { version: known });
        }
        let status = self.newer_schema(found, known).await?;
        self.refuse_unknown_migrations_below(known).await?;
        // Still run, tolerating the newer migrations: it checks under the migration lock that
        // every migration this build knows is applied with its checksum (an edited migration
        // fails here as on any other run).
        let mut tolerant = Migrator::with_migrations(MIGRATOR.iter().cloned().collect());
        tolerant.set_ignore_missing(true);
        tolerant.run(&self.pool).await.map_err(migration_failed)?;
        Ok(status)
    }

    /// Refuses a schema this build cannot run on: an older one (run `migrate`), or a newer one
    /// whose newest migration needs a later release than this build (or records none). A newer
    /// schema this build runs on is accepted, with an info log.
    pub async fn check_schema(&self) -> Result<SchemaStatus, StoreError> {
        let known = known_schema_version();
        let found = self.applied_version().await?;
        match found.cmp(&known) {
            Ordering::Equal => Ok(SchemaStatus::Current { version: known }),
            Ordering::Less => Err(StoreError::Schema {
                found,
                known,
                hint: "run `selector-svc migrate` first".to_owned(),
            }),
            Ordering::Greater => self.newer_schema(found, known).await,
        }
    }

    /// The newest migration applied (0 on an empty database).
    async fn applied_version(&self) -> Result<i64, StoreError> {
        let found: Option<i64> =
            sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
                .fetch_one(&self.pool)
                .await
                .or_else(|error| match &error {
                    // No migrations table at all: an empty database.
                    sqlx::Error::Database(db) if db.code().as_deref() == Some(UNDEFINED_TABLE) => {
                        Ok(None)
                    }
                    _ => Err(convert(error)),
                })?;
        Ok(found.unwrap_or(0))
    }

    /// A schema at `found`, past this build's `known`: accepted when this build meets the oldest
    /// release its newest migration records.
    async fn newer_schema(&self, found: i64, known: i64) -> Result<SchemaStatus, StoreError> {
        let recorded: Option<String> =
            sqlx::query_scalar("SELECT oldest_release FROM schema_releases WHERE migration = $1")
                .bind(found)
                .fetch_optional(&self.pool)
                .await
                .or_else(|error| match &error {
                    // Only a hand-made database lacks the table past migration 0009.
                    sqlx::Error::Database(db) if db.code().as_deref() == Some(UNDEFINED_TABLE) => {
                        Ok(None)
                    }
                    _ => Err(convert(error)),
                })?;
        let this_release = env!("CARGO_PKG_VERSION");
        let oldest_release = judge_newer(found, known, recorded.as_deref(), this_release)?;
        tracing::info!(
            schema_version = found,
            known_version = known,
            %oldest_release,
            this_release,
            "database schema is newer than this selector; it runs releases from \
             {oldest_release} on, this one among them"
        );
        Ok(SchemaStatus::Newer {
            found,
            known,
            oldest_release,
        })
    }

    /// Refuses applied migrations numbered within this build's range that it does not know (from
    /// another lineage): the tolerant run ignores every migration it does not know, so these are
    /// checked first.
    async fn refuse_unknown_migrations_below(&self, known: i64) -> Result<(), StoreError> {
        let applied: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE version <= $1")
                .bind(known)
                .fetch_all(&self.pool)
                .await
                .map_err(convert)?;
        match applied
            .into_iter()
            .find(|version| !MIGRATOR.iter().any(|m| m.version == *version))
        {
            Some(version) => Err(migration_failed(MigrateError::VersionMissing(version))),
            None => Ok(()),
        }
    }
}

fn migration_failed(error: MigrateError) -> StoreError {
    StoreError::Unavailable(format!("migration failed: {error}"))
}

/// Whether release `this_release` runs on a schema at `found`, newer than its own `known`, whose
/// newest migration records `recorded` as the oldest release that runs on it: that release, or a
/// refusal naming the migration, the release it needs and this one.
fn judge_newer(
    found: i64,
    known: i64,
    recorded: Option<&str>,
    this_release: &str,
) -> Result<Release, StoreError> {
    let refuse = |hint: String| StoreError::Schema { found, known, hint };
    let Some(text) = recorded else {
        return Err(refuse(format!(
            "a newer release migrated it, but migration {found} recorded no oldest release in \
             schema_releases, so whether release {this_release} runs on it is unknown; upgrade \
             this selector"
        )));
    };
    let Some(oldest) = Release::parse(text) else {
        return Err(refuse(format!(
            "migration {found} records oldest release {text:?}, not an X.Y.Z release; upgrade \
             this selector"
        )));
    };
    let Some(build) = BuildVersion::parse(this_release) else {
        return Err(refuse(format!(
            "migration {found} runs releases from {oldest} on, and this selector's version \
             {this_release:?} is not semver"
        )));
    };
    if build.meets(oldest) {
        Ok(oldest)
    } else {
        Err(refuse(format!(
            "migration {found} runs releases from {oldest} on and this selector is release \
             {this_release}; upgrade it"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(result: Result<Release, StoreError>) -> String {
        match result {
            Err(StoreError::Schema { found, known, hint }) => {
                assert_eq!((found, known), (11, 10));
                hint
            }
            other => panic!("a schema refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_newer_schema_runs_a_release_at_or_after_its_recorded_minimum() {
        let release = |text| Release::parse(text).expect("a release");
        assert_eq!(
            judge_newer(11, 10, Some("0.1.0"), "0.1.0").ok(),
            Some(release("0.1.0"))
        );
        assert_eq!(
            judge_newer(11, 10, Some("0.1.0"), "0.2.0").ok(),
            Some(release("0.1.0"))
        );
        assert_eq!(
            judge_newer(11, 10, Some("0.2.0"), "0.10.0").ok(),
            Some(release("0.2.0")),
            "compared as numbers, not text"
        );
    }

    #[test]
    fn a_newer_schema_needing_a_later_release_is_refused_naming_both() {
        let refused = hint(judge_newer(11, 10, Some("0.2.0"), "0.1.0"));
        assert!(
            refused.contains("migration 11")
                && refused.contains("0.2.0")
                && refused.contains("release 0.1.0"),
            "{refused}"
        );
        let rc = hint(judge_newer(11, 10, Some("0.2.0"), "0.2.0-rc.1"));
        assert!(
            rc.contains("0.2.0-rc.1"),
            "a pre-release is before its release: {rc}"
        );
        let unrecorded = hint(judge_newer(11, 10, None, "0.1.0"));
        assert!(
            unrecorded.contains("recorded no oldest release"),
            "{unrecorded}"
        );
        let garbled = hint(judge_newer(11, 10, Some("latest"), "0.1.0"));
        assert!(garbled.contains("\"latest\""), "{garbled}");
    }
}
