-- Holds a message: stored whole, with when it may be tried ($12 seconds from now; NULL: once
-- an earlier event of its aggregate is applied) and why. A message held already stays as it
-- is (nothing returned).
-- $1 consumer, $2 message id, $3 event id, $4 event type, $5 aggregate type, $6 aggregate id,
-- $7 version, $8 destination, $9 headers, $10 payload, $11 record key, $12 due in seconds,
-- $13 attempts, $14 last error, $15 reason
INSERT INTO {schema}.consumer_held (
    consumer, message_id, event_id, event_type, aggregate_type, aggregate_id, version,
    destination, headers, payload, record_key, next_attempt_at, attempts, last_error, reason
)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
        now() + make_interval(secs => $12), $13, $14, $15)
ON CONFLICT (consumer, message_id) WHERE NOT dead DO NOTHING
RETURNING id
