-- A subscription receives the events committed after it was created: the outbox's last seq then
-- (subscriptions made before this column existed get every event the relay has not passed yet).
ALTER TABLE subscriptions ADD COLUMN after_seq INTEGER NOT NULL DEFAULT 0;
