-- When a domain last became pending (registered, or given a new DKIM key by a transfer): the
-- domain checker looks for its record for 72 hours from then.
ALTER TABLE domains ADD COLUMN pending_since TEXT;
UPDATE domains SET pending_since = created_at
