-- poolgate selector schema, version 1: groups, accounts, client API keys, model prices, usage.
-- Config tables notify `poolgate_config` on every change so selectors reload within a second.

CREATE TABLE groups (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 128),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE accounts (
    id                        BIGSERIAL PRIMARY KEY,
    name                      TEXT NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 128),
    group_id                  BIGINT NOT NULL REFERENCES groups (id),
    platform                  TEXT NOT NULL CHECK (platform IN ('anthropic', 'openai')),
    base_url                  TEXT NOT NULL,
    credential_kind           TEXT NOT NULL CHECK (credential_kind IN ('api_key', 'oauth')),
    -- AES-256-GCM: nonce (12 bytes) || ciphertext, under the key named by credential_key_id.
    credential_ciphertext     BYTEA NOT NULL,
    credential_key_id         TEXT NOT NULL,
    -- OAuth: the refresh token (encrypted the same way), access token expiry, token endpoint.
    refresh_token_ciphertext  BYTEA,
    expires_at                TIMESTAMPTZ,
    token_url                 TEXT,
    status                    TEXT NOT NULL DEFAULT 'active'
                              CHECK (status IN ('active', 'disabled', 'error', 'retired')),
    status_reason             TEXT NOT NULL DEFAULT '',
    status_changed_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    priority                  INTEGER NOT NULL DEFAULT 0,
    weight                    INTEGER NOT NULL DEFAULT 1 CHECK (weight >= 1),
    concurrency_limit         INTEGER NOT NULL DEFAULT 0,
    rpm_limit                 INTEGER NOT NULL DEFAULT 0,
    session_window_limit_usd  DOUBLE PRECISION NOT NULL DEFAULT 0,
    allowed_models            TEXT[] NOT NULL DEFAULT '{}',
    model_mapping             JSONB NOT NULL DEFAULT '{}',
    proxy_url                 TEXT,
    created_at                TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at                TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id              BIGSERIAL PRIMARY KEY,
    name            TEXT NOT NULL DEFAULT '',
    -- SHA-256 of the key; the key itself is shown once and never stored.
    key_hash        BYTEA NOT NULL UNIQUE,
    key_prefix      TEXT NOT NULL,
    user_name       TEXT NOT NULL CHECK (length(user_name) BETWEEN 1 AND 128),
    group_id        BIGINT NOT NULL REFERENCES groups (id),
    user_rpm_limit  INTEGER NOT NULL DEFAULT 0,
    status          TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'revoked')),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE model_prices (
    model                 TEXT PRIMARY KEY,
    input_per_mtok        DOUBLE PRECISION NOT NULL DEFAULT 0,
    output_per_mtok       DOUBLE PRECISION NOT NULL DEFAULT 0,
    cache_write_per_mtok  DOUBLE PRECISION NOT NULL DEFAULT 0,
    cache_read_per_mtok   DOUBLE PRECISION NOT NULL DEFAULT 0
);

CREATE TABLE usage_records (
    id                  BIGSERIAL PRIMARY KEY,
    at                  TIMESTAMPTZ NOT NULL DEFAULT now(),
    api_key_id          BIGINT,
    user_name           TEXT NOT NULL DEFAULT '',
    account_id          BIGINT,
    model               TEXT NOT NULL DEFAULT '',
    input_tokens        BIGINT NOT NULL DEFAULT 0,
    output_tokens       BIGINT NOT NULL DEFAULT 0,
    cache_write_tokens  BIGINT NOT NULL DEFAULT 0,
    cache_read_tokens   BIGINT NOT NULL DEFAULT 0,
    cost_usd            DOUBLE PRECISION NOT NULL DEFAULT 0,
    status              INTEGER NOT NULL DEFAULT 0,
    latency_ms          INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX usage_records_key_at ON usage_records (api_key_id, at);

CREATE FUNCTION poolgate_notify_config() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('poolgate_config', TG_TABLE_NAME);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER groups_notify AFTER INSERT OR UPDATE OR DELETE ON groups
    FOR EACH STATEMENT EXECUTE FUNCTION poolgate_notify_config();
CREATE TRIGGER accounts_notify AFTER INSERT OR UPDATE OR DELETE ON accounts
    FOR EACH STATEMENT EXECUTE FUNCTION poolgate_notify_config();
CREATE TRIGGER api_keys_notify AFTER INSERT OR UPDATE OR DELETE ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION poolgate_notify_config();
CREATE TRIGGER model_prices_notify AFTER INSERT OR UPDATE OR DELETE ON model_prices
    FOR EACH STATEMENT EXECUTE FUNCTION poolgate_notify_config();
