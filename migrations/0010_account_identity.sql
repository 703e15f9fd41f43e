-- poolgate selector schema, version 10: who an upstream says a subscription account is, from
-- what its sign-in returned (`selector-svc admin login …`, `import`; docs/DESIGN.md §5,
-- "Signing accounts in"): the `<user>/<organisation>` ids (`upstream_id`), the email and the plan
-- operators see. Signing in an account that is already in the pool finds it by platform and
-- `upstream_id` and updates its tokens in place. NULL: configured by hand, identity unknown.
ALTER TABLE accounts
    ADD COLUMN upstream_id TEXT CHECK (upstream_id IS NULL OR length(upstream_id) BETWEEN 1 AND 512),
    ADD COLUMN email TEXT CHECK (email IS NULL OR length(email) <= 320),
    ADD COLUMN plan TEXT CHECK (plan IS NULL OR length(plan) <= 64);
CREATE UNIQUE INDEX accounts_platform_upstream_id_key ON accounts (platform, upstream_id)
    WHERE upstream_id IS NOT NULL;
INSERT INTO schema_releases (migration, oldest_release) VALUES (10, '0.1.0');
