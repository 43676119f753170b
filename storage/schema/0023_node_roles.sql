-- What each node does (postroom/workers.py): `all` (a single process), `intake` (the API and
-- the SMTP doors, no delivery) or `delivery` (delivery and the background actors, no doors).
ALTER TABLE nodes ADD COLUMN role TEXT NOT NULL DEFAULT 'all';
