-- The held event of an aggregate to look at next, in arrival order (no version gate).
-- $1 consumer, $2 aggregate type, $3 aggregate id
SELECT id, message_id, event_id, event_type, version, destination, headers, payload,
       record_key, next_attempt_at > now() AS later, attempts, tries, last_error, true AS settled
FROM {schema}.consumer_held
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND NOT dead
ORDER BY id
LIMIT 1
