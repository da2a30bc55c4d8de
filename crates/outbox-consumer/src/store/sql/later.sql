-- A given-up event whose dead letter could not be stored: tried again $2 seconds from now,
-- with what failed (its reason, the dead letter's, stays as it is).
-- $1 id, $2 seconds, $3 error
UPDATE {schema}.consumer_held
SET next_attempt_at = now() + make_interval(secs => $2), last_error = $3
WHERE id = $1
