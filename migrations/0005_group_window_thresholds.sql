-- poolgate selector schema, version 5: a group may set its own usage-window thresholds
-- (docs/DESIGN.md §5, "Spending what expires first"). NULL: the deployment's (the selector's
-- --window-shed-at / --window-move-at, 0.9 and 0.97 by default). Above `window_shed_at` of any
-- plan window an account orders last for new sessions; above `window_move_at` its sticky sessions
-- move too. An account is never excluded by them while it can serve.
--   UPDATE groups SET window_shed_at = 0.8, window_move_at = 0.95 WHERE name = 'team';
-- (the groups trigger notifies `poolgate_config`: selectors reload within a second).
ALTER TABLE groups
    ADD COLUMN window_shed_at DOUBLE PRECISION
        CHECK (window_shed_at > 0 AND window_shed_at <= 1),
    ADD COLUMN window_move_at DOUBLE PRECISION
        CHECK (window_move_at > 0 AND window_move_at <= 1),
    ADD CONSTRAINT groups_window_thresholds_ordered
        CHECK (window_shed_at IS NULL OR window_move_at IS NULL OR window_shed_at <= window_move_at);
