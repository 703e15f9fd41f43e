//! The upgrade rules, each seen failing on a broken migration text, and the directory's files
//! passing them.

use super::*;

fn release(text: &str) -> Release {
    Release::parse(text).expect("a release")
}

/// The rules the migrations break, in order, at release `this_release`.
fn broken(migrations: &[(i64, &str)], this_release: &str) -> Vec<Rule> {
    let texts: Vec<MigrationText<'_>> = migrations
        .iter()
        .map(|&(number, text)| MigrationText { number, text })
        .collect();
    check(&texts, release(this_release))
        .into_iter()
        .map(|violation| violation.rule)
        .collect()
}

fn row(number: i64, oldest: &str) -> String {
    format!(
        "INSERT INTO schema_releases (migration, oldest_release) VALUES ({number}, '{oldest}');"
    )
}

/// The migrations in `migrations/`, by the numbers their file names start with.
fn the_directory() -> Vec<(i64, String)> {
    let directory = concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations");
    let mut migrations = Vec::new();
    for entry in std::fs::read_dir(directory).expect("migrations/ reads") {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .expect("a UTF-8 file name")
            .to_owned();
        let number = name
            .strip_suffix(".sql")
            .and_then(|stem| stem.split_once('_'))
            .and_then(|(number, _)| number.parse::<i64>().ok())
            .unwrap_or_else(|| panic!("{name} is not NNNN_description.sql"));
        let text = std::fs::read_to_string(&path).expect("a migration reads");
        migrations.push((number, text));
    }
    migrations.sort();
    migrations
}

