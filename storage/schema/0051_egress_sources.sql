-- Egress sources and pools (issue 32): a source is a bind address and an EHLO name the
-- delivery engine connects from; a pool picks among its sources by weight. A workspace or a
-- sending domain may be assigned a pool (the domain's wins); without one, mail goes from the
-- host's default address with the configured SMTP host name.
CREATE TABLE egress_sources (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    bind_address TEXT NOT NULL,
    ehlo_name TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE egress_pools (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE egress_pool_sources (
    pool_id TEXT NOT NULL REFERENCES egress_pools (id) ON DELETE CASCADE,
    source_id TEXT NOT NULL REFERENCES egress_sources (id),
    weight INTEGER NOT NULL,
    PRIMARY KEY (pool_id, source_id)
);
CREATE INDEX egress_pool_sources_source ON egress_pool_sources (source_id);

CREATE TABLE egress_assignments (
    kind TEXT NOT NULL,
    target_id TEXT NOT NULL,
    pool_id TEXT NOT NULL REFERENCES egress_pools (id),
    PRIMARY KEY (kind, target_id)
);
CREATE INDEX egress_assignments_pool ON egress_assignments (pool_id);
