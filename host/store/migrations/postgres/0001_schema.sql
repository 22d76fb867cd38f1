-- Capstan's schema on PostgreSQL: the same tables and columns as the SQLite migrations (their
-- history folded into one file, since PostgreSQL support starts here), in PostgreSQL's types:
-- integers are BIGINT (what sqlx's Any driver reads as i64 on both backends), flags are 0/1
-- BIGINTs as on SQLite, JSON is TEXT, SQLite's AUTOINCREMENT keys are identity columns.
-- Later changes come as numbered migrations in both directories.

-- ---- from sqlite/0001_init.sql ----
-- Capstan's first schema: settings the process records about itself.
-- The durable engine's tables (executions, runs, journal, receipts, ...) arrive in 0002.
CREATE TABLE IF NOT EXISTS capstan_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);
INSERT INTO capstan_meta (key, value) VALUES ('schema', 'capstan') ON CONFLICT DO NOTHING;

-- ---- from sqlite/0002_engine.sql ----
-- The durable engine. Times are milliseconds since the Unix epoch (the injected Clock's unit).

-- An execution: the API resource.
CREATE TABLE executions (
    id                          TEXT PRIMARY KEY NOT NULL,
    workflow                    TEXT NOT NULL,
    principal_id                TEXT NOT NULL,
    status                      TEXT NOT NULL,   -- queued running waiting paused succeeded failed canceled rolled_back
    status_reason               TEXT,            -- why paused/failed (e.g. nondeterministic_replay)
    current_stage               TEXT,
    created_ms                  BIGINT NOT NULL,
    finished_ms                 BIGINT,
    cancellation_requested_ms   BIGINT,
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
    position        BIGINT NOT NULL,
    stage_name      TEXT NOT NULL,
    status          TEXT NOT NULL,                -- running waiting succeeded failed
    started_ms      BIGINT NOT NULL,
    finished_ms     BIGINT,
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
    wake_ms             BIGINT NOT NULL,         -- runnable no earlier than this
    lease_owner         TEXT,
    lease_expires_ms    BIGINT,
    activations         BIGINT NOT NULL DEFAULT 0,
    cancel_requested    BIGINT NOT NULL DEFAULT 0,
    created_ms          BIGINT NOT NULL
);
CREATE INDEX runs_runnable ON runs (state, wake_ms);

-- Every host call of a run, in order. status: done | intent (side effect about to be attempted) | waiting.
CREATE TABLE journal (
    run_id      TEXT NOT NULL REFERENCES runs (id),
    seq         BIGINT NOT NULL,
    op          TEXT NOT NULL,
    request     TEXT NOT NULL,
    response    TEXT,
    status      TEXT NOT NULL,
    at_ms       BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- What each side effect did, to undo it exactly.
CREATE TABLE receipts (
    id                  TEXT PRIMARY KEY NOT NULL,
    execution_id        TEXT NOT NULL REFERENCES executions (id),
    run_id              TEXT NOT NULL,
    seq                 BIGINT NOT NULL,
    op                  TEXT NOT NULL,
    request             TEXT NOT NULL,
    response            TEXT NOT NULL,
    created_ms          BIGINT NOT NULL,
    compensated_ms      BIGINT
);
CREATE INDEX receipts_by_call ON receipts (run_id, seq);
CREATE INDEX receipts_by_execution ON receipts (execution_id, created_ms);

-- Waits of a run: timer, approval, convergence.
CREATE TABLE waits (
    run_id          TEXT NOT NULL REFERENCES runs (id),
    seq             BIGINT NOT NULL,
    kind            TEXT NOT NULL,
    name            TEXT,
    digest          TEXT,
    payload_json    TEXT,
    wake_ms         BIGINT,
    deadline_ms     BIGINT,
    attempts        BIGINT NOT NULL DEFAULT 0,
    resolved_json   TEXT,
    PRIMARY KEY (run_id, seq)
);

-- Commands, through a per-execution lane: at most one queued or active at a time.
CREATE TABLE commands (
    id              TEXT PRIMARY KEY NOT NULL,
    execution_id    TEXT NOT NULL REFERENCES executions (id),
    operation       TEXT NOT NULL,
    status          TEXT NOT NULL,               -- queued active completed failed
    created_ms      BIGINT NOT NULL,
    finished_ms     BIGINT,
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
    created_ms      BIGINT NOT NULL,
    PRIMARY KEY (principal_id, workflow, key)
);

-- The outbox: events committed with the state change that caused them, ordered per execution.
CREATE TABLE outbox (
    seq                     BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    event_id                TEXT NOT NULL UNIQUE,
    execution_id            TEXT NOT NULL,
    event_type              TEXT NOT NULL,
    event_version           TEXT NOT NULL,
    principal_id            TEXT NOT NULL,
    workflow                TEXT NOT NULL,
    payload_json            TEXT NOT NULL,
    occurred_ms             BIGINT NOT NULL,
    traceparent             TEXT,
    routed_ms               BIGINT,
    stream_published_ms     BIGINT,
    dispatched_ms           BIGINT
);
CREATE INDEX outbox_by_execution ON outbox (execution_id, seq);

-- ---- from sqlite/0003_simulator_and_auth.sql ----
-- The simulated cloud (embedded default provider): its state lives beside the engine's.
CREATE TABLE sim_effects (
    token       TEXT PRIMARY KEY NOT NULL,   -- the engine's idempotency token
    op          TEXT NOT NULL,
    request     TEXT NOT NULL,
    response    TEXT NOT NULL,
    at_ms       BIGINT NOT NULL
);
CREATE TABLE sim_zones (
    id      TEXT PRIMARY KEY NOT NULL,
    name    TEXT NOT NULL UNIQUE
);
CREATE TABLE sim_records (
    zone_id     TEXT NOT NULL,
    name        TEXT NOT NULL,
    type        TEXT NOT NULL,
    body        TEXT NOT NULL,               -- the record set as JSON
    PRIMARY KEY (zone_id, name, type)
);
CREATE TABLE sim_changes (
    id              TEXT PRIMARY KEY NOT NULL,
    zone_id         TEXT NOT NULL,
    submitted_ms    BIGINT NOT NULL,
    insync_ms       BIGINT NOT NULL
);

-- Operator grants of permissions to principals (besides the config file).
CREATE TABLE principal_grants (
    principal_id    TEXT NOT NULL,
    permission      TEXT NOT NULL,
    PRIMARY KEY (principal_id, permission)
);

-- API keys: only an HMAC of the key under a versioned pepper is stored.
CREATE TABLE api_keys (
    id              TEXT PRIMARY KEY NOT NULL,
    principal_id    TEXT NOT NULL,
    prefix          TEXT NOT NULL,
    hash            TEXT NOT NULL,
    pepper_version  BIGINT NOT NULL,
    created_ms      BIGINT NOT NULL,
    expires_ms      BIGINT NOT NULL,
    last_used_ms    BIGINT,
    revoked_ms      BIGINT
);
CREATE INDEX api_keys_by_prefix ON api_keys (prefix);
CREATE INDEX api_keys_by_principal ON api_keys (principal_id, created_ms);

-- Every authorization decision.
CREATE TABLE audit_logs (
    id              TEXT PRIMARY KEY NOT NULL,
    at_ms           BIGINT NOT NULL,
    principal_id    TEXT NOT NULL,
    action          TEXT NOT NULL,
    method          TEXT NOT NULL,
    route           TEXT NOT NULL,
    resource        TEXT NOT NULL,
    result          TEXT NOT NULL,
    execution_id    TEXT,
    ip              TEXT,
    user_agent      TEXT
);
CREATE INDEX audit_logs_by_time ON audit_logs (at_ms);

-- ---- from sqlite/0004_simulated_services.sql ----
-- The simulated cloud's services beyond DNS (registrar, certificates, CDN, maps, functions,
-- ticketing): one JSON document per object, keyed by kind and id. Their shapes are the WIT
-- records the workflows see (docs/simulator.md).
CREATE TABLE sim_objects (
    kind    TEXT NOT NULL,
    id      TEXT NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (kind, id)
);

-- How often each fault rule has fired (rules with `times` fail only the first N calls).
CREATE TABLE sim_fault_hits (
    rule    TEXT PRIMARY KEY NOT NULL,
    hits    BIGINT NOT NULL
);

-- ---- from sqlite/0005_event_versions.sql ----
-- Operator overrides of event-version lifecycles (the catalog in code says every version is
-- active unless it says otherwise): a row deprecates or archives one `<EventType>.v<N>`.
CREATE TABLE event_versions (
    event_type      TEXT NOT NULL,
    event_version   TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('active', 'deprecated', 'archived')),
    deprecated_ms   BIGINT,
    archived_ms     BIGINT,
    replacement     TEXT,                    -- `<EventType>.v<N>` to move to
    updated_ms      BIGINT NOT NULL,
    PRIMARY KEY (event_type, event_version)
);

