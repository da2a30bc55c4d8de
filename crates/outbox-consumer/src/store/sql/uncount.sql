-- One event of the aggregate less held.
-- $1 consumer, $2 aggregate type, $3 aggregate id
UPDATE {schema}.consumer_versions SET held = greatest(held - 1, 0), updated_at = now()
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
