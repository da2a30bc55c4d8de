-- Locks an aggregate's version state (the runners' applications and holds wait).
-- $1 consumer, $2 aggregate type, $3 aggregate id
SELECT version, first_version, seeded, held
FROM {schema}.consumer_versions
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
FOR UPDATE
