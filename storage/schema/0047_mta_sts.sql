-- MTA-STS policies of recipient domains (RFC 8461, issue 31), fetched by whichever node
-- delivers first and shared by every node until `expires_at` (the policy's max_age after the
-- fetch) or until the domain's `_mta-sts` TXT record names another id. Not tenant data: a
-- recipient domain's published policy is the same for every workspace.
-- Portable subset: runs unchanged on SQLite and PostgreSQL.
CREATE TABLE mta_sts_policies (
    domain TEXT PRIMARY KEY,
    policy_id TEXT NOT NULL,
    mode TEXT NOT NULL,
    mx TEXT NOT NULL,
    max_age INTEGER NOT NULL,
    fetched_at TEXT NOT NULL,
    expires_at TEXT NOT NULL
);
