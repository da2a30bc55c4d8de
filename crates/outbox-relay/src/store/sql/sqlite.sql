-- name: now_ms
SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER);
-- name: register
INSERT INTO {relays} (relay_id, hostname, started_at, heartbeat_at) VALUES (?1, ?2, ?3, ?3)
ON CONFLICT (relay_id) DO UPDATE SET heartbeat_at = ?3;
-- name: live_relays
SELECT relay_id FROM {relays} WHERE heartbeat_at > ?1 ORDER BY relay_id;
-- name: forget_dead_relays
DELETE FROM {relays} WHERE heartbeat_at < ?1;
-- name: deregister
DELETE FROM {relays} WHERE relay_id = ?1;
-- name: renew
UPDATE {leases} SET expires_at = ?3 WHERE partition = ?1 AND epoch = ?2 AND owner = ?4
RETURNING partition;
-- name: acquire
UPDATE {leases} SET owner = ?2, epoch = epoch + 1, expires_at = ?3, acquired_at = ?4
WHERE partition IN (
    SELECT partition FROM {leases} WHERE owner IS NULL OR expires_at < ?4
    ORDER BY partition LIMIT ?1)
RETURNING partition, epoch;
-- name: release
UPDATE {leases} SET owner = NULL, expires_at = 0 WHERE partition = ?1 AND epoch = ?2 AND owner = ?3;
-- name: held
SELECT count(*) FROM {leases} WHERE partition = ?1 AND epoch = ?2 AND owner = ?3;
-- name: claim
-- As PostgreSQL's claim (store/sql/claim.sql and claim_columns.sql): payloads over ?3 bytes and
-- text columns over their limit (4 KiB, 64 KiB of headers) are not loaded, `unreadable` names
-- the column; the batch is cut to the byte budget ?6 (the first row always), `found` counts
-- the rows found before the cut.
-- ?1 partitions, ?2 limit, ?3 max payload bytes, ?4 now (ms), ?5 floor, ?6 byte budget
SELECT * FROM (
SELECT x.*, sum(x.row_bytes) OVER (ORDER BY x.id) AS running, count(*) OVER () AS found
FROM (
SELECT e.id, e.event_id,
       CASE WHEN length(e.aggregate_type) <= 4096 THEN e.aggregate_type
            ELSE 'oversized:' || substr(e.aggregate_type, 1, 64) || ':' || length(e.aggregate_type)
            END AS aggregate_type,
       CASE WHEN length(e.aggregate_id) <= 4096 THEN e.aggregate_id
            ELSE 'oversized:' || substr(e.aggregate_id, 1, 64) || ':' || length(e.aggregate_id)
            END AS aggregate_id,
       e.aggregate_version,
       CASE WHEN length(e.event_type) <= 4096 THEN e.event_type ELSE '' END AS event_type,
       e.schema_version,
       CASE WHEN length(e.destination) <= 4096 THEN e.destination END AS destination,
       CASE WHEN length(e.payload) <= ?3 THEN e.payload END AS payload,
       length(e.payload) AS payload_size,
       CASE WHEN length(e.content_type) <= 4096 THEN e.content_type ELSE '' END AS content_type,
       CASE WHEN length(e.headers) <= 65536 THEN e.headers ELSE '{}' END AS headers,
       CASE WHEN length(e.aggregate_type) > 4096
                THEN 'aggregate_type is ' || length(e.aggregate_type)
                     || ' characters, over the limit of 4096'
            WHEN length(e.aggregate_id) > 4096
                THEN 'aggregate_id is ' || length(e.aggregate_id)
                     || ' characters, over the limit of 4096'
            WHEN length(e.event_type) > 4096
                THEN 'event_type is ' || length(e.event_type) || ' characters, over the limit of 4096'
            WHEN length(e.destination) > 4096
                THEN 'destination is ' || length(e.destination)
                     || ' characters, over the limit of 4096'
            WHEN length(e.content_type) > 4096
                THEN 'content_type is ' || length(e.content_type)
                     || ' characters, over the limit of 4096'
            WHEN length(e.headers) > 65536
                THEN 'headers are ' || length(e.headers) || ' characters, over the limit of 65536'
       END AS unreadable,
       e.occurred_at, e.partition, e.attempts, e.permanent_failures,
       (CASE WHEN length(e.payload) <= ?3 THEN length(e.payload) ELSE 0 END
        + min(length(e.headers), 65536) + min(length(e.aggregate_type), 4096)
        + min(length(e.aggregate_id), 4096) + min(length(e.event_type), 4096)
        + min(length(e.content_type), 4096) + coalesce(min(length(e.destination), 4096), 0))
           AS row_bytes
FROM {events} e
WHERE e.status = 'pending'
  AND e.partition IN (SELECT value FROM json_each(?1))
  AND e.id >= ?5
  AND NOT EXISTS (
      SELECT 1 FROM {holds} h
      WHERE h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
        AND (h.held_until IS NULL OR h.held_until > ?4))
  AND (?5 = 0 OR NOT EXISTS (
      SELECT 1 FROM {events} b
      WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
        AND b.status = 'pending' AND b.id < ?5))
ORDER BY e.id
LIMIT ?2
) x
) WHERE running - row_bytes < ?6
ORDER BY id;
-- name: mark_published
UPDATE {events}
SET status = 'published', published_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
    attempts = attempts + 1, next_attempt_at = NULL
WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'
RETURNING id, aggregate_type, aggregate_id;
-- name: release_hold
DELETE FROM {holds} WHERE aggregate_type = ?1 AND aggregate_id = ?2 AND event_id = ?3;
-- name: mark_failed
UPDATE {events}
SET attempts = attempts + 1, permanent_failures = permanent_failures + ?5, last_error = ?2,
    status = CASE WHEN ?3 THEN 'dead' ELSE 'pending' END,
    next_attempt_at = CASE WHEN ?3 THEN NULL
                           ELSE strftime('%Y-%m-%dT%H:%M:%fZ', ?4 / 1000.0, 'unixepoch') END
WHERE id = ?1 AND status = 'pending'
RETURNING aggregate_type, aggregate_id, partition;
-- name: hold
INSERT INTO {holds} (aggregate_type, aggregate_id, partition, event_id, held_until, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE
    SET event_id = excluded.event_id, partition = excluded.partition,
        held_until = excluded.held_until, created_at = excluded.created_at;
-- name: unhold
DELETE FROM {holds} WHERE aggregate_type = ?1 AND aggregate_id = ?2;
-- name: backlog
SELECT (SELECT count(*) FROM {events} WHERE status = 'pending'),
       (SELECT min(occurred_at) FROM {events} WHERE status = 'pending'),
       (SELECT count(*) FROM {events} WHERE status = 'dead');
