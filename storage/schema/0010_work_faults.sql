-- Fault isolation (engine/faults.py): how many times working an item made an actor raise, and
-- the last such error. An item that reaches three is quarantined: dead or failed with the
-- error, never claimed again, so it cannot crash-loop a restart.
ALTER TABLE webhook_deliveries ADD COLUMN faults INTEGER NOT NULL DEFAULT 0;
ALTER TABLE webhook_deliveries ADD COLUMN last_fault TEXT;
ALTER TABLE forward_jobs ADD COLUMN faults INTEGER NOT NULL DEFAULT 0;
ALTER TABLE forward_jobs ADD COLUMN last_fault TEXT;
ALTER TABLE email_recipients ADD COLUMN faults INTEGER NOT NULL DEFAULT 0;
ALTER TABLE email_recipients ADD COLUMN last_fault TEXT
