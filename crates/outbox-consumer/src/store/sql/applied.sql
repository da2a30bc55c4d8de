-- A held event was applied: its row goes, and its inbox row (kept since it was held) says
-- when it was applied. Returns 1 when the row was there to delete.
-- $1 id
WITH gone AS (
    DELETE FROM {schema}.consumer_held WHERE id = $1 RETURNING consumer, message_id
), touched AS (
    UPDATE {schema}.inbox SET processed_at = now()
    FROM gone
    WHERE inbox.consumer = gone.consumer AND inbox.event_id = gone.message_id
)
SELECT count(*) FROM gone
