-- The partner booking domain's tables (docs/partner-api.md), kept beside its queries in
-- host/booking; their history is the table `_booking_migrations`, apart from the store's own.
-- Everything a partner creates is keyed by its environment ('production' | 'sandbox'): the two
-- listeners share the catalog but not partners, inventory, bookings or webhooks.

CREATE TABLE partners (
    id              TEXT PRIMARY KEY NOT NULL,
    name            TEXT NOT NULL,
    partner_type    TEXT NOT NULL,                  -- affiliate | booking
    environment     TEXT NOT NULL,                  -- production | sandbox
    key_prefix      TEXT NOT NULL,
    key_hash        TEXT NOT NULL,
    pepper_version  INTEGER NOT NULL,
    created_ms      INTEGER NOT NULL,
    revoked_ms      INTEGER
);
CREATE INDEX partners_by_prefix ON partners (key_prefix);

-- The imported catalog: one document (docs/catalog-format.md), replaced atomically by an import.
CREATE TABLE catalog (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    body        TEXT NOT NULL,
    digest      TEXT NOT NULL,
    imported_ms INTEGER NOT NULL
);

-- Seats taken per slot (held by UNCAPTURED bookings or sold). The row is created on the first
-- booking of a slot with the catalog's capacity; `taken <= capacity` is the no-oversell invariant.
CREATE TABLE slot_usage (
    environment TEXT NOT NULL,
    slot_id     TEXT NOT NULL,
    capacity    INTEGER NOT NULL,
    taken       INTEGER NOT NULL CHECK (taken >= 0),
    PRIMARY KEY (environment, slot_id),
    CHECK (taken <= capacity)
);

-- Seat codes taken in seatmap slots.
CREATE TABLE slot_seats (
    environment TEXT NOT NULL,
    slot_id     TEXT NOT NULL,
    seat_code   TEXT NOT NULL,
    booking_id  INTEGER NOT NULL,
    PRIMARY KEY (environment, slot_id, seat_code)
);

CREATE TABLE bookings (
    id                      INTEGER PRIMARY KEY AUTOINCREMENT,
    environment             TEXT NOT NULL,
    partner_id              TEXT NOT NULL REFERENCES partners (id),
    api_version             INTEGER NOT NULL,        -- 1 | 2: the shape it was created with
    status                  TEXT NOT NULL,
    product_id              TEXT NOT NULL,
    product_name            TEXT NOT NULL,
    product_type            TEXT NOT NULL,
    variant_id              TEXT NOT NULL,
    variant_name            TEXT NOT NULL,
    slot_id                 TEXT NOT NULL,
    start_local             TEXT NOT NULL,           -- YYYY-MM-DDTHH:MM:SS
    pax                     INTEGER NOT NULL,
    customers               TEXT NOT NULL,           -- JSON customersDetails as stored
    variant_input_fields    TEXT,                    -- JSON or NULL
    seat_info               TEXT,                    -- JSON or NULL
    price_amount            REAL NOT NULL,
    price_currency          TEXT NOT NULL,
    partner_reference_id    TEXT,
    tickets                 TEXT NOT NULL DEFAULT '[]',
    voucher_url             TEXT NOT NULL,
    policy                  TEXT NOT NULL,           -- JSON cancellation/reschedule policy at sale
    idempotency_key         TEXT,
    request_hash            TEXT,
    created_ms              INTEGER NOT NULL,
    capture_deadline_ms     INTEGER NOT NULL,
    updated_ms              INTEGER NOT NULL,
    cancel_reason           TEXT,
    failure_reason          TEXT,
    -- The supplier's IANA time zone, fixed at sale: the booking's local times (start, cut-offs,
    -- webhook eventTimestamp) are read in it even if the catalog changes later.
    time_zone               TEXT NOT NULL DEFAULT 'UTC'
);
CREATE UNIQUE INDEX bookings_idempotency ON bookings (environment, partner_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX bookings_by_partner ON bookings (environment, partner_id, id);
CREATE INDEX bookings_uncaptured ON bookings (status, capture_deadline_ms);

-- Every status change of a booking, in order (the history and the webhook source).
CREATE TABLE booking_events (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    booking_id      INTEGER NOT NULL REFERENCES bookings (id),
    status          TEXT NOT NULL,
    at_ms           INTEGER NOT NULL,
    event_local     TEXT NOT NULL                    -- eventTimestamp: local time, no zone
);
CREATE INDEX booking_events_by_booking ON booking_events (booking_id, seq);

-- Durable fulfilment jobs: one per captured booking, advanced step by step.
CREATE TABLE fulfilment_jobs (
    booking_id      INTEGER PRIMARY KEY NOT NULL REFERENCES bookings (id),
    step_index      INTEGER NOT NULL,
    step_input      TEXT NOT NULL DEFAULT 'null',   -- the previous step's output
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_ms INTEGER NOT NULL,
    lease_until_ms  INTEGER,
    state           TEXT NOT NULL,                  -- running | done | failed
    last_error      TEXT
);
CREATE INDEX fulfilment_due ON fulfilment_jobs (state, next_attempt_ms);

-- Partner booking webhooks (POST /api/public/v2/webhooks/).
CREATE TABLE booking_webhooks (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    environment     TEXT NOT NULL,
    partner_id      TEXT NOT NULL REFERENCES partners (id),
    url             TEXT NOT NULL,
    enabled         INTEGER NOT NULL,
    kms_key_id      TEXT NOT NULL,
    secret_sealed   TEXT NOT NULL,
    created_ms      INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL,
    deleted_ms      INTEGER
);
CREATE INDEX booking_webhooks_by_partner ON booking_webhooks (environment, partner_id);

CREATE TABLE booking_webhook_deliveries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id      INTEGER NOT NULL REFERENCES booking_webhooks (id),
    booking_id      INTEGER NOT NULL,
    event_seq       INTEGER NOT NULL,
    payload         TEXT NOT NULL,                  -- {bookingId, status, eventTimestamp}
    message_id      TEXT NOT NULL,                  -- webhook-id, stable across retries
    attempts        INTEGER NOT NULL DEFAULT 0,
    status          TEXT NOT NULL,                  -- pending | succeeded | failed | exhausted
    next_attempt_ms INTEGER,
    response_code   INTEGER,
    last_error      TEXT,
    created_ms      INTEGER NOT NULL
);
CREATE INDEX booking_webhook_due ON booking_webhook_deliveries (status, next_attempt_ms);
