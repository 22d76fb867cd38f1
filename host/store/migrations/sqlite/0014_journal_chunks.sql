-- The journal is written one row per commit, not one per host call: a commit of an activation
-- carries all the calls since its last commit (34 rows of a ten-stage execution become one or
-- two). A row holds its entries as a JSON array; a later row's entry replaces an earlier one's
-- of the same `seq` (an intent or a wait answered), and a row with `truncate_from` drops every
-- entry from that sequence number on (a resume, retry-finalization). Rows are read in `id`
-- order, which is commit order: a run's writes are fenced to one activation at a time.
CREATE TABLE journal_chunks (
    id              INTEGER PRIMARY KEY,
    run_id          TEXT NOT NULL REFERENCES runs (id),
    first_seq       INTEGER NOT NULL,
    truncate_from   INTEGER,
    entries         TEXT NOT NULL
);
CREATE INDEX journal_chunks_by_run ON journal_chunks (run_id, id);

INSERT INTO journal_chunks (run_id, first_seq, truncate_from, entries)
SELECT run_id, seq, NULL,
       json_array(CASE WHEN response IS NULL
           THEN json_object('seq', seq, 'op', op, 'request', json(request), 'status', status, 'at', at_ms)
           ELSE json_object('seq', seq, 'op', op, 'request', json(request), 'response', json(response),
                            'status', status, 'at', at_ms) END)
FROM journal ORDER BY run_id, seq;

DROP TABLE journal;
