-- A simulated DNS change is read only by its id (`dns.get-change`), and its row is small, so the
-- table is rebuilt WITHOUT ROWID: the key's B-tree holds the rows, and a change is written to one
-- B-tree, not to the table and its id's automatic index (ten per ten-stage execution of the
-- bench's fixture). The simulated effects and the receipts keep their rowid tables: their rows
-- (a request and an answer each) are large enough that keyed by their token they wrote more pages
-- per commit, not fewer (`python3 host/bench/index_inserts.py`).
CREATE TABLE sim_changes_by_id (
    id              TEXT NOT NULL,
    zone_id         TEXT NOT NULL,
    submitted_ms    INTEGER NOT NULL,
    insync_ms       INTEGER NOT NULL,
    PRIMARY KEY (id)
) WITHOUT ROWID;
INSERT INTO sim_changes_by_id (id, zone_id, submitted_ms, insync_ms)
    SELECT id, zone_id, submitted_ms, insync_ms FROM sim_changes;
DROP TABLE sim_changes;
ALTER TABLE sim_changes_by_id RENAME TO sim_changes;
