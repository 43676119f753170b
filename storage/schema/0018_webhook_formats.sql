-- A webhook's payload profile (engine/webhooks/profiles.py): the body shape its receiver expects.
ALTER TABLE webhooks ADD COLUMN format TEXT NOT NULL DEFAULT 'postroom';
