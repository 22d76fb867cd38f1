-- Bumped each time the run's journal is truncated (resume, retry-finalization): an effect's
-- idempotency token is the run, this epoch and the call's sequence number, so a crash replays an
-- effect with its token and a re-run after a truncation gets a new one (docs/decisions.md,
-- "An effect's token is derived, not journaled first").
ALTER TABLE runs ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
