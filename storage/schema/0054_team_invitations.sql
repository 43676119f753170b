-- Teams (engine/accounts/team.py): invitations to a workspace, by email, with a role. The
-- token is kept only as its hash; an invitation is used once, expires, or is revoked.
CREATE TABLE workspace_invitations (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    email TEXT NOT NULL,
    role TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    invited_by TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    accepted_at TEXT,
    revoked_at TEXT
);
CREATE INDEX workspace_invitations_workspace ON workspace_invitations (workspace_id, created_at);
-- Every workspace's creator is its owner and a member (as insert_workspace has always made it).
INSERT INTO workspace_members (workspace_id, user_id, role, created_at)
SELECT w.id, w.owner_user_id, 'owner', w.created_at FROM workspaces w
WHERE NOT EXISTS (
    SELECT 1 FROM workspace_members m WHERE m.workspace_id = w.id AND m.user_id = w.owner_user_id
);
UPDATE workspace_members SET role = 'owner'
WHERE user_id = (SELECT w.owner_user_id FROM workspaces w WHERE w.id = workspace_members.workspace_id);
