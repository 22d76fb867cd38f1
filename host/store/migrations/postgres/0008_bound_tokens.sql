-- A provider token is bound to the call it was first used for: the SHA-256 of its operation and
-- request. A repeat with another request is refused instead of answered with the first's result.
-- NULL on rows written before the binding (their operation is still compared).
ALTER TABLE provider_effects ADD COLUMN request_digest TEXT;

-- A stream token is bound to the API key that minted it: revoking the key voids its tokens.
-- NULL on tokens minted before the binding (they expire within minutes).
ALTER TABLE stream_tokens ADD COLUMN key_id TEXT;
