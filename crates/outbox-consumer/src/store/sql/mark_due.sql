-- Makes a waiting held event due now (the next one of its aggregate, once the one before it
-- is applied), so that a runner that stops between the two still finds it.
-- $1 id
UPDATE {schema}.consumer_held SET next_attempt_at = now()
WHERE id = $1 AND next_attempt_at IS NULL
