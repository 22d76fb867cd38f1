-- Webhook attempts are claimed with a lease by the node that sends them (several nodes may share
-- one database); a dead node's claims are taken over once their lease has run out.
ALTER TABLE deliveries ADD COLUMN lease_owner TEXT;
ALTER TABLE deliveries ADD COLUMN lease_expires_ms BIGINT;
INSERT INTO relay_cursor (name, seq) VALUES ('webhooks', 0) ON CONFLICT (name) DO NOTHING;
-- A subscription's health reads its latest results: newest attempts first, without a sort.
CREATE INDEX deliveries_recent ON deliveries (subscription_id, dispatched_ms);
