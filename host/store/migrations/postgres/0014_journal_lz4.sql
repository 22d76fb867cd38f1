-- A run's journal chunk is the largest value the engine writes at every durable point (about
-- 7 KB of JSON for a ten-stage run's last commit), so PostgreSQL compresses it on insert. With
-- the server's default method, pglz, that compression was ~5 % of the group writer's backend
-- CPU in the engine bench (`perf record` of the backend); lz4 compresses it several times
-- faster, at a somewhat larger size. A server built without lz4 keeps pglz.
DO $$
BEGIN
    ALTER TABLE journal_chunks ALTER COLUMN entries SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    NULL;
END
$$;
