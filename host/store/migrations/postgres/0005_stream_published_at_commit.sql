-- `streamPublishedAt` is now written with each event (SSE streams read the outbox, so an event
-- reaches them when it commits); the webhook relay no longer stamps the events it passes. Events
-- it had not passed yet get their commit's nearest known time, their `occurredAt`.
UPDATE outbox SET stream_published_ms = occurred_ms WHERE stream_published_ms IS NULL;
