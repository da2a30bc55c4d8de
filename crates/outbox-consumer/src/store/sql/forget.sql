-- The state row of an aggregate that tracks nothing any more (no version, no start, nothing
-- held: one the version gate does not order, once its held events are gone). A statement of
-- its own: it must see the count `uncount.sql` just wrote.
-- $1 consumer, $2 aggregate type, $3 aggregate id
DELETE FROM {schema}.consumer_versions
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
  AND held = 0 AND version IS NULL AND first_version IS NULL AND NOT seeded
