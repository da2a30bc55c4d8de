-- An operator declares versions up to $4 of an aggregate done (its state row is locked): the
-- gate expects $4 + 1 next, and versions up to $4 that arrive later are skipped as duplicates.
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version
UPDATE {schema}.consumer_versions
SET version = $4,
    first_version = CASE WHEN version IS NULL THEN $4 + 1 ELSE first_version END,
    seeded = true, updated_at = now()
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
