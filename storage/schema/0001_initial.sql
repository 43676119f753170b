-- Accounts, API keys, domains, senders, suppressions and the activity log.
-- Portable subset of SQL: runs unchanged on SQLite and PostgreSQL. Ids are UUID text,
-- timestamps fixed-width UTC text, JSON columns text.

CREATE TABLE service_secrets (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE users (
    id TEXT PRIMARY KEY,
    email TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    is_admin BOOLEAN NOT NULL DEFAULT FALSE,
    created_at TEXT NOT NULL
);

CREATE TABLE workspaces (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    plan TEXT NOT NULL,
    owner_user_id TEXT NOT NULL REFERENCES users (id),
    created_at TEXT NOT NULL
);

CREATE TABLE workspace_members (
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    user_id TEXT NOT NULL REFERENCES users (id),
    role TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (workspace_id, user_id)
);
CREATE INDEX workspace_members_user ON workspace_members (user_id);

CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id),
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    reauth_until TEXT,
    revoked_at TEXT
);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    created_by TEXT NOT NULL REFERENCES users (id),
    name TEXT NOT NULL,
    key_hash TEXT NOT NULL UNIQUE,
    key_prefix TEXT NOT NULL,
    permissions TEXT NOT NULL,
    is_active BOOLEAN NOT NULL,
    last_used_at TEXT,
    created_at TEXT NOT NULL,
    deactivated_at TEXT
);
CREATE INDEX api_keys_workspace ON api_keys (workspace_id, is_active, created_at);

CREATE TABLE domains (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    dkim_selector TEXT NOT NULL,
    dkim_private_key TEXT NOT NULL,
    dkim_public_key TEXT NOT NULL,
    record_status TEXT NOT NULL,
    open_tracking BOOLEAN NOT NULL DEFAULT FALSE,
    click_tracking BOOLEAN NOT NULL DEFAULT FALSE,
    created_at TEXT NOT NULL,
    verified_at TEXT,
    checked_at TEXT
);
CREATE UNIQUE INDEX domains_workspace_name ON domains (workspace_id, name);
-- Only one workspace at a time may send as a domain.
CREATE UNIQUE INDEX domains_verified_name ON domains (name) WHERE status = 'verified';

CREATE TABLE senders (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    domain_id TEXT NOT NULL REFERENCES domains (id) ON DELETE CASCADE,
    email TEXT NOT NULL,
    name TEXT,
    is_active BOOLEAN NOT NULL,
    created_at TEXT NOT NULL
);
CREATE UNIQUE INDEX senders_workspace_email ON senders (workspace_id, email);

CREATE TABLE suppressions (
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    email TEXT NOT NULL,
    reason TEXT NOT NULL,
    source_email_id TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (workspace_id, email)
);
CREATE INDEX suppressions_workspace_time ON suppressions (workspace_id, created_at);

CREATE TABLE activity_log (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target_type TEXT NOT NULL,
    target_name TEXT NOT NULL,
    target_id TEXT,
    category TEXT NOT NULL,
    meta TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX activity_log_workspace_time ON activity_log (workspace_id, created_at);
