-- A first-seen aggregate settling: its held events that are due wait until its settle time
-- ends ($4 seconds after its first hold), instead of being looked at by every sweep.
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 settle seconds
UPDATE {schema}.consumer_held
SET next_attempt_at = (SELECT min(held_at) FROM {schema}.consumer_held
                       WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
                         AND NOT dead) + make_interval(secs => $4)
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND NOT dead
  AND next_attempt_at <= now()
