-- The MCP door (engine/agents): what agents may do in a workspace, and the one-time tokens
-- that confirm their sends.

-- One row per workspace that changed the defaults (policy `read`, 100 recipients per action).
CREATE TABLE mcp_policies (
    workspace_id TEXT PRIMARY KEY REFERENCES workspaces (id) ON DELETE CASCADE,
    policy TEXT NOT NULL,
    max_recipients INTEGER NOT NULL,
    updated_at TEXT NOT NULL
);

-- A previewed action waiting for its `confirm`: the token only as SHA-256, the exact action
-- (kind and JSON payload) it confirms, who may confirm it, until when, and whether it was.
CREATE TABLE agent_confirmations (
    token_hash TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    user_id TEXT NOT NULL,
    action TEXT NOT NULL,
    payload TEXT NOT NULL,
    recipients INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    used_at TEXT
);
-- Expired tokens of a workspace are pruned whenever it previews another action.
CREATE INDEX agent_confirmations_expiry ON agent_confirmations (workspace_id, expires_at);
