-- No statement looks a receipt up by its call: rollback reads an execution's receipts
-- (`receipts_by_execution`) and marks one compensated by its id (the primary key). The index on
-- (run_id, seq) was one more index entry written per effect, ten per ten-stage execution, and
-- read by nothing.
DROP INDEX IF EXISTS receipts_by_call;
