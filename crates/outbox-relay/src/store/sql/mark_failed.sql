-- Records failed attempts, fenced by lease epoch: increments attempts, stores the error, and
-- either schedules a retry (the aggregate is held until then) or dead-letters the event (the
-- aggregate is parked when $9 is true, otherwise its hold is released).
-- Permanent failures are also counted in `permanent_failures` (what `retry.max_attempts`
-- counts); transient ones only in `attempts`.
-- $1 ids, $2/$3 (partition, epoch) pairs, $4 relay id, $5 errors, $6 backoff seconds,
-- $7 dead flags, $8 park on dead, $9 permanent flags
WITH fence AS (
    {fence}
), failure AS (
    SELECT * FROM unnest($1::bigint[], $5::text[], $6::double precision[], $7::boolean[],
                         $9::boolean[])
        AS f(id, error, backoff, dead, permanent)
), done AS (
    UPDATE {schema}.{events} e
    SET attempts = e.attempts + 1,
        permanent_failures = e.permanent_failures + failure.permanent::integer,
        last_error = failure.error,
        status = CASE WHEN failure.dead THEN 'dead' ELSE 'pending' END,
        next_attempt_at = CASE WHEN failure.dead THEN NULL
                               ELSE now() + make_interval(secs => failure.backoff) END
    FROM failure, fence
    WHERE e.id = failure.id AND e.partition = fence.partition AND e.status = 'pending'
    RETURNING e.id, e.aggregate_type, e.aggregate_id, e.partition, e.status, e.next_attempt_at
), held AS (
    INSERT INTO {schema}.holds (aggregate_type, aggregate_id, partition, event_id, held_until)
    SELECT aggregate_type, aggregate_id, partition, id, next_attempt_at
    FROM done
    WHERE status = 'pending' OR $8::boolean
    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE
        SET event_id = EXCLUDED.event_id, partition = EXCLUDED.partition,
            held_until = EXCLUDED.held_until, created_at = now()
), unheld AS (
    DELETE FROM {schema}.holds h
    USING done
    WHERE NOT $8::boolean AND done.status = 'dead'
      AND h.aggregate_type = done.aggregate_type AND h.aggregate_id = done.aggregate_id
)
SELECT count(*)::bigint FROM done
