-- Records version $4 as the aggregate's last applied (its state row is locked), and as its
-- first when it had none.
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version
UPDATE {schema}.consumer_versions
SET version = $4, first_version = coalesce(first_version, $4), updated_at = now()
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