#[test]
fn every_migration_in_the_directory_follows_the_upgrade_rules() {
    let migrations = the_directory();
    let numbers: Vec<i64> = migrations.iter().map(|(number, _)| *number).collect();
    let embedded: Vec<i64> = crate::store::MIGRATOR.iter().map(|m| m.version).collect();
    assert_eq!(numbers, embedded, "the directory is what the build embeds");
    assert!(
        numbers.contains(&FIRST_RECORDING_MIGRATION),
        "migration {FIRST_RECORDING_MIGRATION:04} creates schema_releases"
    );
    let texts: Vec<MigrationText<'_>> = migrations
        .iter()
        .map(|(number, text)| MigrationText {
            number: *number,
            text,
        })
        .collect();
    let this_release = crate::release::BuildVersion::this_build()
        .expect("the workspace version is semver")
        .release;
    let violations = check(&texts, this_release);
    assert!(
        violations.is_empty(),
        "{}",
        violations
            .iter()
            .map(Violation::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Not vacuous: each recording migration's row was read.
    for (number, text) in migrations.iter().filter(|(n, _)| *n >= 9) {
        recorded_minimum(*number, &statements(text)).expect("a recorded minimum");
    }
}

#[test]
fn a_migration_from_0009_on_records_exactly_its_own_minimum() {
    let creates = "CREATE TABLE schema_releases (migration BIGINT PRIMARY KEY, \
                   oldest_release TEXT NOT NULL);";
    assert_eq!(
        broken(&[(9, &format!("{creates}\n{}", row(9, "0.1.0")))], "0.1.0"),
        []
    );
    assert_eq!(
        broken(&[(9, creates)], "0.1.0"),
        [Rule::RecordsItsMinimum],
        "no row"
    );
    assert_eq!(
        broken(&[(8, "ALTER TABLE groups ADD COLUMN x TEXT;")], "0.1.0"),
        [],
        "before 0009 there is no table to record in"
    );
    for (text, why) in [
        (row(9, "0.1.0"), "another migration's row"),
        (row(10, "v0.2"), "not a release"),
        (row(10, "0.2.0-rc.1"), "a pre-release"),
        (format!("{}{}", row(10, "0.1.0"), row(10, "0.1.0")), "two rows"),
        (
            "INSERT INTO schema_releases (migration, oldest_release) VALUES (10, '0.1.0'), (11, '0.1.0');"
                .to_owned(),
            "two rows in one insert",
        ),
        (
            format!("{}UPDATE schema_releases SET oldest_release = '0.0.1';", row(10, "0.1.0")),
            "changes an earlier row",
        ),
        (
            "INSERT INTO schema_releases SELECT 10, '0.1.0';".to_owned(),
            "an insert it cannot read",
        ),
        ("-- INSERT INTO schema_releases VALUES (10, '0.1.0');".to_owned(), "a comment"),
    ] {
        assert_eq!(
            broken(&[(10, &text)], "0.2.0"),
            [Rule::RecordsItsMinimum],
            "{why}: {text}"
        );
    }
    for text in [
        "INSERT INTO schema_releases VALUES (10, '0.1.0');",
        "insert into public.schema_releases (oldest_release, migration) values ('0.1.0', 10);",
    ] {
        assert_eq!(broken(&[(10, text)], "0.2.0"), [], "{text}");
    }
}

#[test]
fn the_minimum_never_falls_and_never_passes_this_release() {
    let (a, b) = (row(10, "0.2.0"), row(11, "0.1.0"));
    assert_eq!(
        broken(&[(10, &a), (11, &b)], "0.3.0"),
        [Rule::MinimumNeverFalls]
    );
    let same = row(11, "0.2.0");
    assert_eq!(broken(&[(10, &a), (11, &same)], "0.3.0"), []);
    assert_eq!(
        broken(&[(10, &row(10, "0.3.0"))], "0.2.9"),
        [Rule::MinimumNotPastThisRelease]
    );
    assert_eq!(broken(&[(10, &row(10, "0.2.9"))], "0.2.9"), []);
}

#[test]
fn a_new_not_null_column_needs_a_default() {
    let with = |sql: &str| format!("{sql}\n{}", row(10, "0.1.0"));
    assert_eq!(
        broken(
            &[(
                10,
                &with("ALTER TABLE accounts ADD COLUMN tier TEXT NOT NULL;")
            )],
            "0.2.0"
        ),
        [Rule::NewColumnsHaveDefaults]
    );
    assert_eq!(
        broken(
            &[(
                10,
                &with("ALTER TABLE accounts ADD COLUMN a INT CHECK (a > 0), ADD b TEXT NOT NULL;")
            )],
            "0.2.0"
        ),
        [Rule::NewColumnsHaveDefaults],
        "the second clause, without COLUMN"
    );
    for fine in [
        "ALTER TABLE accounts ADD COLUMN tier TEXT NOT NULL DEFAULT 'free';",
        "ALTER TABLE accounts ADD COLUMN tier TEXT;",
        "ALTER TABLE accounts ADD COLUMN n BIGINT GENERATED ALWAYS AS IDENTITY NOT NULL;",
        "ALTER TABLE accounts ADD CONSTRAINT c CHECK (weight IS NOT NULL);",
    ] {
        assert_eq!(broken(&[(10, &with(fine))], "0.2.0"), [], "{fine}");
    }
}

#[test]
fn every_kind_of_removal_needs_its_announcement() {
    for removal in [
        "DROP TABLE model_prices;",
        "ALTER TABLE accounts DROP COLUMN proxy_url;",
        "ALTER TABLE accounts DROP proxy_url;",
        "ALTER TABLE accounts RENAME COLUMN proxy_url TO proxy;",
        "ALTER TABLE accounts RENAME TO upstream_accounts;",
        "ALTER TABLE accounts ALTER COLUMN weight TYPE BIGINT;",
        "ALTER TABLE accounts ALTER weight SET DATA TYPE BIGINT;",
        "ALTER TABLE accounts ALTER COLUMN proxy_url SET NOT NULL;",
        "ALTER TABLE accounts ALTER COLUMN status DROP DEFAULT;",
        "ALTER TABLE accounts ALTER COLUMN token_url DROP NOT NULL;",
        "ALTER TABLE api_keys DROP CONSTRAINT api_keys_status_check;",
        "DROP TYPE platform;",
        "DROP VIEW account_view;",
        "DROP FUNCTION poolgate_notify_config();",
        "DROP INDEX usage_records_key_at;",
        "TRUNCATE usage_records;",
        "DO $$ BEGIN EXECUTE 'x'; DROP TABLE model_prices; END $$;",
        "DO $body$ BEGIN ALTER TABLE accounts RENAME COLUMN a TO b; END $body$;",
    ] {
        let text = format!("{removal}\n{}", row(10, "0.1.0"));
        assert_eq!(
            broken(&[(10, &text)], "0.2.0"),
            [Rule::RemovalsAreAnnounced],
            "{removal}"
        );
        let announced = format!(
            "-- removes: what it removes, unread since 0.1.0\n{removal}\n{}",
            row(10, "0.1.0")
        );
        assert_eq!(broken(&[(10, &announced)], "0.2.0"), [], "{removal}");
    }
}

#[test]
fn what_only_looks_like_a_removal_is_not_one() {
    for fine in [
        // Widening a check: dropped and added again under its name.
        "ALTER TABLE api_keys DROP CONSTRAINT api_keys_status_check;\n\
         ALTER TABLE api_keys ADD CONSTRAINT api_keys_status_check\n\
             CHECK (status IN ('active', 'disabled', 'revoked', 'paused'));",
        "ALTER TABLE api_keys DROP CONSTRAINT IF EXISTS c, ADD CONSTRAINT c CHECK (true);",
        // A column this migration adds, filled, then made NOT NULL.
        "ALTER TABLE accounts ADD COLUMN tier TEXT;\n\
         UPDATE accounts SET tier = 'free';\n\
         ALTER TABLE accounts ALTER COLUMN tier SET NOT NULL;",
        "-- DROP TABLE accounts;\nSELECT 1;",
        "/* DROP TABLE accounts; /* nested */ RENAME */ SELECT 1;",
        "UPDATE accounts SET status_reason = 'drop table; rename';",
        "ALTER TABLE usage_records ADD COLUMN dropped_at TIMESTAMPTZ;",
        "ALTER TABLE accounts ALTER COLUMN weight SET DEFAULT 2;",
        "ALTER TYPE platform ADD VALUE 'gemini';",
    ] {
        let text = format!("{fine}\n{}", row(10, "0.1.0"));
        assert_eq!(broken(&[(10, &text)], "0.2.0"), [], "{fine}");
    }
}

#[test]
fn a_removal_raises_the_minimum_to_a_release_before_this_one() {
    let additive = row(10, "0.1.0");
    let removal = |oldest: &str, since: &str| {
        format!(
            "-- removes: accounts.proxy_url, unread since {since}\n\
             ALTER TABLE accounts DROP COLUMN proxy_url;\n{}",
            row(11, oldest)
        )
    };
    assert_eq!(
        broken(
            &[(10, &additive), (11, &removal("0.2.0", "0.2.0"))],
            "0.3.0"
        ),
        [],
        "0.2.0 stopped reading it, 0.3.0 drops it and 0.2.0 still runs"
    );
    assert_eq!(
        broken(
            &[(10, &additive), (11, &removal("0.1.0", "0.2.0"))],
            "0.3.0"
        ),
        [Rule::RemovalRaisesTheMinimum],
        "0.1.0 would still start on a schema without a column it reads"
    );
    assert_eq!(
        broken(
            &[(10, &additive), (11, &removal("0.3.0", "0.3.0"))],
            "0.3.0"
        ),
        [Rule::RemovalsComeAReleaseLater],
        "stopping reading and dropping in one release breaks the rolling upgrade from 0.2.0"
    );
    assert_eq!(
        broken(
            &[(
                8,
                "-- removes: accounts.proxy_url, unread since 0.0.1\n\
                 ALTER TABLE accounts DROP COLUMN proxy_url;"
            )],
            "0.1.0"
        ),
        [Rule::RemovalRaisesTheMinimum],
        "before 0009 no minimum is recorded"
    );
    for malformed in [
        "-- removes: accounts.proxy_url\n",
        "-- removes: accounts.proxy_url, unread since 0.2\n",
        "-- removes: , unread since 0.2.0\n",
    ] {
        let text = format!(
            "{malformed}ALTER TABLE accounts DROP COLUMN proxy_url;\n{}",
            row(11, "0.2.0")
        );
        let rules = broken(&[(10, &additive), (11, &text)], "0.3.0");
        assert!(
            rules.iter().all(|rule| *rule == Rule::RemovalsAreAnnounced) && rules.len() == 2,
            "{malformed}: {rules:?}"
        );
    }
}

#[test]
fn a_violation_names_its_migration_and_what_to_do() {
    let texts = [MigrationText {
        number: 12,
        text: "ALTER TABLE accounts DROP COLUMN proxy_url;",
    }];
    let messages: Vec<String> = check(&texts, release("0.3.0"))
        .iter()
        .map(Violation::to_string)
        .collect();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(
        messages[0].starts_with("migration 0012 (RecordsItsMinimum)")
            && messages[0].contains("VALUES (12, 'X.Y.Z')"),
        "{}",
        messages[0]
    );
    assert!(
        messages[1].contains("drop column proxy_url") && messages[1].contains("unread since"),
        "{}",
        messages[1]
    );
}
