-- poolgate selector schema, version 11: each usage record says which price its cost was charged
-- at (docs/DESIGN.md §6, "Prices"): `operator` (a `model_prices` row), `catalogue` (the price
-- catalogue shipped with the build), `fallback` (the model had neither: its family's highest
-- catalogue price) or `none` (no price: charged $0). NULL: a record an older relay or selector
-- wrote, which did not say. Additive: older selectors leave the column out of their inserts.
--   SELECT model, price_source, count(*), sum(cost_usd) FROM usage_records
--   WHERE at > now() - interval '1 day' GROUP BY 1, 2;
ALTER TABLE usage_records ADD COLUMN price_source TEXT
    CHECK (price_source IN ('operator', 'catalogue', 'fallback', 'none'));
INSERT INTO schema_releases (migration, oldest_release) VALUES (11, '0.1.0');
