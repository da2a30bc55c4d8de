-- Admits an event without an aggregate: records it in the consumer's inbox (`new` is false
-- when the inbox had it). Nothing orders it, so nothing holds it back. `xact` names the
-- transaction of a new event, for the checks after the handler (`still_open.sql`): a
-- duplicate is rolled back, and needs no transaction id.
-- $1 consumer, $2 message id, $3 event type
WITH seen AS (
    INSERT INTO {schema}.inbox (consumer, event_id, event_type) VALUES ($1, $2, $3)
    ON CONFLICT (consumer, event_id) DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM seen) AS new, 0 AS held,
       CASE WHEN EXISTS (SELECT 1 FROM seen) THEN pg_current_xact_id()::text END AS xact
