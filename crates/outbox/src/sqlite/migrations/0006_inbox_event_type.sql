-- The inbox records the event type applied (its ids are text already).
ALTER TABLE {inbox} ADD COLUMN event_type TEXT;
