-- Email events are stored under the names the events endpoint lists (`sent`, `delivered`, ...);
-- only webhook payloads, subscriptions and deliveries say `email.sent`, so those keep theirs.
UPDATE email_events SET event_type = substr(event_type, 7) WHERE event_type LIKE 'email.%';
