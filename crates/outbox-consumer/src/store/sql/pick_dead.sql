-- Claims a given-up event whose dead letter is due to be stored: no other sweep takes it for
-- the next $3 seconds (while this one stores it). Its reason comes as `last_error`.
-- $1 consumer, $2 id, $3 seconds
UPDATE {schema}.consumer_held
SET next_attempt_at = now() + make_interval(secs => $3)
WHERE consumer = $1 AND id = $2 AND dead AND next_attempt_at <= now()
RETURNING id, message_id, event_id, event_type, version, destination, headers, payload,
          record_key, false AS later, attempts, tries, reason AS last_error, true AS settled
