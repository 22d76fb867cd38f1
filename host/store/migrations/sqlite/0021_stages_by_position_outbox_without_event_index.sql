-- Two B-trees an execution wrote at every step and nothing read.
--
-- A stage is read only with its execution, in order, and written by its execution and position
-- (`stages_by_execution`); its id is shown, never looked up. The table is rebuilt WITHOUT ROWID
-- with (execution_id, position) as its key, so a stage's row is written to one B-tree, not to the
-- table, the id's automatic index and `stages_by_execution`: eleven B-tree inserts fewer per
-- ten-stage execution, and its stages are read from the key's own pages.
CREATE TABLE stages_by_position (
    id              TEXT NOT NULL,
    execution_id    TEXT NOT NULL REFERENCES executions (id),
    position        INTEGER NOT NULL,
    stage_name      TEXT NOT NULL,
    status          TEXT NOT NULL,                -- running waiting succeeded failed
    started_ms      INTEGER NOT NULL,
    finished_ms     INTEGER,
    output_json     TEXT,
    error_json      TEXT,
    PRIMARY KEY (execution_id, position)
) WITHOUT ROWID;
INSERT INTO stages_by_position (id, execution_id, position, stage_name, status, started_ms, finished_ms, output_json, error_json)
    SELECT id, execution_id, position, stage_name, status, started_ms, finished_ms, output_json, error_json FROM stages;
DROP TABLE stages;
ALTER TABLE stages_by_position RENAME TO stages;

-- An event is found by its `seq` (the cursor of streams, feeds and the webhook relay; a delivery
-- records the seq of its event), never by its id, which is a fresh UUIDv7 and unique by
-- construction. The UNIQUE index on `event_id` was one more B-tree written per event, 25 per
-- ten-stage execution. The table is rebuilt without it (SQLite cannot drop a column's UNIQUE
-- constraint); `seq` keeps its values and its AUTOINCREMENT high-water mark, so no seq is ever
-- handed out twice.
CREATE TABLE outbox_by_seq (
    seq                     INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id                TEXT NOT NULL,
    execution_id            TEXT NOT NULL,
    event_type              TEXT NOT NULL,
    event_version           TEXT NOT NULL,
    principal_id            TEXT NOT NULL,
    workflow                TEXT NOT NULL,
    payload_json            TEXT NOT NULL,
    occurred_ms             INTEGER NOT NULL,
    traceparent             TEXT,
    routed_ms               INTEGER,
    stream_published_ms     INTEGER,
    dispatched_ms           INTEGER
);
INSERT INTO outbox_by_seq (seq, event_id, execution_id, event_type, event_version, principal_id, workflow,
                           payload_json, occurred_ms, traceparent, routed_ms, stream_published_ms, dispatched_ms)
    SELECT seq, event_id, execution_id, event_type, event_version, principal_id, workflow,
           payload_json, occurred_ms, traceparent, routed_ms, stream_published_ms, dispatched_ms
    FROM outbox ORDER BY seq;
-- The old table's high-water mark moves to the new one (it may be above every seq still
-- present); dropping the old table then leaves it alone, and the rename carries it over.
DELETE FROM sqlite_sequence WHERE name = 'outbox_by_seq';
UPDATE sqlite_sequence SET name = 'outbox_by_seq' WHERE name = 'outbox';
DROP TABLE outbox;
ALTER TABLE outbox_by_seq RENAME TO outbox;
CREATE INDEX outbox_by_execution ON outbox (execution_id, seq);
