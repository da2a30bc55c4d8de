-- A try of a held event that did not happen after all (another runner had it, its turn had
-- passed) or met an outage (the database or the handler's dependency down): not counted as
-- started, and, after an outage, put off $2 seconds so that sweeps do not spin on it.
-- $1 id, $2 seconds (NULL: due as it was)
UPDATE {schema}.consumer_held
SET tries = greatest(tries - 1, 0),
    next_attempt_at = coalesce(now() + make_interval(secs => $2), next_attempt_at)
WHERE id = $1
