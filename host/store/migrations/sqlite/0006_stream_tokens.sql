-- Single-use stream tokens (POST /v1/streams/token): only a SHA-256 of the token is stored.
CREATE TABLE stream_tokens (
    hash            TEXT PRIMARY KEY NOT NULL,
    principal_id    TEXT NOT NULL,
    created_ms      INTEGER NOT NULL,
    expires_ms      INTEGER NOT NULL,
    used_ms         INTEGER
);
CREATE INDEX stream_tokens_by_expiry ON stream_tokens (expires_ms);
