-- Marks acknowledged events published, fenced by lease epoch, and releases the holds whose head
-- event they were: the rows waiting behind them are set free (claimable again, in id order).
-- One statement per batch.
-- Every row is found by one primary-key probe per id (`target`) and updated by its tuple id,
-- whatever the planner thinks of the table: a queue table's statistics lag far behind it, and
-- its partial indexes keep the entries of published rows until vacuum, so a plan that scans a
-- pending index it believes small reads all of them (measured: 2,600 index entries per event
-- at 2,000 events/s). The id is checked with the tuple id (tuple ids repeat across the
-- partitions of a time-partitioned table).
-- $1 ids, $2/$3 (partition, epoch) pairs, $4 relay id
WITH fence AS (
    {fence}
), target AS (
    SELECT t.id, t.row
    FROM unnest($1::bigint[]) AS i(id)
    CROSS JOIN LATERAL (
        SELECT e.id, e.ctid AS row FROM {schema}.{events} e WHERE e.id = i.id LIMIT 1
    ) t
), done AS (
    UPDATE {schema}.{events} e
    SET status = 'published', published_at = now(), attempts = least(e.attempts, 2147483646) + 1,
        next_attempt_at = NULL
    FROM target
    WHERE e.ctid = target.row AND e.id = target.id AND e.status = 'pending'
      AND e.partition = ANY (ARRAY(SELECT partition FROM fence))
    RETURNING e.id, e.aggregate_type, e.aggregate_id
), released AS (
    DELETE FROM {schema}.holds h
    USING done
    WHERE h.aggregate_type = done.aggregate_type
      AND h.aggregate_id = done.aggregate_id
      AND h.event_id = done.id
    RETURNING h.aggregate_type, h.aggregate_id
), resumed AS (
    -- Driven by the released holds (usually none): the waiting rows of each, by their index.
    UPDATE {schema}.{events} e SET next_attempt_at = NULL
    FROM released r
    CROSS JOIN LATERAL (
        SELECT w.id, w.ctid AS row FROM {schema}.{events} w
        WHERE w.aggregate_type = r.aggregate_type AND w.aggregate_id = r.aggregate_id
          AND w.status = 'pending' AND w.next_attempt_at IS NOT NULL
    ) x
    WHERE e.ctid = x.row AND e.id = x.id
      AND e.status = 'pending' AND e.next_attempt_at IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM done d WHERE d.id = e.id)
)
SELECT count(*)::bigint FROM done
