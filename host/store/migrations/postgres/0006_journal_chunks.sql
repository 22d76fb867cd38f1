-- The journal is written one row per commit, not one per host call: a commit of an activation
-- carries all the calls since its last commit (34 rows of a ten-stage execution become one or
-- two). A row holds its entries as a JSON array; a later row's entry replaces an earlier one's
-- of the same `seq` (an intent or a wait answered), and a row with `truncate_from` drops every
-- entry from that sequence number on (a resume, retry-finalization). Rows are read in `id`
-- order, which is commit order: a run's writes are fenced to one activation at a time.
CREATE TABLE journal_chunks (
    id              BIGSERIAL PRIMARY KEY,
    run_id          TEXT NOT NULL REFERENCES runs (id),
    first_seq       BIGINT NOT NULL,
    truncate_from   BIGINT,
    entries         TEXT NOT NULL
);
CREATE INDEX journal_chunks_by_run ON journal_chunks (run_id, id);

INSERT INTO journal_chunks (run_id, first_seq, truncate_from, entries)
SELECT run_id, seq, NULL,
       jsonb_build_array(CASE WHEN response IS NULL
           THEN jsonb_build_object('seq', seq, 'op', op, 'request', request::jsonb, 'status', status, 'at', at_ms)
           ELSE jsonb_build_object('seq', seq, 'op', op, 'request', request::jsonb, 'response', response::jsonb,
                                   'status', status, 'at', at_ms) END)::text
FROM journal ORDER BY run_id, seq;

DROP TABLE journal;
