-- A try of a held event failed: counted, its error kept, tried again $3 seconds from now.
-- $1 id, $2 error, $3 backoff seconds, $4 reason
UPDATE {schema}.consumer_held
SET attempts = attempts + 1, last_error = $2,
    next_attempt_at = now() + make_interval(secs => $3), reason = $4
WHERE id = $1
RETURNING attempts
