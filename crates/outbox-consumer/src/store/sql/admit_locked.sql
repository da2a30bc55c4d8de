-- Admits an event of an aggregate: records it in the consumer's inbox (`new` is
-- false when the inbox had it) and locks the aggregate's version state, which it returns.
-- No state row (`known` false): nothing of the aggregate applied or held yet. `xact` names the
-- transaction, for the checks after the handler (`advance.sql`, `still_open.sql`).
-- $1 consumer, $2 message id, $3 event type, $4 aggregate type, $5 aggregate id
WITH seen AS (
    INSERT INTO {schema}.inbox (consumer, event_id, event_type) VALUES ($1, $2, $3)
    ON CONFLICT (consumer, event_id) DO NOTHING
    RETURNING 1
), state AS (
    SELECT version, first_version, seeded, held
    FROM {schema}.consumer_versions
    WHERE consumer = $1 AND aggregate_type = $4 AND aggregate_id = $5
    FOR UPDATE
)
SELECT EXISTS (SELECT 1 FROM seen) AS new,
       EXISTS (SELECT 1 FROM state) AS known,
       (SELECT version FROM state) AS version,
       (SELECT first_version FROM state) AS first_version,
       coalesce((SELECT seeded FROM state), false) AS seeded,
       coalesce((SELECT held FROM state), 0) AS held,
       CASE WHEN EXISTS (SELECT 1 FROM seen) THEN pg_current_xact_id()::text END AS xact
