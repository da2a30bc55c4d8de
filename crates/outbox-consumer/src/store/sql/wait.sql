-- The aggregate's held events wait for an earlier event to be applied: none is due until
-- then (the arrival of that event, or an operator's skip, makes them due again), and each
-- says what it waits for (rows that say so already are left as they are).
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 reason
UPDATE {schema}.consumer_held SET next_attempt_at = NULL, reason = $4
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
  AND NOT dead AND (next_attempt_at IS NOT NULL OR reason <> $4)
