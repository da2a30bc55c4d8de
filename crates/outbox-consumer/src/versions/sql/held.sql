-- A consumer's held events, the oldest first; given-up ones (dead letter not stored yet) too.
-- $1 consumer, $2 aggregate type (NULL: any), $3 aggregate id (NULL: any), $4 limit
SELECT id, message_id, event_id, event_type, aggregate_type, aggregate_id, version,
       destination, held_at, extract(epoch FROM now() - held_at)::float8 AS held_seconds,
       next_attempt_at, attempts, tries, last_error, reason, dead
FROM {schema}.consumer_held
WHERE consumer = $1
  AND ($2::text IS NULL OR aggregate_type = $2)
  AND ($3::text IS NULL OR aggregate_id = $3)
ORDER BY held_at, id
LIMIT $4
