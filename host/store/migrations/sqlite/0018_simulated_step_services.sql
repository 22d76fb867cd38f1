-- The simulated supplier, admission and voucher services behind the booking fulfilment steps
-- keep each effect once per idempotency key, as a real supplier does: a step re-run after a
-- crash (same key) gets the first answer back, and `calls` counts how often it was asked.
-- `amount_minor` and `currency` are what the booking was worth when the effect was made (in the
-- currency's minor units), as a supplier's confirmation records what it is paid.
CREATE TABLE sim_step_effects (
    idempotency_key TEXT    NOT NULL,
    op              TEXT    NOT NULL,
    booking_id      TEXT    NOT NULL,
    answer          TEXT    NOT NULL,
    amount_minor    INTEGER,
    currency        TEXT,
    calls           INTEGER NOT NULL DEFAULT 1,
    created_ms      INTEGER NOT NULL,
    PRIMARY KEY (idempotency_key, op)
);
CREATE INDEX sim_step_effects_booking ON sim_step_effects (booking_id);
CREATE INDEX sim_step_effects_created ON sim_step_effects (created_ms);
