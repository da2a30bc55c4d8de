-- The statements of `PgOutbox`, rendered with the outbox's schema and table names.
-- name: enqueue
-- The events as one array per column, inserted in the given order; a NOTIFY on the channel
-- of $12 (none when NULL) wakes the relay at commit.
WITH inserted AS (
    INSERT INTO {schema}.{events} (
        event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
        schema_version, destination, payload, content_type, headers, occurred_at
    )
    SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version, e.event_type,
           e.schema_version, e.destination, e.payload, e.content_type, e.headers,
           COALESCE(e.occurred_at, clock_timestamp())
    FROM unnest(
        $1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[],
        $6::integer[], $7::text[], $8::bytea[], $9::text[], $10::jsonb[], $11::timestamptz[]
    ) WITH ORDINALITY AS e(
        event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
        schema_version, destination, payload, content_type, headers, occurred_at, ord
    )
    ORDER BY e.ord
    RETURNING 1
)
SELECT count(*) AS inserted,
       CASE WHEN $12::text IS NULL THEN NULL ELSE pg_notify($12, '') END AS notified
FROM inserted;
-- name: zero_growth
-- The same columns through the function of migration 0009: rows inserted and deleted again
-- while a live slot carries them, kept otherwise.
SELECT {schema}.{events_name}_enqueue_zero_growth($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11);
-- name: emit
-- One logical decoding message per array element, in order (unnest yields them in order),
-- none unless the outbox has a replication slot whose WAL is kept (not lost, nor about to
-- be): the zero-growth function checks the same. Counting the column keeps the volatile call
-- evaluated.
SELECT count(m) AS emitted FROM (
    SELECT pg_logical_emit_message(true, $1, c) AS m
    FROM unnest($2::bytea[]) AS c
    WHERE EXISTS (SELECT 1 FROM {schema}.cdc_slots s
                  JOIN pg_replication_slots r ON r.slot_name = s.slot
                  WHERE r.database = current_database()
                    AND r.wal_status IN ('reserved', 'extended'))
) AS e;
