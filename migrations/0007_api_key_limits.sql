-- poolgate selector schema, version 7: a client key's own limits, counted by admission
-- (docs/DESIGN.md §4, "Client key limits"; §6, "What a client key reaches"): requests in flight at
-- once, tokens per rolling minute, and spend budgets in USD in total and per calendar day, week
-- and month (the deployment's time zone and week start). 0 means no limit, so every existing key
-- keeps today's behaviour. Set them with `selector-svc admin update-key` (the `UpdateApiKey` RPC):
--   selector-svc admin update-key 7 --concurrency 2 --tpm 100000 --budget-day 5 --budget-month 50
-- (the api_keys trigger notifies `poolgate_config`: selectors reload within a second). Spend is
-- counted in Redis; the selector rebuilds a lost counter from `usage_records`.
ALTER TABLE api_keys
    ADD COLUMN concurrency_limit INTEGER NOT NULL DEFAULT 0
        CONSTRAINT api_keys_concurrency_limit_check CHECK (concurrency_limit >= 0),
    ADD COLUMN tpm_limit BIGINT NOT NULL DEFAULT 0
        CONSTRAINT api_keys_tpm_limit_check CHECK (tpm_limit >= 0),
    -- The same bound the admin API checks (`poolgate_core::money::MAX_SPEND_USD`); NaN is refused
    -- too (in Postgres NaN compares greater than every number).
    ADD COLUMN budget_total_usd DOUBLE PRECISION NOT NULL DEFAULT 0
        CONSTRAINT api_keys_budget_total_usd_check
            CHECK (budget_total_usd >= 0 AND budget_total_usd <= 1000000),
    ADD COLUMN budget_day_usd DOUBLE PRECISION NOT NULL DEFAULT 0
        CONSTRAINT api_keys_budget_day_usd_check
            CHECK (budget_day_usd >= 0 AND budget_day_usd <= 1000000),
    ADD COLUMN budget_week_usd DOUBLE PRECISION NOT NULL DEFAULT 0
        CONSTRAINT api_keys_budget_week_usd_check
            CHECK (budget_week_usd >= 0 AND budget_week_usd <= 1000000),
    ADD COLUMN budget_month_usd DOUBLE PRECISION NOT NULL DEFAULT 0
        CONSTRAINT api_keys_budget_month_usd_check
            CHECK (budget_month_usd >= 0 AND budget_month_usd <= 1000000);
