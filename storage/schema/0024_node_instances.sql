-- The workers of one `postroom serve --workers N` form an instance (postroom/workers.py): each
-- publishes its process metrics with its heartbeat, so that /metrics, answered by whichever
-- worker takes the scrape, covers them all (postroom/metrics.py). A single process is an
-- instance of its own (NULL: its node id).
ALTER TABLE nodes ADD COLUMN instance TEXT;
ALTER TABLE nodes ADD COLUMN metrics TEXT;
