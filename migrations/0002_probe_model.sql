-- poolgate selector schema, version 2: the model an account's confirmation probe asks for
-- (NULL: the selector's per-platform default, --probe-model-anthropic / --probe-model-openai).
ALTER TABLE accounts ADD COLUMN probe_model TEXT CHECK (length(probe_model) BETWEEN 1 AND 128);
