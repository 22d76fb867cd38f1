-- The simulated cloud's services beyond DNS (registrar, certificates, CDN, maps, functions,
-- ticketing): one JSON document per object, keyed by kind and id. Their shapes are the WIT
-- records the workflows see (docs/simulator.md).
CREATE TABLE sim_objects (
    kind    TEXT NOT NULL,
    id      TEXT NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (kind, id)
);

-- How often each fault rule has fired (rules with `times` fail only the first N calls).
CREATE TABLE sim_fault_hits (
    rule    TEXT PRIMARY KEY NOT NULL,
    hits    INTEGER NOT NULL
);
