-- name: backlog
-- `oldest` is the arrival (`enqueued_at`, set by the database) of the oldest pending row: lag
-- is how long an event has waited, by the database's clock, whatever the writer put in
-- `occurred_at`. NULL when nothing is pending (the gauge then reads 0), else clamped to what
-- the relay can represent, should a writer set the column against the contract. The clamp is
-- applied only to a minimum that exists: GREATEST ignores NULL, and would turn "nothing
-- pending" into 4714 BC.
SELECT count(*)::bigint AS pending,
       CASE WHEN min(enqueued_at) IS NOT NULL
            THEN LEAST(GREATEST(min(enqueued_at), '4714-11-24 00:00:00+00 BC'),
                       '262142-12-31 23:59:59+00') END AS oldest,
       (SELECT count(*)::bigint FROM {schema}.{events} WHERE status = 'dead') AS dead,
       now() AS now
FROM {schema}.{events}
WHERE status = 'pending';
-- name: partitions
SELECT l.partition, l.owner, l.epoch, l.expires_at > now() AS live,
       coalesce(p.pending, 0)::bigint AS pending, p.oldest
FROM {schema}.leases l
LEFT JOIN (
    SELECT partition, count(*) AS pending,
           LEAST(GREATEST(min(enqueued_at), '4714-11-24 00:00:00+00 BC'),
                 '262142-12-31 23:59:59+00') AS oldest
    FROM {schema}.{events}
    WHERE status = 'pending'
    GROUP BY partition
) p ON p.partition = l.partition
ORDER BY l.partition;
-- name: modifications
SELECT n_mod_since_analyze, n_live_tup,
       extract(epoch FROM now() - greatest(last_analyze, last_autoanalyze))::double precision
FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname = $2;
-- name: analyze
ANALYZE {schema}.{events};
