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
FROM inserted
