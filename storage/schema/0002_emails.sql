-- Emails, their recipients (delivery is tracked per recipient), events, the suppression
-- override windows, idempotency keys and saved searches.

CREATE TABLE emails (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    domain_id TEXT NOT NULL,
    from_address TEXT NOT NULL,
    from_name TEXT,
    to_addresses TEXT NOT NULL,
    cc_addresses TEXT NOT NULL,
    bcc_addresses TEXT NOT NULL,
    reply_to TEXT,
    subject TEXT NOT NULL,
    html TEXT,
    text_body TEXT,
    headers TEXT NOT NULL,
    tags TEXT NOT NULL,
    attachments TEXT NOT NULL,
    status TEXT NOT NULL,
    source TEXT NOT NULL,
    message_id TEXT NOT NULL,
    rejection_reason TEXT,
    retry_of_id TEXT,
    send_at TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    delivered_at TEXT
);
CREATE INDEX emails_workspace_created ON emails (workspace_id, created_at);
CREATE INDEX emails_workspace_updated ON emails (workspace_id, updated_at);
CREATE INDEX emails_scheduled ON emails (status, send_at);

CREATE TABLE email_recipients (
    email_id TEXT NOT NULL REFERENCES emails (id),
    address TEXT NOT NULL,
    kind TEXT NOT NULL,
    domain TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    next_attempt_at TEXT,
    lease_until TEXT,
    leased_by TEXT,
    last_response TEXT,
    queued_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (email_id, address)
);
CREATE INDEX email_recipients_due ON email_recipients (status, domain, next_attempt_at);

CREATE TABLE email_events (
    id TEXT PRIMARY KEY,
    email_id TEXT NOT NULL REFERENCES emails (id),
    workspace_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    recipient TEXT,
    metadata TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX email_events_email ON email_events (email_id, created_at);

CREATE TABLE suppression_overrides (
    workspace_id TEXT NOT NULL,
    email TEXT NOT NULL,
    rejected_at TEXT NOT NULL,
    used_at TEXT,
    PRIMARY KEY (workspace_id, email)
);

CREATE TABLE idempotency_keys (
    workspace_id TEXT NOT NULL,
    key TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    response TEXT NOT NULL,
    status_code INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (workspace_id, key)
);

CREATE TABLE saved_searches (
    workspace_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    searches TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (workspace_id, user_id)
);

-- Emails sent (not rejected) per workspace and calendar month (UTC, 'YYYY-MM'), kept with
-- each accept so the plan's monthly volume is checked without counting rows.
CREATE TABLE monthly_usage (
    workspace_id TEXT NOT NULL,
    month TEXT NOT NULL,
    emails INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, month)
);
