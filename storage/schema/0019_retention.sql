-- Retention (engine/retention.py): when an email's content (bodies, attachments, raw message)
-- was deleted; the sweeper reads the emails not yet purged, oldest first.
ALTER TABLE emails ADD COLUMN content_purged_at TEXT;
CREATE INDEX emails_unpurged ON emails (workspace_id, created_at) WHERE content_purged_at IS NULL;
