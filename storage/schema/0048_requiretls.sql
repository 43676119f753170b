-- REQUIRETLS (RFC 8689, issue 31): an email submitted through the relay with
-- `MAIL FROM:<...> REQUIRETLS` is delivered only over TLS verified by DANE or MTA-STS to a
-- server that offers REQUIRETLS (passed on in MAIL); otherwise it fails with 5.7.30.
-- Portable subset: runs unchanged on SQLite and PostgreSQL.
ALTER TABLE emails ADD COLUMN requiretls BOOLEAN NOT NULL DEFAULT FALSE;
