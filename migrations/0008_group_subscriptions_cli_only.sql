-- poolgate selector schema, version 8: a group may keep its subscription accounts (`oauth`,
-- `chatgpt_oauth`) for the platform's own CLI (Claude Code, Codex). Requests from any other
-- client then go to the group's API-key accounts only, instead of being tried on a subscription
-- that bills them as extra usage or refuses them (docs/SUBSCRIPTIONS.md, "Other clients"). Off by
-- default: a request is tried as its client sent it, and a subscription's third-party refusal
-- fails it over to the group's API-key accounts.
--   UPDATE groups SET subscriptions_cli_only = true WHERE name = 'team';
-- (the groups trigger notifies `poolgate_config`: selectors reload within a second).
ALTER TABLE groups ADD COLUMN subscriptions_cli_only BOOLEAN NOT NULL DEFAULT false;
