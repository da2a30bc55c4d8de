-- What a consumer holds: events, the age of the oldest (by the database's clock), how many
-- wait for an earlier event rather than for a retry, and how many given-up events still wait
-- for their dead letter to be stored.
-- $1 consumer
SELECT count(*) FILTER (WHERE NOT dead) AS held,
       coalesce(extract(epoch FROM now() - min(held_at) FILTER (WHERE NOT dead)), 0)::float8
           AS oldest_seconds,
       count(*) FILTER (WHERE next_attempt_at IS NULL AND NOT dead) AS waiting,
       count(*) FILTER (WHERE dead) AS dead
FROM {schema}.consumer_held
WHERE consumer = $1
