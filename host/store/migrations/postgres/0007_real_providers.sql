-- Real providers (capstan-adapters). A side effect under an engine token writes what it is about
-- to do (`intent`) before it reaches the provider and what the provider answered (`done`) after,
-- so a repeat of the token after a crash is recognised as the same request: answered again, or
-- finished from the intent, never done twice.
CREATE TABLE provider_effects (
    token       TEXT PRIMARY KEY NOT NULL,
    provider    TEXT NOT NULL,
    op          TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('intent', 'done')),
    body        TEXT NOT NULL,
    at_ms       BIGINT NOT NULL
);

-- RFC 2136 changes, for `dns.get-change`: the record sets as the change left them and the
-- primary's SOA serial right after it (secondaries are in sync once they serve that serial).
CREATE TABLE dns_changes (
    id          TEXT PRIMARY KEY NOT NULL,
    zone        TEXT NOT NULL,
    expected    TEXT NOT NULL,
    serial      BIGINT,
    at_ms       BIGINT NOT NULL
);

-- ACME certificates: one row per order (`arn` is the order URL). The chain and the private key
-- are sealed with the secret keyring (AES-256-GCM, bound to the arn) and never leave through the
-- API; `capstan certificates export` is the one way out.
CREATE TABLE acme_certificates (
    arn             TEXT PRIMARY KEY NOT NULL,
    token           TEXT NOT NULL,
    domain          TEXT NOT NULL,
    names           TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending-validation', 'issued', 'failed', 'revoked')),
    validation      TEXT NOT NULL,
    requested_ms    BIGINT NOT NULL,
    issued_ms       BIGINT,
    error           TEXT,
    kms_key_id      TEXT,
    chain_sealed    TEXT,
    key_sealed      TEXT
);
CREATE INDEX acme_certificates_by_domain ON acme_certificates (domain);
