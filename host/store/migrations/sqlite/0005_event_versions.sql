-- Operator overrides of event-version lifecycles (the catalog in code says every version is
-- active unless it says otherwise): a row deprecates or archives one `<EventType>.v<N>`.
CREATE TABLE event_versions (
    event_type      TEXT NOT NULL,
    event_version   TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('active', 'deprecated', 'archived')),
    deprecated_ms   INTEGER,
    archived_ms     INTEGER,
    replacement     TEXT,                    -- `<EventType>.v<N>` to move to
    updated_ms      INTEGER NOT NULL,
    PRIMARY KEY (event_type, event_version)
);
