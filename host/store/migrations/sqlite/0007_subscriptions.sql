-- Webhook subscriptions and their delivery attempts (docs/events.md). Secrets are stored sealed
-- (AES-256-GCM under the local keyring named by kms_key_id), never in clear.
CREATE TABLE subscriptions (
    id                      TEXT PRIMARY KEY NOT NULL,
    owner_principal_id      TEXT NOT NULL,
    url                     TEXT NOT NULL,
    events                  TEXT NOT NULL,              -- JSON array of "<EventType>.v<N>"
    active                  INTEGER NOT NULL,
    health                  TEXT NOT NULL DEFAULT 'healthy',
    kms_key_id              TEXT NOT NULL,
    secret_sealed           TEXT NOT NULL,
    previous_kms_key_id     TEXT,                       -- during a rotation both secrets sign
    previous_secret_sealed  TEXT,
    previous_until_ms       INTEGER,
    created_ms              INTEGER NOT NULL,
    deleted_ms              INTEGER,
    disabled_reason         TEXT
);
CREATE INDEX subscriptions_by_owner ON subscriptions (owner_principal_id, created_ms);

CREATE TABLE deliveries (
    id                  TEXT PRIMARY KEY NOT NULL,
    subscription_id     TEXT NOT NULL REFERENCES subscriptions (id),
    event_id            TEXT NOT NULL,
    event_seq           INTEGER NOT NULL,
    attempt             INTEGER NOT NULL,
    status              TEXT NOT NULL,                  -- pending | succeeded | failed | exhausted
    created_ms          INTEGER NOT NULL,
    next_attempt_ms     INTEGER,
    dispatched_ms       INTEGER,
    response_code       INTEGER,
    last_error          TEXT
);
CREATE INDEX deliveries_pending ON deliveries (status, subscription_id, event_seq);
CREATE INDEX deliveries_by_subscription ON deliveries (subscription_id, created_ms);

-- How far the relay has routed the outbox to subscriptions.
CREATE TABLE relay_cursor (
    name    TEXT PRIMARY KEY NOT NULL,
    seq     INTEGER NOT NULL
);
