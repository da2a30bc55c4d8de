-- name: list
-- Instances, most recently changed first, with the count of unexpected or orphaned events
-- recorded for each. $1 type, $2 state, $3 only open, $4 only overdue, $5 only with problems,
-- $6 limit
SELECT * FROM (
    SELECT saga_type, correlation_id, state, version, finished, deadline, created_at,
           updated_at,
           (SELECT count(*) FROM {schema}.saga_steps p
            WHERE p.saga_type = s.saga_type AND p.correlation_id = s.correlation_id
              AND p.outcome IN ('unexpected', 'orphan')) AS problems
    FROM {schema}.sagas s
    WHERE ($1::text IS NULL OR saga_type = $1)
      AND ($2::text IS NULL OR state = $2)
      AND (NOT $3 OR NOT finished)
      AND (NOT $4 OR deadline <= now())
) i
WHERE NOT $5 OR problems > 0
ORDER BY updated_at DESC
LIMIT $6;
-- name: find
-- One instance and its data. $1 type, $2 correlation id
SELECT saga_type, correlation_id, state, version, finished, deadline, created_at, updated_at,
       (SELECT count(*) FROM {schema}.saga_steps p
        WHERE p.saga_type = s.saga_type AND p.correlation_id = s.correlation_id
          AND p.outcome IN ('unexpected', 'orphan')) AS problems,
       data
FROM {schema}.sagas s
WHERE saga_type = $1 AND correlation_id = $2;
-- name: steps
-- Every step recorded for an instance (or for its correlation id, with no instance), in order.
-- $1 type, $2 correlation id
SELECT at, trigger, event_id, from_state, to_state, outcome, emitted, detail
FROM {schema}.saga_steps
WHERE saga_type = $1 AND correlation_id = $2
ORDER BY id;
-- name: counts
-- Instances per type and state, with how many are overdue. $1 type
SELECT saga_type, state, count(*) AS instances,
       count(*) FILTER (WHERE deadline <= now()) AS overdue
FROM {schema}.sagas
WHERE $1::text IS NULL OR saga_type = $1
GROUP BY saga_type, state
ORDER BY saga_type, state;
-- name: purge_finished
-- Finished instances not changed for $1 seconds, with their steps, $2 at a time (open
-- instances are never deleted). Returns (instances, steps) deleted.
WITH gone AS (
    DELETE FROM {schema}.sagas WHERE (saga_type, correlation_id) IN (
        SELECT saga_type, correlation_id FROM {schema}.sagas
        WHERE finished AND updated_at < now() - make_interval(secs => $1)
        LIMIT $2 FOR UPDATE SKIP LOCKED)
    RETURNING saga_type, correlation_id
), steps AS (
    DELETE FROM {schema}.saga_steps s USING gone g
    WHERE s.saga_type = g.saga_type AND s.correlation_id = g.correlation_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM steps);
-- name: purge_strays
-- Steps recorded for no instance (orphaned, uncorrelated) older than $1 seconds, $2 at a time.
DELETE FROM {schema}.saga_steps WHERE id IN (
    SELECT id FROM {schema}.saga_steps s
    WHERE at < now() - make_interval(secs => $1)
      AND NOT EXISTS (SELECT 1 FROM {schema}.sagas i
                      WHERE i.saga_type = s.saga_type AND i.correlation_id = s.correlation_id)
    LIMIT $2
);
