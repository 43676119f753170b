-- The SMTP relay: credentials (one active per domain; the password only as a SHA-256 hash,
-- it is a random token) and the messages submitted over SMTP, kept byte for byte apart from
-- the emails table so lists and searches never read them.

CREATE TABLE smtp_credentials (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    domain_id TEXT NOT NULL,
    username TEXT NOT NULL,
    password_hash TEXT NOT NULL,
    is_active BOOLEAN NOT NULL,
    created_at TEXT NOT NULL,
    deactivated_at TEXT
);
CREATE INDEX smtp_credentials_workspace ON smtp_credentials (workspace_id, created_at);
CREATE INDEX smtp_credentials_username ON smtp_credentials (username);
-- "An active credential blocks creating another", even when two requests race.
CREATE UNIQUE INDEX smtp_credentials_active_domain ON smtp_credentials (domain_id)
    WHERE is_active;

-- BYTEA: PostgreSQL's byte string; SQLite stores the bytes as a BLOB whatever the type name.
CREATE TABLE raw_messages (
    email_id TEXT PRIMARY KEY REFERENCES emails (id),
    data BYTEA NOT NULL
);
