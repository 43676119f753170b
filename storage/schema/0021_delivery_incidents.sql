-- Destination incidents (engine/delivery/incidents.py): a destination that blocks, slows or
-- cannot be resolved for one workspace's sending domain. At most one open row per (workspace,
-- sending domain, destination); its recipients are not claimed before `paused_until`, on
-- every node. Resolved rows stay for the record.
CREATE TABLE delivery_incidents (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    domain_id TEXT NOT NULL,
    sending_domain TEXT NOT NULL,
    destination TEXT NOT NULL,
    kind TEXT NOT NULL,
    strikes INTEGER NOT NULL,
    sample_reply TEXT NOT NULL,
    first_seen_at TEXT NOT NULL,
    last_seen_at TEXT NOT NULL,
    paused_until TEXT NOT NULL,
    resolved_at TEXT
);
CREATE UNIQUE INDEX delivery_incidents_open ON delivery_incidents (workspace_id, domain_id, destination)
    WHERE resolved_at IS NULL;
CREATE INDEX delivery_incidents_destination ON delivery_incidents (destination, paused_until)
    WHERE resolved_at IS NULL;
CREATE INDEX delivery_incidents_workspace ON delivery_incidents (workspace_id, last_seen_at)
