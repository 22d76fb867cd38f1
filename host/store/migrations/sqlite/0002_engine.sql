-- The durable engine. Times are milliseconds since the Unix epoch (the injected Clock's unit).

-- An execution: the API resource.
CREATE TABLE executions (
    id                          TEXT PRIMARY KEY NOT NULL,
    workflow                    TEXT NOT NULL,
    principal_id                TEXT NOT NULL,
    status                      TEXT NOT NULL,   -- queued running waiting paused succeeded failed canceled rolled_back
    status_reason               TEXT,            -- why paused/failed (e.g. nondeterministic_replay)
    current_stage               TEXT,
    created_ms                  INTEGER NOT NULL,
    finished_ms                 INTEGER,
    cancellation_requested_ms   INTEGER,
    input_json                  TEXT NOT NULL,
    output_json                 TEXT,
    outcome_json                TEXT,
    run_id                      TEXT NOT NULL    -- the run serving the execution now
);
CREATE INDEX executions_by_workflow ON executions (workflow, id);
CREATE INDEX executions_by_status ON executions (status, id);
CREATE INDEX executions_by_principal ON executions (principal_id, id);

-- Stages as the execution shows them, in order.
CREATE TABLE stages (
    id              TEXT PRIMARY KEY NOT NULL,
    execution_id    TEXT NOT NULL REFERENCES executions (id),
    position        INTEGER NOT NULL,
    stage_name      TEXT NOT NULL,
    status          TEXT NOT NULL,                -- running waiting succeeded failed
    started_ms      INTEGER NOT NULL,
    finished_ms     INTEGER,
    output_json     TEXT,
    error_json      TEXT
);
CREATE UNIQUE INDEX stages_by_execution ON stages (execution_id, position);

-- A run: one engine instance of a workflow component, pinned to its digest.
CREATE TABLE runs (
    id                  TEXT PRIMARY KEY NOT NULL,
    execution_id        TEXT NOT NULL REFERENCES executions (id),
    workflow            TEXT NOT NULL,
    digest              TEXT NOT NULL,
    kind                TEXT NOT NULL,            -- workflow | rollback
    state               TEXT NOT NULL,            -- runnable waiting done
    wake_ms             INTEGER NOT NULL,         -- runnable no earlier than this
    lease_owner         TEXT,
    lease_expires_ms    INTEGER,
    activations         INTEGER NOT NULL DEFAULT 0,
    cancel_requested    INTEGER NOT NULL DEFAULT 0,
    created_ms          INTEGER NOT NULL
);
CREATE INDEX runs_runnable ON runs (state, wake_ms);

-- Every host call of a run, in order. status: done | intent (side effect about to be attempted) | waiting.
CREATE TABLE journal (
    run_id      TEXT NOT NULL REFERENCES runs (id),
    seq         INTEGER NOT NULL,
    op          TEXT NOT NULL,
    request     TEXT NOT NULL,
    response    TEXT,
    status      TEXT NOT NULL,
    at_ms       INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- What each side effect did, to undo it exactly.
CREATE TABLE receipts (
    id                  TEXT PRIMARY KEY NOT NULL,
    execution_id        TEXT NOT NULL REFERENCES executions (id),
    run_id              TEXT NOT NULL,
    seq                 INTEGER NOT NULL,
    op                  TEXT NOT NULL,
    request             TEXT NOT NULL,
    response            TEXT NOT NULL,
    created_ms          INTEGER NOT NULL,
    compensated_ms      INTEGER
);
CREATE INDEX receipts_by_call ON receipts (run_id, seq);
CREATE INDEX receipts_by_execution ON receipts (execution_id, created_ms);

-- Waits of a run: timer, approval, convergence.
CREATE TABLE waits (
    run_id          TEXT NOT NULL REFERENCES runs (id),
    seq             INTEGER NOT NULL,
    kind            TEXT NOT NULL,
    name            TEXT,
    digest          TEXT,
    payload_json    TEXT,
    wake_ms         INTEGER,
    deadline_ms     INTEGER,
    attempts        INTEGER NOT NULL DEFAULT 0,
    resolved_json   TEXT,
    PRIMARY KEY (run_id, seq)
);

-- Commands, through a per-execution lane: at most one queued or active at a time.
CREATE TABLE commands (
    id              TEXT PRIMARY KEY NOT NULL,
    execution_id    TEXT NOT NULL REFERENCES executions (id),
    operation       TEXT NOT NULL,
    status          TEXT NOT NULL,               -- queued active completed failed
    created_ms      INTEGER NOT NULL,
    finished_ms     INTEGER,
    error           TEXT
);
CREATE INDEX commands_by_execution ON commands (execution_id, created_ms);

-- Idempotency reservations of triggers, scoped to principal + workflow.
CREATE TABLE idempotency (
    principal_id    TEXT NOT NULL,
    workflow        TEXT NOT NULL,
    key             TEXT NOT NULL,
    body_sha256     TEXT NOT NULL,
    execution_id    TEXT,
    response_json   TEXT,
    created_ms      INTEGER NOT NULL,
    PRIMARY KEY (principal_id, workflow, key)
);

-- The outbox: events committed with the state change that caused them, ordered per execution.
CREATE TABLE outbox (
    seq                     INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id                TEXT NOT NULL UNIQUE,
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
CREATE INDEX outbox_by_execution ON outbox (execution_id, seq);
