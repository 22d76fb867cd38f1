-- The supplier's IANA time zone, fixed at sale: the booking's local times (start, cut-offs,
-- webhook eventTimestamp) are read in it even if the catalog changes later.
ALTER TABLE bookings ADD COLUMN time_zone TEXT NOT NULL DEFAULT 'UTC';
