-- Contact lists and their contacts, templates, and broadcasts (one per bulk send).
-- `contact_count` and `next_seq` are kept with every insert and delete, so reading a list,
-- checking the plan's contacts-per-list limit and numbering contacts never count rows.

CREATE TABLE contact_lists (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    name TEXT NOT NULL,
    description TEXT,
    icon_seed TEXT,
    contact_count INTEGER NOT NULL,
    next_seq INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX contact_lists_workspace ON contact_lists (workspace_id, created_at);

-- `seq` numbers a list's contacts in the order they were added: pages and bulk sends walk
-- the list by it.
CREATE TABLE contacts (
    id TEXT PRIMARY KEY,
    list_id TEXT NOT NULL REFERENCES contact_lists (id),
    email TEXT NOT NULL,
    name TEXT,
    metadata TEXT,
    seq INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (list_id, email)
);
CREATE INDEX contacts_list_seq ON contacts (list_id, seq);

CREATE TABLE templates (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    name TEXT NOT NULL,
    subject TEXT NOT NULL,
    html_body TEXT NOT NULL,
    text_body TEXT NOT NULL,
    blocks_json TEXT,
    variables TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX templates_workspace_updated ON templates (workspace_id, updated_at);

-- `queued` and `skipped` grow with each committed chunk; `reserved` is the monthly volume
-- counted up front; `node` is the node queuing it (a restarted node fails its own at once).
CREATE TABLE broadcasts (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    contact_list_id TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    domain_id TEXT NOT NULL,
    from_address TEXT NOT NULL,
    subject TEXT NOT NULL,
    tags TEXT NOT NULL,
    status TEXT NOT NULL,
    queued INTEGER NOT NULL,
    skipped INTEGER NOT NULL,
    reserved INTEGER NOT NULL,
    node TEXT NOT NULL,
    failure_reason TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    finished_at TEXT
);
CREATE INDEX broadcasts_workspace_created ON broadcasts (workspace_id, created_at);
CREATE INDEX broadcasts_domain_status ON broadcasts (domain_id, status);
CREATE INDEX broadcasts_status ON broadcasts (status, updated_at);
