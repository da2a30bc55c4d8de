-- One more event of the aggregate held (its state row is locked).
-- $1 consumer, $2 aggregate type, $3 aggregate id
UPDATE {schema}.consumer_versions SET held = held + 1, updated_at = now()
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
