-- The claim (`claim_runs`) takes the earliest due runnable runs with `FOR UPDATE SKIP LOCKED`.
-- Left to the planner, the plan depended on the table's statistics: on a table not yet analyzed
-- (a fresh database, a burst of triggers before autovacuum's first ANALYZE, autovacuum off) it
-- estimated a handful of rows and read every runnable run through a bitmap scan, then sorted
-- them — with 3,000 runs queued ~0.3–1 ms and ~50 pages per claim (`pg_stat_statements`,
-- `auto_explain`), on every claim. The claim wants the first few runs in `wake_ms` order and
-- nothing else, so it runs in a function whose plan may neither build a bitmap nor sort: an
-- index scan over the runnable runs only (`runs_due`), in order, stopping at the LIMIT.
-- `runs_runnable` stays for the counts by state (`run_counts`).
CREATE INDEX runs_due ON runs (wake_ms) WHERE state = 'runnable';

CREATE FUNCTION capstan_claim_runs(p_owner TEXT, p_lease_until BIGINT, p_now BIGINT, p_limit BIGINT)
RETURNS SETOF runs
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY
    UPDATE runs SET lease_owner = p_owner, lease_expires_ms = p_lease_until,
                    activations = activations + 1
     WHERE id IN (
        SELECT id FROM runs WHERE state = 'runnable' AND wake_ms <= p_now
           AND (lease_owner IS NULL OR lease_expires_ms < p_now)
         ORDER BY wake_ms LIMIT p_limit FOR UPDATE SKIP LOCKED)
    RETURNING *;
END
$$;
