-- poolgate selector schema, version 2: the model an account's confirmation probe asks for
-- (NULL: the selector's per-platform default, --probe-model-anthropic / --probe-model-openai).
ALTER TABLE accounts ADD COLUMN probe_model TEXT CHECK (length(probe_model) BETWEEN 1 AND 128);
-- OpenAI chat streams: ask the upstream for usage (`stream_options.include_usage`) when the client
-- did not, so streamed spend is recorded. Off for upstreams that reject the option.
ALTER TABLE accounts ADD COLUMN stream_usage BOOLEAN NOT NULL DEFAULT true;
-- ChatGPT subscription accounts (the Codex CLI's sign-in), served through the ChatGPT backend.
ALTER TABLE accounts DROP CONSTRAINT accounts_credential_kind_check;
ALTER TABLE accounts ADD CONSTRAINT accounts_credential_kind_check
    CHECK (credential_kind IN ('api_key', 'oauth', 'chatgpt_oauth'));
-- OAuth accounts: the client id sent with refresh requests (NULL: the platform's default, the
-- official CLI's public client id).
ALTER TABLE accounts ADD COLUMN oauth_client_id TEXT CHECK (length(oauth_client_id) BETWEEN 1 AND 128);
