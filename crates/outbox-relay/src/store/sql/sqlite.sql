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
SELECT e.id, e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version, e.event_type,
       e.schema_version, e.destination,
       CASE WHEN length(e.payload) <= ?3 THEN e.payload END AS payload,
       length(e.payload) AS payload_size,
       e.content_type, e.headers, e.occurred_at, e.partition, e.attempts
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
LIMIT ?2;
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
SET attempts = attempts + 1, last_error = ?2,
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
