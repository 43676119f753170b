-- The sandbox (engine/sandbox/): a workspace in sandbox mode sends nothing out. Its outgoing
-- messages are captured here, signed bytes and all, and the outcomes its recipients script
-- for later (a complaint an hour on, an open and a click) wait as leased work rows, so a
-- restart or another node carries them out.
ALTER TABLE workspaces ADD COLUMN sandbox BOOLEAN NOT NULL DEFAULT FALSE;
-- Marked verified by the sandbox, without DNS: pending again when the workspace leaves it.
ALTER TABLE domains ADD COLUMN sandbox_verified BOOLEAN NOT NULL DEFAULT FALSE;

CREATE TABLE sandbox_messages (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    email_id TEXT NOT NULL,
    envelope_from TEXT NOT NULL,
    recipients TEXT NOT NULL,
    subject TEXT NOT NULL,
    dkim TEXT NOT NULL,
    data BYTEA NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX sandbox_messages_workspace ON sandbox_messages (workspace_id, created_at);
CREATE INDEX sandbox_messages_email ON sandbox_messages (email_id);

CREATE TABLE sandbox_outcomes (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    email_id TEXT NOT NULL,
    recipient TEXT NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    due_at TEXT,
    lease_until TEXT,
    leased_by TEXT,
    faults INTEGER NOT NULL DEFAULT 0,
    last_fault TEXT,
    error TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX sandbox_outcomes_due ON sandbox_outcomes (status, due_at);
CREATE INDEX sandbox_outcomes_leased ON sandbox_outcomes (leased_by) WHERE leased_by IS NOT NULL
