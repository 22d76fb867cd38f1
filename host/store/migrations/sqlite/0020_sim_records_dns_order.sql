-- The simulated DNS keys its record sets in DNS order: `dns_key` is the name with its labels
-- reversed (`www.example.com` → `com.example.www`, every label kept, empty ones too, so the key
-- is as distinct as the name; `dns_key` in host/providers/src/sim/dns.rs). Keyed by the name as
-- written, one domain's record sets (`www.`, `_acme-challenge.`, `step-1.` … of one domain) were
-- spread over the whole zone, and a change that created ten of them wrote ten leaves of the key;
-- in DNS order they share one. The table is rebuilt WITHOUT ROWID: it is only ever read by its
-- key or its zone, and a record set's row is small, so the key's B-tree holds the rows and an
-- insert writes one B-tree, not a table and its key's index.
CREATE TABLE sim_records_dns (
    zone_id     TEXT NOT NULL,
    dns_key     TEXT NOT NULL,               -- the name, labels reversed
    name        TEXT NOT NULL,
    type        TEXT NOT NULL,
    body        TEXT NOT NULL,               -- the record set as JSON
    PRIMARY KEY (zone_id, dns_key, type)
) WITHOUT ROWID;

-- Each name's labels reversed: `rest` is what is left to read, `key` the reversed labels so far.
INSERT INTO sim_records_dns (zone_id, dns_key, name, type, body)
WITH RECURSIVE parts (zone_id, name, type, body, rest, key) AS (
    SELECT zone_id, name, type, body, name, NULL FROM sim_records
    UNION ALL
    SELECT zone_id, name, type, body,
           CASE WHEN instr(rest, '.') > 0 THEN substr(rest, instr(rest, '.') + 1) END,
           CASE WHEN instr(rest, '.') > 0 THEN substr(rest, 1, instr(rest, '.') - 1) ELSE rest END
               || CASE WHEN key IS NULL THEN '' ELSE '.' || key END
    FROM parts
    WHERE rest IS NOT NULL
)
SELECT zone_id, key, name, type, body FROM parts WHERE rest IS NULL;

DROP TABLE sim_records;
ALTER TABLE sim_records_dns RENAME TO sim_records;
