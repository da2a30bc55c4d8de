-- The held event of an aggregate to look at next, in the version gate's order: a version at
-- or below the expected one ($4; its stale versions first, so they are cleared), then events
-- without a version in arrival order. With no expected version known ($4 NULL), the lowest.
-- `settled`: the aggregate's first hold is older than $5 seconds.
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 expected version, $5 settle seconds
SELECT id, message_id, event_id, event_type, version, destination, headers, payload,
       record_key, next_attempt_at > now() AS later, attempts, tries, last_error,
       (SELECT min(held_at) FROM {schema}.consumer_held
        WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND NOT dead)
           + make_interval(secs => $5) <= now() AS settled
FROM {schema}.consumer_held
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND NOT dead
  AND (version IS NULL OR $4::bigint IS NULL OR version <= $4)
ORDER BY version IS NULL, version, id
LIMIT 1
