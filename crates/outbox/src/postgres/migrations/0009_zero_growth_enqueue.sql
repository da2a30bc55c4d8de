-- Zero-growth writes (`WriteMode::ZeroGrowth`) in one round trip: the events are inserted (the
-- WAL carries them to the CDC relay, and the unique `event_id` and `aggregate_version` checks
-- run) and deleted again, in the caller's transaction, when the outbox has a live replication
-- slot (recorded by `outbox migrate --cdc`, its WAL kept: not lost, nor about to be); without
-- one they stay as ordinary pending rows, for a poll relay or the slot's catch-up. Returns how
-- many were deleted. (A statement cannot delete the rows its own insert adds; a function's
-- second statement sees them.)
CREATE FUNCTION {schema}.{events_name}_enqueue_zero_growth(
    event_ids uuid[], aggregate_types text[], aggregate_ids text[], aggregate_versions bigint[],
    event_types text[], schema_versions integer[], destinations text[], payloads bytea[],
    content_types text[], headers jsonb[], occurred timestamptz[]
) RETURNS bigint LANGUAGE sql VOLATILE AS $fn$
    INSERT INTO {schema}.{events} (
        event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
        schema_version, destination, payload, content_type, headers, occurred_at
    )
    SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version, e.event_type,
           e.schema_version, e.destination, e.payload, e.content_type, e.headers,
           COALESCE(e.occurred_at, clock_timestamp())
    FROM unnest(
        event_ids, aggregate_types, aggregate_ids, aggregate_versions, event_types,
        schema_versions, destinations, payloads, content_types, headers, occurred
    ) WITH ORDINALITY AS e(
        event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
        schema_version, destination, payload, content_type, headers, occurred_at, ord
    )
    ORDER BY e.ord;
    WITH deleted AS (
        DELETE FROM {schema}.{events}
        WHERE event_id = ANY(event_ids)
          AND EXISTS (
              SELECT 1 FROM {schema}.cdc_slots c
              JOIN pg_replication_slots s ON s.slot_name = c.slot
              WHERE s.database = current_database() AND s.wal_status IN ('reserved', 'extended')
          )
        RETURNING 1
    )
    SELECT count(*) FROM deleted;
$fn$;
