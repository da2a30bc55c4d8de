-- The aggregate's waiting held events are made due (a statement of its own, after the version
-- changed: it sees every event held before the lock was taken), so that a runner applies
-- those whose turn has come.
-- $1 consumer, $2 aggregate type, $3 aggregate id
UPDATE {schema}.consumer_held SET next_attempt_at = now()
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
  AND next_attempt_at IS NULL AND NOT dead
