-- Records failed attempts, fenced by lease epoch: increments attempts, stores the error, and
-- either schedules a retry (the aggregate is held until then) or dead-letters the event (the
-- aggregate is parked when $8 is true; otherwise its hold moves to the aggregate's next
-- pending row, due at once, or goes when there is none: a hold is the record that an
-- aggregate has events waiting in the table, which the CDC source resumes from). The failed event waits
-- until its retry (`next_attempt_at`); the other pending rows of a held or parked aggregate are
-- set waiting behind it ('infinity', see claim.sql), and set free again when the hold is
-- released (mark_published.sql, or here when a dead head does not park).
-- An aggregate parked on another dead event stays parked on it: only a row that
-- committed late, below rows already claimed, can fail there. Its hold is not moved to that
-- row nor dropped, or the rows after the dead one would flow once that row is published; the
-- row waits for the park to end (a replay or skip of the dead one moves the hold to it).
-- Permanent failures are also counted in `permanent_failures` (what `retry.max_attempts`
-- counts); transient ones only in `attempts`.
-- $1 ids, $2/$3 (partition, epoch) pairs, $4 relay id, $5 errors, $6 backoff seconds,
-- $7 dead flags, $8 park on dead, $9 permanent flags
WITH fence AS (
    {fence}
), failure AS (
    -- One primary-key probe per id; the update goes by tuple id (see mark_published.sql).
    SELECT f.*, t.row
    FROM unnest($1::bigint[], $5::text[], $6::double precision[], $7::boolean[],
                $9::boolean[])
        AS f(id, error, backoff, dead, permanent)
    CROSS JOIN LATERAL (
        SELECT e.ctid AS row FROM {schema}.{events} e WHERE e.id = f.id LIMIT 1
    ) t
), done AS (
    UPDATE {schema}.{events} e
    -- Saturating: a writer may have stored any integer there (the column is the relay's, but
    -- writable), and an overflow would make every record of the batch fail.
    SET attempts = least(e.attempts, 2147483646) + 1,
        permanent_failures = least(e.permanent_failures, 2147483646) + failure.permanent::integer,
        last_error = failure.error,
        status = CASE WHEN failure.dead THEN 'dead' ELSE 'pending' END,
        next_attempt_at = CASE WHEN failure.dead THEN NULL
                               ELSE now() + make_interval(secs => failure.backoff) END
    FROM failure
    WHERE e.ctid = failure.row AND e.id = failure.id AND e.status = 'pending'
      AND e.partition = ANY (ARRAY(SELECT partition FROM fence))
    RETURNING e.id, e.aggregate_type, e.aggregate_id, e.partition, e.status, e.next_attempt_at
), next_head AS (
    -- A dead head that does not park: the next pending row of its aggregate.
    SELECT DISTINCT ON (d.aggregate_type, d.aggregate_id)
           d.aggregate_type, d.aggregate_id, n.id, n.partition
    FROM done d
    CROSS JOIN LATERAL (
        SELECT e.id, e.partition FROM {schema}.{events} e
        WHERE e.aggregate_type = d.aggregate_type AND e.aggregate_id = d.aggregate_id
          AND e.status = 'pending' AND NOT EXISTS (SELECT 1 FROM done x WHERE x.id = e.id)
        ORDER BY e.id
        LIMIT 1
    ) n
    WHERE NOT $8::boolean AND d.status = 'dead'
      AND NOT EXISTS (
          SELECT 1 FROM done p
          WHERE p.aggregate_type = d.aggregate_type AND p.aggregate_id = d.aggregate_id
            AND p.status = 'pending'
      )
    ORDER BY d.aggregate_type, d.aggregate_id, n.id
), held AS (
    INSERT INTO {schema}.holds (aggregate_type, aggregate_id, partition, event_id, held_until)
    SELECT aggregate_type, aggregate_id, partition, id, next_attempt_at
    FROM done
    WHERE status = 'pending' OR $8::boolean
    UNION ALL
    SELECT aggregate_type, aggregate_id, partition, id, now() FROM next_head
    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE
        SET event_id = EXCLUDED.event_id, partition = EXCLUDED.partition,
            held_until = EXCLUDED.held_until, created_at = now()
        -- A park on another dead event stays (see above).
        WHERE NOT (holds.held_until IS NULL AND holds.event_id <> EXCLUDED.event_id
                   AND EXISTS (SELECT 1 FROM {schema}.{events} d
                               WHERE d.id = holds.event_id AND d.status = 'dead'))
), unheld AS (
    DELETE FROM {schema}.holds h
    USING done
    WHERE NOT $8::boolean AND done.status = 'dead'
      AND h.aggregate_type = done.aggregate_type AND h.aggregate_id = done.aggregate_id
      AND NOT (h.held_until IS NULL AND h.event_id <> done.id
               AND EXISTS (SELECT 1 FROM {schema}.{events} d
                           WHERE d.id = h.event_id AND d.status = 'dead'))
      AND NOT EXISTS (
          SELECT 1 FROM next_head n
          WHERE n.aggregate_type = done.aggregate_type AND n.aggregate_id = done.aggregate_id
      )
    RETURNING h.aggregate_type, h.aggregate_id
), behind AS (
    -- The rest of a held or parked aggregate waits behind its head: driven by the failed
    -- rows, each aggregate's later pending rows found by its index.
    UPDATE {schema}.{events} e SET next_attempt_at = 'infinity'
    FROM done
    CROSS JOIN LATERAL (
        SELECT b.id, b.ctid AS row FROM {schema}.{events} b
        WHERE b.aggregate_type = done.aggregate_type AND b.aggregate_id = done.aggregate_id
          AND b.status = 'pending' AND b.id > done.id
    ) x
    WHERE (done.status = 'pending' OR $8::boolean)
      AND e.ctid = x.row AND e.id = x.id
      AND e.status = 'pending' AND e.next_attempt_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM done d WHERE d.id = e.id)
), resumed AS (
    UPDATE {schema}.{events} e SET next_attempt_at = NULL
    FROM unheld r
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
