-- One more try of a held event starts (committed before it runs: a try the process never
-- finishes still counts), and the event is due from now on: if this runner stops before the
-- try ends, a sweep finds it.
-- $1 id
UPDATE {schema}.consumer_held
SET tries = tries + 1, next_attempt_at = coalesce(next_attempt_at, now())
WHERE id = $1
