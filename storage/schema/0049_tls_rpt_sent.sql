-- SMTP TLS reports sent (RFC 8460; issue 31): one row per day and recipient domain once that
-- day's report for the domain is settled, whether a report went out (its id and where) or
-- the domain publishes no `_smtp._tls` record. The row is written before anything is sent
-- (for a mailto: rua in the same unit of work as the report mail), so a day's report for a
-- domain goes out once however often the day is run, by any node or the CLI. Not tenant
-- data: a recipient domain gets one report from the service for all workspaces.
-- Portable subset: runs unchanged on SQLite and PostgreSQL.
CREATE TABLE tls_rpt_sent (
    day TEXT NOT NULL,
    domain TEXT NOT NULL,
    report_id TEXT,
    targets TEXT NOT NULL,
    outcomes TEXT NOT NULL,
    sent_at TEXT NOT NULL,
    PRIMARY KEY (day, domain)
);

-- Days whose round ended with every domain settled: the daily worker looks no further.
CREATE TABLE tls_rpt_days (
    day TEXT PRIMARY KEY,
    finished_at TEXT NOT NULL
);
