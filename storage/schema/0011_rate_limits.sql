-- Counters behind rate limits (engine/rate_limits.py), shared by every node: one row per key
-- (`account:<sha256 of the email>`, `ip:<address>`, `verify:<workspace>`), counting attempts
-- in a window that starts with the key's first attempt and ends at `window_ends`.
CREATE TABLE rate_limits (
    limit_key TEXT PRIMARY KEY,
    attempts INTEGER NOT NULL,
    window_ends TEXT NOT NULL
);
-- Ended windows are pruned oldest first.
CREATE INDEX rate_limits_window_ends ON rate_limits (window_ends);
