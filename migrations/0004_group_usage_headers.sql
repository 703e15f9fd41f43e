-- poolgate selector schema, version 4: a group may pass its accounts' usage-window headers
-- (`anthropic-ratelimit-unified-*`, `x-codex-*`) on to clients. Off by default: in a shared pool
-- they describe an account every client shares. Set it for a pool with one user:
--   UPDATE groups SET usage_headers_to_clients = true WHERE name = 'mine';
-- (the groups trigger notifies `poolgate_config`: selectors reload within a second).
ALTER TABLE groups ADD COLUMN usage_headers_to_clients BOOLEAN NOT NULL DEFAULT false;
