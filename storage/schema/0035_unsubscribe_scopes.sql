-- Unsubscribe scopes (issue 30): which emails carry an unsubscribe link, and each workspace's
-- footer for the mail that does. Portable subset: runs unchanged on SQLite and PostgreSQL.

-- Whether an email carries List-Unsubscribe and `{{unsubscribe_url}}`: every broadcast, and
-- the other emails whose sender asked (`"unsubscribe": true`). Only such mail is blocked by
-- an unsubscribe (engine/suppressions/scopes.py). Emails queued before this migration were
-- all given the header; the broadcasts among them keep it.
ALTER TABLE emails ADD COLUMN unsubscribe BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE emails SET unsubscribe = TRUE WHERE source = 'broadcast';

-- A workspace's footer for mail that carries unsubscribe but does not place
-- `{{unsubscribe_url}}` itself; no row: the default footer (engine/mail/unsubscribe_footer.py).
CREATE TABLE unsubscribe_footers (
    workspace_id TEXT PRIMARY KEY REFERENCES workspaces (id),
    enabled BOOLEAN NOT NULL,
    text_footer TEXT NOT NULL,
    html_footer TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
