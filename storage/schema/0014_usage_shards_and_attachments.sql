-- The monthly volume in shards: every node adds to a shard of its own (storage/emails.py
-- `count_sent`), so nodes accepting mail at once for one workspace never wait on one row;
-- the volume is the sum of the shards.
CREATE TABLE usage_shards (
    workspace_id TEXT NOT NULL,
    month TEXT NOT NULL,
    shard INTEGER NOT NULL,
    emails INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, month, shard)
);
INSERT INTO usage_shards (workspace_id, month, shard, emails)
    SELECT workspace_id, month, 0, emails FROM monthly_usage;
DROP TABLE monthly_usage;

-- Attachments apart from the email row: lists and searches read emails without them; the
-- detail and delivery read them by email id.
CREATE TABLE email_attachments (
    email_id TEXT PRIMARY KEY REFERENCES emails (id),
    attachments TEXT NOT NULL
);
INSERT INTO email_attachments (email_id, attachments)
    SELECT id, attachments FROM emails WHERE attachments <> '[]';
ALTER TABLE emails DROP COLUMN attachments
