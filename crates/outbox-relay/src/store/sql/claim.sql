-- Pending rows of the given partitions, in id order within each partition, skipping aggregates
-- whose head is held (retry backoff) or parked (dead head). Claims by state: a row that commits
-- late, with a smaller id than rows already published, is found all the same.
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
-- the scan found before the cut: more than returned means more work is waiting.
-- $1 partitions, $2 batch size, $3 max payload bytes, $4 floors, $5 byte budget
SELECT * FROM (
    SELECT x.*, sum(x.row_bytes) OVER (ORDER BY x.ord, x.id) AS running,
           count(*) OVER () AS found
    FROM (
SELECT {claim_columns:$3}, p.ord
FROM unnest($1::integer[], $4::bigint[]) WITH ORDINALITY AS p(partition, floor, ord)
CROSS JOIN LATERAL (
    SELECT * FROM {schema}.{events} e
    -- A range on partition instead of `=`, with ORDER BY (partition, id): only the pending
    -- index (partition, id) can serve it, whatever the statistics say. With `=`, PostgreSQL's
    -- generic plan may walk the primary key in id order and filter (27-75 entries per event).
    WHERE e.partition >= p.partition AND e.partition <= p.partition
      AND e.id >= p.floor
      AND e.status = 'pending'
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.holds h
          WHERE h.aggregate_type = e.aggregate_type
            AND h.aggregate_id = e.aggregate_id
            AND (h.held_until IS NULL OR h.held_until > now())
      )
      AND (p.floor = 0 OR NOT EXISTS (
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
    ) x
) y
WHERE y.running - y.row_bytes < $5
ORDER BY y.ord, y.id
