-- Marks acknowledged events published, fenced by lease epoch. The one statement both sources
-- record a publish with (one per batch); `$5` says which (`store::Marking`):
-- * true, a claimed batch (polling): releases the holds whose head event they were, and the
--   rows waiting behind them are set free (claimable again, in id order); returns the ids
--   marked.
-- * false, streamed events (CDC): the holds stay (the CDC table path gives an aggregate back to
--   the stream once nothing of it is pending: the stream reads no table, so a hold released at
--   its head would strand the rows behind it); returns the ids marked and the ids no longer
--   pending (a transaction streamed again after a restart was marked before). An id not
--   returned is not visible yet (its commit reached the stream first) or the lease is gone.
-- Every row is found by one primary-key probe per id (`target`) and updated by its tuple id,
-- whatever the planner thinks of the table: a queue table's statistics lag far behind it, and
-- its partial indexes keep the entries of published rows until vacuum, so a plan that scans a
-- pending index it believes small reads all of them (measured: 2,600 index entries per event
-- at 2,000 events/s). The id is checked with the tuple id (tuple ids repeat across the
-- partitions of a time-partitioned table).
-- $1 ids, $2/$3 (partition, epoch) pairs, $4 relay id, $5 claimed (true) or streamed (false)
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
    WHERE $5::boolean
      AND h.aggregate_type = done.aggregate_type
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
SELECT id FROM done
UNION ALL
-- Streamed only: the statement's snapshot, where rows `done` marks still read as pending. One
-- primary-key probe per id, whatever the statistics say: the LIMIT keeps the planner from
-- turning the lookup into a join, which on a young, never-analysed table it makes a
-- sequential scan, cached.
SELECT m.id
FROM unnest($1::bigint[]) AS m(id)
CROSS JOIN LATERAL (
    SELECT 1 FROM {schema}.{events} e
    WHERE NOT $5::boolean AND e.id = m.id AND e.status <> 'pending' LIMIT 1
) AS settled
