-- Domain transfers between workspaces, and the initiation attempts behind their rate limit.
-- Tokens are stored only as SHA-256 hashes; a used token's hash is cleared (single use).

CREATE TABLE domain_transfers (
    id TEXT PRIMARY KEY,
    domain_id TEXT NOT NULL,
    domain_name TEXT NOT NULL,
    source_user_id TEXT NOT NULL REFERENCES users (id),
    source_org_id TEXT NOT NULL REFERENCES workspaces (id),
    source_label TEXT NOT NULL,
    target_email TEXT NOT NULL,
    target_user_id TEXT REFERENCES users (id),
    target_org_id TEXT REFERENCES workspaces (id),
    status TEXT NOT NULL,
    note TEXT NOT NULL,
    rotate_dkim BOOLEAN NOT NULL DEFAULT FALSE,
    forced_by TEXT,
    accept_token_hash TEXT,
    stop_token_hash TEXT,
    cooloff_until TEXT,
    initiated_at TEXT NOT NULL,
    accepted_at TEXT,
    completed_at TEXT,
    ended_at TEXT,
    expires_at TEXT NOT NULL
);
CREATE UNIQUE INDEX domain_transfers_accept_token ON domain_transfers (accept_token_hash);
CREATE UNIQUE INDEX domain_transfers_stop_token ON domain_transfers (stop_token_hash);
-- At most one pending or accepted transfer per domain, even under concurrent initiations.
CREATE UNIQUE INDEX domain_transfers_active ON domain_transfers (domain_id)
    WHERE status IN ('pending', 'accepted');
CREATE INDEX domain_transfers_target ON domain_transfers (target_email, status);
CREATE INDEX domain_transfers_source ON domain_transfers (source_user_id, initiated_at);
CREATE INDEX domain_transfers_expiry ON domain_transfers (status, expires_at);
CREATE INDEX domain_transfers_cooloff ON domain_transfers (status, cooloff_until);

CREATE TABLE transfer_initiations (
    user_id TEXT NOT NULL,
    attempted_at TEXT NOT NULL
);
CREATE INDEX transfer_initiations_user ON transfer_initiations (user_id, attempted_at);
