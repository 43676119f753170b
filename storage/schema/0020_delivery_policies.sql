-- Delivery control (issue 19; engine/delivery/policies.py, throttle.py): destination policies,
-- warm-up ramps, and the budget counters every node advances in its claim transaction.

-- A workspace's rule for a destination: `match` is a recipient domain (`gmail.com`) or an MX
-- host suffix (`*.google.com`); `domain_id` narrows it to one sending domain (NULL: all of
-- the workspace's). A NULL limit is left to the next matching rule (or unlimited).
CREATE TABLE delivery_policies (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    domain_id TEXT,
    match TEXT NOT NULL,
    max_connections INTEGER,
    messages_per_connection INTEGER,
    per_minute INTEGER,
    per_hour INTEGER,
    per_day INTEGER,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
-- One rule per match and scope.
CREATE UNIQUE INDEX delivery_policies_scope ON delivery_policies (workspace_id, COALESCE(domain_id, ''), match);

-- A warm-up ramp per sending domain: `first_day` messages per destination on its first (UTC)
-- day, multiplied by `factor` each day after, until a day's allowance reaches `target_per_day`.
CREATE TABLE delivery_ramps (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    domain_id TEXT NOT NULL,
    first_day INTEGER NOT NULL,
    factor DOUBLE PRECISION NOT NULL,
    target_per_day INTEGER NOT NULL,
    starts_on TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE UNIQUE INDEX delivery_ramps_domain ON delivery_ramps (workspace_id, domain_id);

-- Messages counted against one limit (`<limit key>/<unit>`) in its current window, which
-- starts at `window_start` (aligned to the minute, hour or UTC day); a row whose window has
-- passed counts from zero again.
CREATE TABLE delivery_budgets (
    budget_key TEXT PRIMARY KEY,
    window_start TEXT NOT NULL,
    used INTEGER NOT NULL
);
-- Rows of windows long past are pruned a few at a time.
CREATE INDEX delivery_budgets_window ON delivery_budgets (window_start);

-- When a recipient's 72-hour retry window starts, if not at queueing: the moment a budget
-- let it go after it waited (throttled waiting is not the destination failing).
ALTER TABLE email_recipients ADD COLUMN expiry_from TEXT;
