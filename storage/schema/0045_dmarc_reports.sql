-- DMARC aggregate reports received (issue 31, section 2). Portable subset: runs unchanged on
-- SQLite and PostgreSQL.

-- One row of a report (RFC 7489 appendix C `record`): what one reporting organisation saw
-- from one source address for one of the workspace's domains on the report's day (the UTC
-- date its range begins). A report is stored once: sent again (same organisation and
-- report id for the domain), its rows replace the earlier ones
-- (engine/forwarding/dmarc_reports.py).
CREATE TABLE dmarc_records (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    domain_id TEXT NOT NULL,
    day TEXT NOT NULL,
    org_name TEXT NOT NULL,
    report_id TEXT NOT NULL,
    source_ip TEXT NOT NULL,
    message_count BIGINT NOT NULL,
    header_from TEXT NOT NULL,
    disposition TEXT NOT NULL,
    dkim_pass BOOLEAN NOT NULL,
    spf_pass BOOLEAN NOT NULL,
    received_at TEXT NOT NULL
);
CREATE INDEX dmarc_records_domain ON dmarc_records (workspace_id, domain_id, day);
CREATE INDEX dmarc_records_report ON dmarc_records (domain_id, org_name, report_id);