-- ---- from sqlite/0006_stream_tokens.sql ----
-- Single-use stream tokens (POST /v1/streams/token): only a SHA-256 of the token is stored.
CREATE TABLE stream_tokens (
    hash            TEXT PRIMARY KEY NOT NULL,
    principal_id    TEXT NOT NULL,
    created_ms      BIGINT NOT NULL,
    expires_ms      BIGINT NOT NULL,
    used_ms         BIGINT
);
CREATE INDEX stream_tokens_by_expiry ON stream_tokens (expires_ms);

-- ---- from sqlite/0007_subscriptions.sql ----
-- Webhook subscriptions and their delivery attempts (docs/events.md). Secrets are stored sealed
-- (AES-256-GCM under the local keyring named by kms_key_id), never in clear.
CREATE TABLE subscriptions (
    id                      TEXT PRIMARY KEY NOT NULL,
    owner_principal_id      TEXT NOT NULL,
    url                     TEXT NOT NULL,
    events                  TEXT NOT NULL,              -- JSON array of "<EventType>.v<N>"
    active                  BIGINT NOT NULL,
    health                  TEXT NOT NULL DEFAULT 'healthy',
    kms_key_id              TEXT NOT NULL,
    secret_sealed           TEXT NOT NULL,
    previous_kms_key_id     TEXT,                       -- during a rotation both secrets sign
    previous_secret_sealed  TEXT,
    previous_until_ms       BIGINT,
    created_ms              BIGINT NOT NULL,
    deleted_ms              BIGINT,
    disabled_reason         TEXT
);
CREATE INDEX subscriptions_by_owner ON subscriptions (owner_principal_id, created_ms);

CREATE TABLE deliveries (
    id                  TEXT PRIMARY KEY NOT NULL,
    subscription_id     TEXT NOT NULL REFERENCES subscriptions (id),
    event_id            TEXT NOT NULL,
    event_seq           BIGINT NOT NULL,
    attempt             BIGINT NOT NULL,
    status              TEXT NOT NULL,                  -- pending | succeeded | failed | exhausted
    created_ms          BIGINT NOT NULL,
    next_attempt_ms     BIGINT,
    dispatched_ms       BIGINT,
    response_code       BIGINT,
    last_error          TEXT
);
CREATE INDEX deliveries_pending ON deliveries (status, subscription_id, event_seq);
CREATE INDEX deliveries_by_subscription ON deliveries (subscription_id, created_ms);

-- How far the relay has routed the outbox to subscriptions.
CREATE TABLE relay_cursor (
    name    TEXT PRIMARY KEY NOT NULL,
    seq     BIGINT NOT NULL
);

-- ---- from sqlite/0008_execution_traceparent.sql ----
-- The W3C trace context of the request that created an execution, stamped on all its events.
ALTER TABLE executions ADD COLUMN traceparent TEXT;
