-- A timeout step that failed (its row no longer decodes, the saga's code returned an error or
-- panicked, its writes failed): its instance is not left due (where it would fail first in every
-- round and hold back the timeouts behind it), but due again after a backoff that doubles with
-- each consecutive failure ($4 seconds, then 2 × $4, … at most $5), and the failure is recorded
-- as a step (`timeout_failed`, the error in `detail`) for `outbox sagas show`. Only an instance
-- still due and unfinished is deferred. Returns the consecutive failures before this one.
-- $1 saga type, $2 correlation id, $3 error, $4 first delay (s), $5 longest delay (s), $6 trigger
WITH failures AS (
    SELECT count(*) AS n FROM {schema}.saga_steps s
    WHERE s.saga_type = $1 AND s.correlation_id = $2 AND s.outcome = 'timeout_failed'
      AND s.id > coalesce((SELECT max(o.id) FROM {schema}.saga_steps o
                           WHERE o.saga_type = $1 AND o.correlation_id = $2
                             AND o.outcome <> 'timeout_failed'), 0)
), deferred AS (
    UPDATE {schema}.sagas
    SET deadline = now() + make_interval(
            secs => least($4::float8 * power(2, least((SELECT n FROM failures), 30)), $5::float8)),
        updated_at = now()
    WHERE saga_type = $1 AND correlation_id = $2 AND deadline <= now() AND NOT finished
    RETURNING state
)
INSERT INTO {schema}.saga_steps (saga_type, correlation_id, trigger, from_state, to_state,
                                 outcome, detail)
SELECT $1, $2, $6, state, state, 'timeout_failed', $3 FROM deferred
RETURNING (SELECT n FROM failures)
