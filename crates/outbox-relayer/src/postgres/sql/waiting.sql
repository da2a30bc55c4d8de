-- name: release_stale
-- The safety net of waiting rows (see claim.sql), run with the backlog sample: a due hold
-- whose head is no longer pending moves to its aggregate's first pending row, or is deleted
-- when there is none, and the rows of an aggregate that has no hold are set free. Every path
-- that releases a hold also frees its rows; this repairs what a race with an operator's
-- action, a CDC relay or a hand-written statement left, within one `stats_interval`. A loose index scan over the `_waiting` index: one probe per waiting
-- aggregate, whatever its backlog. Returns the rows set free.
WITH RECURSIVE waiting AS (
    (SELECT aggregate_type, aggregate_id FROM {schema}.{events}
     WHERE status = 'pending' AND next_attempt_at IS NOT NULL
     ORDER BY aggregate_type, aggregate_id LIMIT 1)
    UNION ALL
    SELECT n.aggregate_type, n.aggregate_id
    FROM waiting w
    CROSS JOIN LATERAL (
        SELECT e.aggregate_type, e.aggregate_id FROM {schema}.{events} e
        WHERE e.status = 'pending' AND e.next_attempt_at IS NOT NULL
          AND (e.aggregate_type, e.aggregate_id) > (w.aggregate_type, w.aggregate_id)
        ORDER BY e.aggregate_type, e.aggregate_id LIMIT 1
    ) n
), stale AS (
    -- Due holds whose head is no longer pending, with the aggregate's first pending row.
    SELECT h.aggregate_type, h.aggregate_id, n.id, n.partition
    FROM {schema}.holds h
    LEFT JOIN LATERAL (
        SELECT e.id, e.partition FROM {schema}.{events} e
        WHERE e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id
          AND e.status = 'pending'
        ORDER BY e.id
        LIMIT 1
    ) n ON true
    WHERE h.held_until IS NOT NULL AND h.held_until <= now()
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.{events} e WHERE e.id = h.event_id AND e.status = 'pending'
      )
), moved AS (
    -- The aggregate still has events waiting in the table: the hold moves to the first.
    UPDATE {schema}.holds h
    SET event_id = s.id, partition = s.partition, held_until = now(), created_at = now()
    FROM stale s
    WHERE s.id IS NOT NULL
      AND h.aggregate_type = s.aggregate_type AND h.aggregate_id = s.aggregate_id
), dropped AS (
    DELETE FROM {schema}.holds h
    USING stale s
    WHERE s.id IS NULL
      AND h.aggregate_type = s.aggregate_type AND h.aggregate_id = s.aggregate_id
    RETURNING h.aggregate_type, h.aggregate_id
), free AS (
    SELECT w.aggregate_type, w.aggregate_id FROM waiting w
    WHERE NOT EXISTS (
        SELECT 1 FROM {schema}.holds h
        WHERE h.aggregate_type = w.aggregate_type AND h.aggregate_id = w.aggregate_id
    )
    UNION
    SELECT aggregate_type, aggregate_id FROM dropped
), freed AS (
    UPDATE {schema}.{events} e SET next_attempt_at = NULL
    FROM free f
    WHERE e.aggregate_type = f.aggregate_type AND e.aggregate_id = f.aggregate_id
      AND e.status = 'pending' AND e.next_attempt_at IS NOT NULL
    RETURNING e.id
)
SELECT count(*)::bigint FROM freed;
