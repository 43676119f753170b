-- A sending domain's own tracking host (issue 30): a CNAME to the service's host, published
-- by the owner; once it resolves there (record_status "tracking" verified), the domain's
-- open pixel and click links use it instead of the service's public URL.
-- Portable subset: runs unchanged on SQLite and PostgreSQL.
ALTER TABLE domains ADD COLUMN tracking_host TEXT;
