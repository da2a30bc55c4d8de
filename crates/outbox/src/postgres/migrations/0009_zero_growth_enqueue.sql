-- Zero-growth writes (`WriteMode::ZeroGrowth`) in one round trip: the events are inserted (the
-- WAL carries them to the CDC relay, and the unique `event_id` and `aggregate_version` checks
-- run) and deleted again, in the caller's transaction, when the outbox has a live replication
-- slot (recorded by `outbox migrate --cdc`, its WAL kept: not lost, nor about to be); without
-- one they stay as ordinary pending rows, for a poll relay or the slot's catch-up. Returns how
-- many were deleted. (A statement cannot delete the rows its own insert adds; a function's
-- second statement sees them. PL/pgSQL, so that both plans are cached per session.)
CREATE FUNCTION {schema}.{events_name}_enqueue_zero_growth(
    p_event_ids uuid[], p_aggregate_types text[], p_aggregate_ids text[],
    p_aggregate_versions bigint[], p_event_types text[], p_schema_versions integer[],
    p_destinations text[], p_payloads bytea[], p_content_types text[], p_headers jsonb[],
    p_occurred timestamptz[]
) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    deleted bigint;
BEGIN
    INSERT INTO {schema}.{events} (
        event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
        schema_version, destination, payload, content_type, headers, occurred_at
    )
    SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version, e.event_type,
           e.schema_version, e.destination, e.payload, e.content_type, e.headers,
           COALESCE(e.occurred_at, clock_timestamp())
    FROM unnest(
        p_event_ids, p_aggregate_types, p_aggregate_ids, p_aggregate_versions, p_event_types,
        p_schema_versions, p_destinations, p_payloads, p_content_types, p_headers, p_occurred
    ) WITH ORDINALITY AS e(
        event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
        schema_version, destination, payload, content_type, headers, occurred_at, ord
    )
    ORDER BY e.ord;
    DELETE FROM {schema}.{events} d
    WHERE d.event_id = ANY(p_event_ids)
      AND EXISTS (
          SELECT 1 FROM {schema}.cdc_slots c
          JOIN pg_replication_slots s ON s.slot_name = c.slot
          WHERE s.database = current_database() AND s.wal_status IN ('reserved', 'extended')
      );
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$fn$;
