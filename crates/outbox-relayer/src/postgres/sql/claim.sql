-- Pending rows of the given partitions, in id order within each partition, skipping aggregates
-- that wait behind a hold (retry backoff, or a dead head: parked). Claims by state: a row that
-- commits late, with a smaller id than rows already published, is found all the same.
--
-- What a claim reads, whatever waits. A pending row is *waiting* when its `next_attempt_at`
-- is set: the failed head of a held aggregate until its retry, and the rows behind a hold
-- ('infinity'). The scan uses the `_claimable` index: pending rows that are not waiting. A row
-- it meets that must wait (`behind`: its aggregate's hold is on it or an earlier row, or an
-- earlier row of its aggregate waits) is not claimed and is set waiting (the `flagged` step,
-- under a share lock on the hold, so that a release that deletes the hold either comes first
-- or sees the flag; mark_failed.sql sets the rows already there waiting when it holds). Each
-- row behind a hold is met once, not by every claim: a claim costs O(batch), however long the
-- backlog of a parked or retrying aggregate.
-- The failed head is claimed through its hold once its retry is due (`due`), with the rows
-- behind it in id order; publishing the head releases the hold and sets the rest free
-- (mark_published.sql). A row is never claimed while an earlier row of its aggregate waits
-- (one probe of the `_waiting` index, usually empty): a waiting flag can delay a row, never
-- reorder it. A flag left without a hold (a release that raced another writer) is repaired by
-- waiting.sql within a `stats_interval`.
--
-- The partitions are visited in the order given (the relay rotates it) and the scan stops once
-- $2 rows are found. Payloads over $3 bytes are not loaded: `payload` is NULL and
-- `payload_size` tells the relay why.
-- Each partition's scan starts at its floor ($4): a hint, the lowest id the relay's previous
-- claim found pending there, so that a claim does not walk the index entries of rows already
-- published (they stay in the index until vacuum). The relay resets every floor to 0 at least
-- every `rescan_interval`, so a row that commits late below a floor is found by the next full
-- scan. Until then, a row below the floor holds back the later rows of its aggregate (G4): the
-- `_pending_aggregate` index answers that in one probe, for scans that have a floor. Floors
-- bound cost, never correctness or order. (Without that check, a transaction that commits late
-- below the floor let its aggregate's next event go first; the simulation found it.)
-- `occurred_at` is NULL when the relay cannot represent it (±infinity, or after the year 262142:
-- PostgreSQL goes to 294276): the row is dead-lettered with that reason instead of failing
-- the whole claim.
-- The batch is also cut to a byte budget ($5): rows are taken in claim order while the bytes
-- they cost the relay (`row_bytes`, see claim_columns.sql) stay within it, the first row always
-- (so that a row larger than the budget is still published, alone). `found` is how many rows
-- the scan met (rows set waiting included): more than returned means more work may wait.
-- What the per-row checks cost, and when they run. Each check above is one index probe per
-- row; most claims need none of them, and run them only where they can find something, with
-- the same result: the hold and waiting checks only when some hold or waiting row exists
-- (`guarded`, two probes per claim), the below-floor check only in a partition that has a
-- claimable row below its floor (`late`, one probe per partition scanned). A waiting row below
-- the floor is found by the waiting check, so `late` looks at claimable rows only.
-- $1 partitions, $2 batch size, $3 max payload bytes, $4 floors, $5 byte budget
WITH scanned AS MATERIALIZED (
    SELECT {claim_columns:$3}, p.ord,
           (g.guarded AND (EXISTS (
                SELECT 1 FROM {schema}.holds h
                WHERE h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
                  AND h.event_id <= e.id
            ) OR EXISTS (
                SELECT 1 FROM {schema}.{events} w
                WHERE w.aggregate_type = e.aggregate_type
                  AND w.aggregate_id = e.aggregate_id
                  AND w.status = 'pending' AND w.next_attempt_at IS NOT NULL
                  AND w.id < e.id
            ))) AS behind
    FROM (
        SELECT EXISTS (SELECT 1 FROM {schema}.holds)
            OR EXISTS (SELECT 1 FROM {schema}.{events} w
                       WHERE w.status = 'pending' AND w.next_attempt_at IS NOT NULL)
            AS guarded
    ) g
    CROSS JOIN unnest($1::integer[], $4::bigint[]) WITH ORDINALITY AS p(partition, floor, ord)
    CROSS JOIN LATERAL (
        SELECT p.floor > 0 AND EXISTS (
            SELECT 1 FROM {schema}.{events} l
            WHERE l.partition >= p.partition AND l.partition <= p.partition
              AND l.id < p.floor AND l.status = 'pending' AND l.next_attempt_at IS NULL
        ) AS late
    ) f
    CROSS JOIN LATERAL (
        SELECT * FROM {schema}.{events} e
        -- A range on partition instead of `=`, with ORDER BY (partition, id): only the
        -- claimable index (partition, id) can serve it, whatever the statistics say. With `=`,
        -- PostgreSQL's generic plan may walk the primary key in id order and filter.
        WHERE e.partition >= p.partition AND e.partition <= p.partition
          AND e.id >= p.floor
          AND e.status = 'pending' AND e.next_attempt_at IS NULL
          AND (NOT f.late OR NOT EXISTS (
              SELECT 1 FROM {schema}.{events} b
              WHERE b.aggregate_type = e.aggregate_type
                AND b.aggregate_id = e.aggregate_id
                AND b.status = 'pending'
                AND b.id < p.floor
          ))
        ORDER BY e.partition, e.id
        LIMIT $2
    ) e
    LIMIT $2
), due AS (
    -- Heads whose retry is due, claimed through their hold with the pending rows after them
    -- (waiting or not), in id order: the lane publishes them one after another and stops at
    -- the first failure. Never before an earlier pending row of their aggregate.
    SELECT {claim_columns:$3}, p.ord, false AS behind
    FROM unnest($1::integer[]) WITH ORDINALITY AS p(partition, ord)
    JOIN {schema}.holds h ON h.partition = p.partition AND h.held_until <= now()
    JOIN {schema}.{events} hd
      ON hd.id = h.event_id AND hd.partition = p.partition AND hd.status = 'pending'
    CROSS JOIN LATERAL (
        SELECT * FROM {schema}.{events} e
        WHERE e.aggregate_type = hd.aggregate_type AND e.aggregate_id = hd.aggregate_id
          AND e.status = 'pending' AND e.id >= hd.id
        ORDER BY e.id
        LIMIT $2
    ) e
    WHERE NOT EXISTS (
        SELECT 1 FROM {schema}.{events} b
        WHERE b.aggregate_type = hd.aggregate_type
          AND b.aggregate_id = hd.aggregate_id
          AND b.status = 'pending'
          AND b.id < hd.id
    )
    LIMIT $2
), flagged AS (
    UPDATE {schema}.{events} e SET next_attempt_at = 'infinity'
    FROM scanned s
    WHERE s.behind AND e.id = s.id AND e.status = 'pending' AND e.next_attempt_at IS NULL
      AND EXISTS (
          SELECT 1 FROM {schema}.holds h
          WHERE h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
          FOR SHARE
      )
), claimed AS (
    SELECT * FROM scanned WHERE NOT behind
    UNION ALL
    SELECT * FROM due
)
SELECT * FROM (
    SELECT c.*, sum(c.row_bytes) OVER (ORDER BY c.ord, c.id) AS running,
           (SELECT count(*) FROM scanned) + (SELECT count(*) FROM due) AS found
    FROM claimed c
) y
WHERE y.running - y.row_bytes < $5
ORDER BY y.ord, y.id
