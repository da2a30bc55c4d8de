-- Marks acknowledged events published, fenced by lease epoch, and releases the holds whose head
-- event they were: the rows waiting behind them are set free (claimable again, in id order).
-- One statement per batch.
-- $1 ids, $2/$3 (partition, epoch) pairs, $4 relay id
WITH fence AS (
    {fence}
), done AS (
    UPDATE {schema}.{events} e
    SET status = 'published', published_at = now(), attempts = least(e.attempts, 2147483646) + 1,
        next_attempt_at = NULL
    FROM fence
    WHERE e.id = ANY($1::bigint[]) AND e.partition = fence.partition AND e.status = 'pending'
    RETURNING e.id, e.aggregate_type, e.aggregate_id
), released AS (
    DELETE FROM {schema}.holds h
    USING done
    WHERE h.aggregate_type = done.aggregate_type
      AND h.aggregate_id = done.aggregate_id
      AND h.event_id = done.id
    RETURNING h.aggregate_type, h.aggregate_id
), resumed AS (
    UPDATE {schema}.{events} e SET next_attempt_at = NULL
    FROM released r
    WHERE e.aggregate_type = r.aggregate_type AND e.aggregate_id = r.aggregate_id
      AND e.status = 'pending' AND e.next_attempt_at IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM done d WHERE d.id = e.id)
)
SELECT count(*)::bigint FROM done
