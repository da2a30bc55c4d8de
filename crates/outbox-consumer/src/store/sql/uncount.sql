-- One event of the aggregate less held; the state row of an aggregate the version gate does
-- not track goes when nothing of it is held any more.
-- $1 consumer, $2 aggregate type, $3 aggregate id
WITH counted AS (
    UPDATE {schema}.consumer_versions SET held = greatest(held - 1, 0), updated_at = now()
    WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
    RETURNING consumer, aggregate_type, aggregate_id, version, first_version, seeded, held
)
DELETE FROM {schema}.consumer_versions v
USING counted c
WHERE v.consumer = c.consumer AND v.aggregate_type = c.aggregate_type
  AND v.aggregate_id = c.aggregate_id
  AND c.held = 0 AND c.version IS NULL AND c.first_version IS NULL AND NOT c.seeded
