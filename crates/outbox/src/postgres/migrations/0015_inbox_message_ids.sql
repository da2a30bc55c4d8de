-- The inbox takes any text message id (a CloudEvents `id`, another producer's key), not only a
-- UUID, and records the event type applied. A UUID keeps its text form (lowercase, hyphenated),
-- which is how consumers record UUID ids, so rows written before stay recognised. Rewrites the
-- table once, under an exclusive lock.
ALTER TABLE {schema}.inbox
    ALTER COLUMN event_id TYPE text USING event_id::text,
    ADD COLUMN event_type text,
    ADD CONSTRAINT inbox_event_id_not_empty CHECK (event_id <> '');
