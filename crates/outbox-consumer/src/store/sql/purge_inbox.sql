-- Inbox retention for one consumer: up to $3 rows applied more than $2 seconds ago. Rows of
-- events still held stay (their row is the held event's claim on its id).
-- $1 consumer, $2 retention seconds, $3 batch
DELETE FROM {schema}.inbox WHERE ctid = ANY (ARRAY(
    SELECT i.ctid FROM {schema}.inbox i
    WHERE i.consumer = $1 AND i.processed_at < now() - make_interval(secs => $2)
      AND NOT EXISTS (SELECT 1 FROM {schema}.consumer_held h
                      WHERE h.consumer = i.consumer AND h.message_id = i.event_id
                        AND NOT h.dead)
    LIMIT $3))
