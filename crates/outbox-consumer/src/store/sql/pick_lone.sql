-- A held event without an aggregate, due now, locked for this transaction (skipped when
-- another runner has it).
-- $1 consumer, $2 id
SELECT id, message_id, event_id, event_type, version, destination, headers, payload,
       record_key, false AS later, attempts, tries, last_error, true AS settled
FROM {schema}.consumer_held
WHERE consumer = $1 AND id = $2 AND next_attempt_at <= now() AND NOT dead
FOR UPDATE SKIP LOCKED
