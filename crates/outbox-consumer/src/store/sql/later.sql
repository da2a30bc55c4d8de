-- A held event is tried again $2 seconds from now, for `reason` (its dead letter could not be
-- stored yet).
-- $1 id, $2 seconds, $3 reason
UPDATE {schema}.consumer_held
SET next_attempt_at = now() + make_interval(secs => $2), reason = $3
WHERE id = $1
