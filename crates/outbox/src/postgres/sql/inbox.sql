-- The statements of `PgInbox`, rendered with the outbox's schema name.
-- name: record
INSERT INTO {schema}.inbox (consumer, event_id, event_type) VALUES ($1, $2, $3)
ON CONFLICT (consumer, event_id) DO NOTHING;
-- name: purge
-- At most $2 rows older than $1 seconds. Rows of events a consumer still holds stay: their
-- row is the held event's claim on its id (`consumer_held`, created by migration 16 with the
-- runners' tables).
DELETE FROM {schema}.inbox WHERE ctid = ANY (ARRAY(
    SELECT i.ctid FROM {schema}.inbox i
    WHERE i.processed_at < now() - make_interval(secs => $1)
      AND NOT EXISTS (SELECT 1 FROM {schema}.consumer_held h
                      WHERE h.consumer = i.consumer AND h.message_id = i.event_id)
    LIMIT $2));
