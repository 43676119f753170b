-- A workspace's own complaint rate above which its broadcasts pause (issue 31, section 4),
-- within the service's bounds (engine/contacts/complaint_limits.py); NULL: the default 0.1%.
-- Portable subset: runs unchanged on SQLite and PostgreSQL.
ALTER TABLE workspaces ADD COLUMN complaint_pause_rate DOUBLE PRECISION;
