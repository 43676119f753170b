-- Webhooks and their deliveries (the outbox: deliveries are written in the same transaction
-- as the email events they carry).

CREATE TABLE webhooks (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    url TEXT NOT NULL,
    events TEXT NOT NULL,
    secret TEXT NOT NULL,
    is_active BOOLEAN NOT NULL,
    deleted_at TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX webhooks_workspace ON webhooks (workspace_id, is_active);

CREATE TABLE webhook_deliveries (
    id TEXT PRIMARY KEY,
    webhook_id TEXT NOT NULL REFERENCES webhooks (id),
    workspace_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    payload TEXT NOT NULL,
    endpoint_url TEXT NOT NULL,
    status TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    next_retry_at TEXT,
    lease_until TEXT,
    leased_by TEXT,
    response_status INTEGER,
    response_body TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries (webhook_id, created_at);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (status, next_retry_at);
