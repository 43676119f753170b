-- Bounce domains and postmaster mail (issue 30, section 2). Portable subset: runs unchanged
-- on SQLite and PostgreSQL.

-- The domain a sending domain's envelope sender is on (e.g. bounces.example.com), whose MX
-- points at the service, so DSNs and complaints reach it while the domain's own mail is
-- hosted elsewhere; NULL: the sending domain itself (engine/domains/bounce_domain.py).
ALTER TABLE domains ADD COLUMN bounce_domain TEXT;
-- When it was set: the domain checker looks for its records for a while after.
ALTER TABLE domains ADD COLUMN bounce_domain_set_at TEXT;
CREATE INDEX domains_bounce_domain ON domains (bounce_domain);

-- A complaint sent to postmaster@ or abuse@ names its email by the Message-ID it quotes.
CREATE INDEX emails_message_id ON emails (workspace_id, message_id);

-- Mail to postmaster@ and abuse@ of a served domain that is no report Postroom reads, kept
-- for the workspace owning the domain: at most the first octets of each message (`content`,
-- `truncated` when cut) and at most a fixed number of messages per workspace, the oldest
-- going first (engine/forwarding/postmaster.py).
CREATE TABLE postmaster_mail (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    domain_id TEXT NOT NULL,
    recipient TEXT NOT NULL,
    envelope_from TEXT NOT NULL,
    from_header TEXT NOT NULL,
    subject TEXT NOT NULL,
    message_id TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    content BYTEA NOT NULL,
    truncated BOOLEAN NOT NULL,
    received_at TEXT NOT NULL
);
CREATE INDEX postmaster_mail_workspace ON postmaster_mail (workspace_id, received_at);
CREATE INDEX postmaster_mail_domain ON postmaster_mail (domain_id, received_at);
