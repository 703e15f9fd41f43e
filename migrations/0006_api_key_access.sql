-- poolgate selector schema, version 6: what a client key may reach (docs/DESIGN.md §6, "What a
-- client key reaches"): an expiry, an operator's disable (lifted again without a new key; a
-- revoked key is gone), and lists of allowed models (glob `*` patterns on the model the client
-- asks for) and endpoints. NULL and empty lists mean no limit, so every existing key keeps
-- today's behaviour. Set them with `selector-svc admin update-key` (the `UpdateApiKey` RPC):
--   selector-svc admin disable-key 7
--   selector-svc admin update-key 7 --enable --expires-at 2026-12-31T00:00:00Z --models 'claude-*'
-- (the api_keys trigger notifies `poolgate_config`: selectors reload within a second).
ALTER TABLE api_keys DROP CONSTRAINT api_keys_status_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_status_check
    CHECK (status IN ('active', 'disabled', 'revoked'));
ALTER TABLE api_keys
    ADD COLUMN expires_at TIMESTAMPTZ,
    ADD COLUMN allowed_models TEXT[] NOT NULL DEFAULT '{}',
    ADD COLUMN allowed_endpoints TEXT[] NOT NULL DEFAULT '{}',
    -- The same bounds the admin API checks (`poolgate_core::keys::check_model_patterns`).
    ADD CONSTRAINT api_keys_allowed_models_check
        CHECK (cardinality(allowed_models) <= 256
               AND array_position(allowed_models, NULL) IS NULL),
    -- The endpoint names the relay knows (`poolgate_core::keys::Endpoint`); a row with any other
    -- name is refused here, so a selector never loads one it would have to guess about.
    ADD CONSTRAINT api_keys_allowed_endpoints_check
        CHECK (allowed_endpoints <@ ARRAY['messages', 'count_tokens', 'chat_completions',
                                          'responses', 'models']::TEXT[]
               AND array_position(allowed_endpoints, NULL) IS NULL);
