-- Inbound messages keep their octets as they came (BYTEA: a BLOB on SQLite), no longer as
-- base64 text: storing a 34 MiB message then holds it once, not as bytes, base64 bytes and
-- base64 text together (issue 28). Rows stored before keep their base64 `data`; new rows
-- leave it empty.
ALTER TABLE inbound_messages ADD COLUMN content BYTEA;
