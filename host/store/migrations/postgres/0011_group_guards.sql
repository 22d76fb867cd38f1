-- A guard of the group writer (host/store/src/pg_writer.rs), which pipelines a group's
-- statements and so cannot look at a guard's rows before the next statement runs: the guard
-- raises instead, which aborts the transaction. `returned` is how many rows the guard returned,
-- `first_column` that of the first (as jsonb); `fence` says whether it is a run's fence,
-- for which a first column of 1 is a cancel request. CP001: no row (the lease lost, the
-- condition gone); CP002: the run was asked to cancel.
CREATE FUNCTION capstan_guard(returned BIGINT, first_column JSONB, fence BOOLEAN) RETURNS BIGINT
LANGUAGE plpgsql AS $$
BEGIN
    IF returned = 0 THEN
        RAISE EXCEPTION 'a guard of the group did not hold' USING ERRCODE = 'CP001';
    END IF;
    IF fence AND first_column = '1'::jsonb THEN
        RAISE EXCEPTION 'the run was asked to cancel' USING ERRCODE = 'CP002';
    END IF;
    RETURN returned;
END
$$;
