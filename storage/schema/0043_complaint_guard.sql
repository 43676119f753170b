-- The complaint-rate guard (issue 31, section 4): a broadcast's emails name it, so a pause
-- holds (and a resume releases) that broadcast's mail alone; a paused broadcast says why; a
-- domain whose mail that offers unsubscribe is stopped says since when.
-- Portable subset: runs unchanged on SQLite and PostgreSQL.
ALTER TABLE emails ADD COLUMN broadcast_id TEXT;
CREATE INDEX emails_broadcast ON emails (broadcast_id);
ALTER TABLE broadcasts ADD COLUMN pause_reason TEXT;
ALTER TABLE domains ADD COLUMN marketing_stopped_at TEXT;
