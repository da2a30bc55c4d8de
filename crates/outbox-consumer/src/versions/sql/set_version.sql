-- An operator declares versions up to $4 of an aggregate done: the gate expects $4 + 1 next,
-- and versions up to $4 that arrive later are skipped as duplicates. Its held events are made
-- due, so that a runner applies those whose turn has come.
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version
WITH state AS (
    INSERT INTO {schema}.consumer_versions
        (consumer, aggregate_type, aggregate_id, version, first_version, seeded)
    VALUES ($1, $2, $3, $4, $4 + 1, true)
    ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE
        SET version = $4,
            first_version = CASE WHEN consumer_versions.version IS NULL
                                 THEN $4 + 1 ELSE consumer_versions.first_version END,
            seeded = true, updated_at = now()
    RETURNING 1
)
UPDATE {schema}.consumer_held SET next_attempt_at = now()
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
  AND next_attempt_at IS NULL AND NOT dead
