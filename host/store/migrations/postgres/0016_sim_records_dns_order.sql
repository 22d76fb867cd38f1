-- The simulated DNS keys its record sets in DNS order: `dns_key` is the name with its labels
-- reversed (`www.example.com` → `com.example.www`, every label kept, empty ones too, so the key
-- is as distinct as the name; `dns_key` in host/providers/src/sim/dns.rs). Keyed by the name as
-- written, one domain's record sets (`www.`, `_acme-challenge.`, `step-1.` … of one domain) were
-- spread over the whole zone's primary key, and a change that created ten of them wrote ten of
-- its leaves; in DNS order they share one.
ALTER TABLE sim_records ADD COLUMN dns_key TEXT;
UPDATE sim_records SET dns_key = array_to_string(
    ARRAY(SELECT label FROM unnest(string_to_array(name, '.')) WITH ORDINALITY AS l (label, i)
          ORDER BY i DESC),
    '.');
ALTER TABLE sim_records ALTER COLUMN dns_key SET NOT NULL;
ALTER TABLE sim_records DROP CONSTRAINT sim_records_pkey;
ALTER TABLE sim_records ADD PRIMARY KEY (zone_id, dns_key, type);
