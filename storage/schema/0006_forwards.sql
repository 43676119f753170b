-- Inbound forwarding: the rules, the inbound messages the MX listener accepted (committed
-- before it answers 250), the work each message makes (one job per destination, leased by
-- the forwarder like delivery work; a message is deleted once its jobs are all finished, the
-- jobs stay as the record of each attempt), and the log of forwarded copies.

CREATE TABLE forwards (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    domain_id TEXT NOT NULL,
    source_email TEXT NOT NULL,
    destination_emails TEXT NOT NULL,
    destination_urls TEXT NOT NULL,
    is_active BOOLEAN NOT NULL,
    delivery_count INTEGER NOT NULL,
    last_delivered_at TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE UNIQUE INDEX forwards_source ON forwards (source_email);
CREATE INDEX forwards_workspace ON forwards (workspace_id, created_at);
CREATE INDEX forwards_domain ON forwards (domain_id);

CREATE TABLE inbound_messages (
    id TEXT PRIMARY KEY,
    envelope_from TEXT NOT NULL,
    recipients TEXT NOT NULL,
    data TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    received_at TEXT NOT NULL
);

CREATE TABLE forward_jobs (
    id TEXT PRIMARY KEY,
    message_id TEXT NOT NULL,
    forward_id TEXT NOT NULL,
    workspace_id TEXT NOT NULL,
    original_to TEXT NOT NULL,
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    status TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    next_attempt_at TEXT,
    lease_until TEXT,
    leased_by TEXT,
    last_error TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX forward_jobs_due ON forward_jobs (status, next_attempt_at);
CREATE INDEX forward_jobs_message ON forward_jobs (message_id);

CREATE TABLE forward_logs (
    id TEXT PRIMARY KEY,
    forward_id TEXT NOT NULL,
    workspace_id TEXT NOT NULL,
    from_address TEXT NOT NULL,
    original_to TEXT NOT NULL,
    forwarded_to TEXT NOT NULL,
    subject TEXT NOT NULL,
    message_id TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX forward_logs_workspace ON forward_logs (workspace_id, created_at);
CREATE INDEX forward_logs_forward ON forward_logs (forward_id, created_at);
