-- poolgate selector schema, version 13: usage retention (docs/DESIGN.md §6, "Usage retention").
-- The selector folds usage records older than its retention (`--usage-retention-days`, default
-- 90) into each key's all-time totals here, per model and price source, and deletes them, in
-- one statement per batch; the `total` period (and its budget, rebuilt after a Redis wipe) reads
-- these rows with the records left, so a total stays what it was. The calendar periods (day,
-- week, month) are younger than any retention the selector takes. `price_source` is '' where the
-- records said none. Additive: a 0.1.0 selector reads records only (and folds nothing), so a
-- total it sums after a fold misses what was folded.
--   SELECT api_key_id, sum(cost_usd), max(folded_through) FROM usage_rollups GROUP BY 1;
CREATE TABLE usage_rollups (
    api_key_id     BIGINT NOT NULL,
    model          TEXT NOT NULL,
    price_source   TEXT NOT NULL DEFAULT '',
    requests       BIGINT NOT NULL DEFAULT 0,
    input_tokens   BIGINT NOT NULL DEFAULT 0,
    output_tokens  BIGINT NOT NULL DEFAULT 0,
    cost_usd       DOUBLE PRECISION NOT NULL DEFAULT 0,
    -- The newest folded record's time.
    folded_through TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (api_key_id, model, price_source)
);
INSERT INTO schema_releases (migration, oldest_release) VALUES (13, '0.1.0');
