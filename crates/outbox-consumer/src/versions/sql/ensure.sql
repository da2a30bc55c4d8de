-- Makes sure the aggregate has a state row to lock: a runner's first hold of it, not yet
-- committed, is waited for (and its row is then the one locked), so that the change below
-- never misses an event held meanwhile.
-- $1 consumer, $2 aggregate type, $3 aggregate id
INSERT INTO {schema}.consumer_versions (consumer, aggregate_type, aggregate_id, version)
VALUES ($1, $2, $3, NULL)
ON CONFLICT (consumer, aggregate_type, aggregate_id) DO NOTHING
