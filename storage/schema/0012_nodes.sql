-- Several nodes on one database (engine/nodes.py). Each process registers a node of its own
-- (a random id, with host and pid for people) and beats every few seconds; a node whose beat
-- is older than the limit is dead, and its leases, slots and leaderships are freed.
CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    state TEXT NOT NULL,
    started_at TEXT NOT NULL,
    heartbeat_at TEXT NOT NULL,
    stopped_at TEXT
);
CREATE INDEX nodes_state ON nodes (state, heartbeat_at);

-- Parallel SMTP connections to one destination, across every node: a round holds the slots
-- of the connections it opens, leased like work rows.
CREATE TABLE destination_slots (
    destination TEXT NOT NULL,
    slot INTEGER NOT NULL,
    held_by TEXT,
    lease_until TEXT,
    PRIMARY KEY (destination, slot)
);
CREATE INDEX destination_slots_holder ON destination_slots (held_by);

-- Work one node at a time does for all (the domain checker, the transfer timer): the lease
-- of the node that holds it, renewed by its heartbeat.
CREATE TABLE leaderships (
    name TEXT PRIMARY KEY,
    held_by TEXT,
    lease_until TEXT
);

-- An Idempotency-Key is claimed before its request runs: a row without a response yet is a
-- request in progress (the node running it renews `claimed_until`).
CREATE TABLE idempotency_claims (
    workspace_id TEXT NOT NULL,
    key TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    claimed_by TEXT NOT NULL,
    claimed_until TEXT NOT NULL,
    PRIMARY KEY (workspace_id, key)
)
;
CREATE INDEX idempotency_claims_holder ON idempotency_claims (claimed_by);

-- What a node holds is renewed by its heartbeat and freed when it dies: found by holder.
CREATE INDEX email_recipients_leased ON email_recipients (leased_by) WHERE leased_by IS NOT NULL;
CREATE INDEX webhook_deliveries_leased ON webhook_deliveries (leased_by)
    WHERE leased_by IS NOT NULL;
CREATE INDEX forward_jobs_leased ON forward_jobs (leased_by) WHERE leased_by IS NOT NULL
