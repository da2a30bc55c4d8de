-- The aggregate's first version applied, when it had no state row. A row inserted meanwhile
-- by a concurrent transaction inserts nothing: the caller tries the event again.
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version
INSERT INTO {schema}.consumer_versions (consumer, aggregate_type, aggregate_id, version, first_version)
VALUES ($1, $2, $3, $4, $4)
ON CONFLICT (consumer, aggregate_type, aggregate_id) DO NOTHING
