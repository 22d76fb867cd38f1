-- Capstan's first schema: settings the process records about itself.
-- The durable engine's tables (executions, runs, journal, receipts, ...) arrive in 0002.
CREATE TABLE IF NOT EXISTS capstan_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);
INSERT OR IGNORE INTO capstan_meta (key, value) VALUES ('schema', 'capstan');
