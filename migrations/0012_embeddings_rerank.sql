-- poolgate selector schema, version 12: embeddings and rerank (docs/DESIGN.md §6, "Embeddings and
-- rerank"). Additive only (DESIGN §8): a wider platform check (the rerank platform: Cohere's
-- format, API keys), what an account serves when less than its platform can (NULL or empty:
-- all it can), a price per search unit beside the per-token prices, and the two new endpoint
-- names a client key's list may hold. A 0.1.0 selector on this schema leaves a rerank account out
-- of its snapshot and a key's newer endpoint names out of its list, and does not read `serves`:
-- set it once every selector runs a release that does (DESIGN §8, "Enum values across
-- releases").
--   UPDATE accounts SET serves = ARRAY['chat'] WHERE name = 'deepseek';  -- no embeddings there
ALTER TABLE accounts DROP CONSTRAINT accounts_platform_check;
ALTER TABLE accounts ADD CONSTRAINT accounts_platform_check
    CHECK (platform IN ('anthropic', 'openai', 'rerank'));
ALTER TABLE accounts
    ADD COLUMN serves TEXT[],
    ADD CONSTRAINT accounts_serves_check
        CHECK (serves <@ ARRAY['chat', 'embeddings', 'rerank']::TEXT[]
               AND array_position(serves, NULL) IS NULL);
ALTER TABLE model_prices
    ADD COLUMN per_search_unit DOUBLE PRECISION NOT NULL DEFAULT 0
        CHECK (per_search_unit >= 0);
-- A group's rerank requests that no account can serve get the recall order (DESIGN §6):
--   UPDATE groups SET rerank_passthrough = true WHERE name = 'search';
ALTER TABLE groups ADD COLUMN rerank_passthrough BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE api_keys DROP CONSTRAINT api_keys_allowed_endpoints_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_allowed_endpoints_check
    CHECK (allowed_endpoints <@ ARRAY['messages', 'count_tokens', 'chat_completions',
                                      'responses', 'models', 'embeddings', 'rerank']::TEXT[]
           AND array_position(allowed_endpoints, NULL) IS NULL);
INSERT INTO schema_releases (migration, oldest_release) VALUES (12, '0.1.0');
