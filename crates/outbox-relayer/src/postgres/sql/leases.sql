-- name: register
INSERT INTO {schema}.relays (relay_id, hostname) VALUES ($1, $2)
ON CONFLICT (relay_id) DO UPDATE SET heartbeat_at = now();
-- name: live_relays
SELECT relay_id FROM {schema}.relays
WHERE heartbeat_at > now() - make_interval(secs => $1)
ORDER BY relay_id;
-- name: forget_dead_relays
DELETE FROM {schema}.relays WHERE heartbeat_at < now() - make_interval(secs => $1 * 10);
-- name: deregister
DELETE FROM {schema}.relays WHERE relay_id = $1;
-- name: renew
-- The rows locked in partition order first (see fence.sql), then updated.
WITH locked AS (
    SELECT l.partition
    FROM {schema}.leases l
    JOIN unnest($1::integer[], $2::bigint[]) AS f(partition, epoch)
      ON l.partition = f.partition AND l.epoch = f.epoch
    WHERE l.owner = $3
    ORDER BY l.partition
    FOR UPDATE OF l
)
UPDATE {schema}.leases l SET expires_at = now() + make_interval(secs => $4)
FROM locked
WHERE l.partition = locked.partition
RETURNING l.partition;
-- name: acquire
WITH candidate AS (
    SELECT partition FROM {schema}.leases
    WHERE owner IS NULL OR expires_at < now()
    ORDER BY partition
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.leases l
SET owner = $2, epoch = l.epoch + 1, expires_at = now() + make_interval(secs => $3),
    acquired_at = now()
FROM candidate
WHERE l.partition = candidate.partition
RETURNING l.partition, l.epoch;
-- name: release
-- The rows locked in partition order first (see fence.sql), then updated.
WITH locked AS (
    SELECT l.partition
    FROM {schema}.leases l
    JOIN unnest($1::integer[], $2::bigint[]) AS f(partition, epoch)
      ON l.partition = f.partition AND l.epoch = f.epoch
    WHERE l.owner = $3
    ORDER BY l.partition
    FOR UPDATE OF l
)
UPDATE {schema}.leases l SET owner = NULL, expires_at = '-infinity'
FROM locked
WHERE l.partition = locked.partition;
-- name: acquire_all
-- Takes every partition lease at once, or none: the streamer of a slot must own the whole
-- outbox. Rows are locked in partition order (no deadlock between standbys). $1 relay id,
-- $2 TTL seconds.
WITH locked AS (
    SELECT partition, owner, expires_at FROM {schema}.leases ORDER BY partition FOR UPDATE
), free AS (
    SELECT NOT EXISTS (
        SELECT 1 FROM locked WHERE owner IS NOT NULL AND owner <> $1 AND expires_at >= now()
    ) AS ok
)
UPDATE {schema}.leases l
SET owner = $1, epoch = l.epoch + 1, expires_at = now() + make_interval(secs => $2),
    acquired_at = now()
FROM free
WHERE free.ok
RETURNING l.partition, l.epoch;
