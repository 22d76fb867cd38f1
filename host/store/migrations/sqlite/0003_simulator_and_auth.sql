-- The simulated cloud (embedded default provider): its state lives beside the engine's.
CREATE TABLE sim_effects (
    token       TEXT PRIMARY KEY NOT NULL,   -- the engine's idempotency token
    op          TEXT NOT NULL,
    request     TEXT NOT NULL,
    response    TEXT NOT NULL,
    at_ms       INTEGER NOT NULL
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
    submitted_ms    INTEGER NOT NULL,
    insync_ms       INTEGER NOT NULL
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
    pepper_version  INTEGER NOT NULL,
    created_ms      INTEGER NOT NULL,
    expires_ms      INTEGER NOT NULL,
    last_used_ms    INTEGER,
    revoked_ms      INTEGER
);
CREATE INDEX api_keys_by_prefix ON api_keys (prefix);
CREATE INDEX api_keys_by_principal ON api_keys (principal_id, created_ms);

-- Every authorization decision.
CREATE TABLE audit_logs (
    id              TEXT PRIMARY KEY NOT NULL,
    at_ms           INTEGER NOT NULL,
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
