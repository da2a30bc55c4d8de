-- A given-up event of an aggregate the gate has not started (nothing of it applied): the
-- aggregate starts no later than its version, so that it waits for the event's replay instead
-- of starting past it. Creates the state row when the event was given up before anything of
-- its aggregate was held or applied (a live delivery dead-lettered on its first attempt).
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version
INSERT INTO {schema}.consumer_versions AS v
    (consumer, aggregate_type, aggregate_id, version, first_version)
VALUES ($1, $2, $3, NULL, $4)
ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE
SET first_version = least(coalesce(v.first_version, $4), $4), updated_at = now()
WHERE v.version IS NULL
