-- SMTP TLS reports received (RFC 8460; issue 31, section 2). Portable subset: runs unchanged
-- on SQLite and PostgreSQL.

-- One policy of a report: how one reporting organisation's sessions to the MX of one of the
-- workspace's domains went on the report's day (the UTC date its range begins): sessions
-- that succeeded, failed, and the failures by result type (a JSON object, `failures`). A
-- report sent again (same organisation and report id for the domain) replaces its rows
-- (engine/forwarding/tls_reports.py).
CREATE TABLE tls_report_policies (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    domain_id TEXT NOT NULL,
    day TEXT NOT NULL,
    org_name TEXT NOT NULL,
    report_id TEXT NOT NULL,
    policy_type TEXT NOT NULL,
    policy_domain TEXT NOT NULL,
    successful BIGINT NOT NULL,
    failed BIGINT NOT NULL,
    failures TEXT NOT NULL,
    received_at TEXT NOT NULL
);
CREATE INDEX tls_report_policies_domain ON tls_report_policies (workspace_id, domain_id, day);
CREATE INDEX tls_report_policies_report ON tls_report_policies (domain_id, org_name, report_id);
