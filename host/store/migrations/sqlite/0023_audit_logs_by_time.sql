-- Audit records are read newest first, by time (`GET /v1/audit-logs`), deleted oldest first
-- (retention), and never looked up by id alone, so the table is rebuilt WITHOUT ROWID keyed by
-- (at_ms, id): a record is written to one B-tree, not to the table, its id's automatic index and
-- the time index. Every allowed read writes one behind its answer, so this is most of what an
-- execution read costs the group writer (`python3 host/bench/index_inserts.py 5 audit_logs`).
-- The copy takes as long as the table is large: an upgrade with a year of records pauses here.
CREATE TABLE audit_logs_new (
    id              TEXT NOT NULL,
    at_ms           INTEGER NOT NULL,
    principal_id    TEXT NOT NULL,
    action          TEXT NOT NULL,
    method          TEXT NOT NULL,
    route           TEXT NOT NULL,
    resource        TEXT NOT NULL,
    result          TEXT NOT NULL,
    execution_id    TEXT,
    ip              TEXT,
    user_agent      TEXT,
    PRIMARY KEY (at_ms, id)
) WITHOUT ROWID;
INSERT INTO audit_logs_new
    (id, at_ms, principal_id, action, method, route, resource, result, execution_id, ip, user_agent)
    SELECT id, at_ms, principal_id, action, method, route, resource, result, execution_id, ip, user_agent
    FROM audit_logs;
DROP TABLE audit_logs;
ALTER TABLE audit_logs_new RENAME TO audit_logs;
