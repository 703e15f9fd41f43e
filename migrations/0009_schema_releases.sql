-- poolgate selector schema, version 9: the oldest release that runs on each schema, so a rolling
-- upgrade keeps the previous release's selectors starting on the schema the new release's
-- `selector-svc migrate` (the chart's pre-upgrade hook) produced. A selector accepts a schema
-- newer than it knows when its release is at least the row of the newest migration applied, and
-- refuses it otherwise, naming both. Every later migration inserts its own row: an additive one
-- keeps the previous minimum, one that drops, renames or retypes what an older release reads
-- raises it to the first release that no longer reads it, announced in the migration as
-- `removes: <what>, unread since X.Y.Z` (the rules selector-svc's `migration_rules` tests hold).
--   SELECT migration, oldest_release FROM schema_releases ORDER BY migration;
-- 0.1.0 is the first release: its schema is migrations 1 to 9.
CREATE TABLE schema_releases (
    migration       BIGINT PRIMARY KEY CHECK (migration >= 9),
    oldest_release  TEXT NOT NULL
                    CHECK (oldest_release ~ '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$')
);
INSERT INTO schema_releases (migration, oldest_release) VALUES (9, '0.1.0');
