-- Issue 20 leftovers.
-- A workspace's own retention period in days (NULL: its plan's), never longer than the plan's
-- (engine/retention.py); the sweeper finds inbound copies by when they arrived.
ALTER TABLE workspaces ADD COLUMN retention_days INTEGER;
CREATE INDEX inbound_messages_received ON inbound_messages (received_at);
-- Basic-auth credentials a webhook's receiver expects, `user:password` sealed like every
-- secret at rest (storage/sealing.py); NULL: none.
ALTER TABLE webhooks ADD COLUMN basic_auth TEXT;
