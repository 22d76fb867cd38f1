-- Audit records are read newest first, by time (`GET /v1/audit-logs`), deleted oldest first
-- (retention), and never looked up by id alone: one index on (at_ms, id) serves both and keeps
-- ids unique, instead of one on id and another on at_ms (sqlite/0023_audit_logs_by_time.sql).
ALTER TABLE audit_logs DROP CONSTRAINT audit_logs_pkey;
DROP INDEX audit_logs_by_time;
ALTER TABLE audit_logs ADD PRIMARY KEY (at_ms, id);
