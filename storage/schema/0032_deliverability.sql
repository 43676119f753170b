-- Deliverability (issue 30): mailbox-full counts, a second DKIM key, the tags header.
-- Portable subset: runs unchanged on SQLite and PostgreSQL.

-- Mailbox-full replies that count toward suppressing an address (engine/delivery/bounces.py).
-- Keyed by the keyed hash storage/privacy.py keeps of an erased address, so an erasure
-- leaves nothing readable here; a delivery to the address deletes its row.
CREATE TABLE soft_bounces (
    address_hash TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    count INTEGER NOT NULL,
    first_at TEXT NOT NULL,
    last_at TEXT NOT NULL
);

-- An Ed25519 DKIM key (RFC 8463) beside the RSA one, made when a domain first turns it on;
-- its mail is signed with both while `ed25519_signing` is on.
ALTER TABLE domains ADD COLUMN ed25519_selector TEXT;
ALTER TABLE domains ADD COLUMN ed25519_private_key TEXT;
ALTER TABLE domains ADD COLUMN ed25519_public_key TEXT;
ALTER TABLE domains ADD COLUMN ed25519_signing BOOLEAN NOT NULL DEFAULT FALSE;
-- The header a domain's mail carries its tags in; NULL: tags stay internal.
ALTER TABLE domains ADD COLUMN tags_header TEXT;
