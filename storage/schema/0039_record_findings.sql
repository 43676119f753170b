-- What the last DNS check found about each of a domain's records beside its status (issue 30,
-- engine/domains/findings.py): why, the record to publish instead, and the parsed SPF and
-- DMARC facts, as JSON keyed by record purpose. Portable: SQLite and PostgreSQL alike.
ALTER TABLE domains ADD COLUMN record_findings TEXT NOT NULL DEFAULT '{}';
