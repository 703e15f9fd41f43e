-- poolgate selector schema, version 3: Claude Code's token endpoint moved from
-- console.anthropic.com (now 404) to platform.claude.com. Rows that still name the old default
-- get the new one; a NULL token_url stays NULL, since reads give it the platform's default
-- (`default_oauth_token_url`).
UPDATE accounts
   SET token_url = 'https://platform.claude.com/v1/oauth/token', updated_at = now()
 WHERE token_url = 'https://console.anthropic.com/v1/oauth/token';
