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
-- As PostgreSQL's claim (postgres/sql/claim.sql and claim_columns.sql): pending rows that are not
-- waiting, from the floor ?5, in id order; a row behind a held head of its aggregate comes back
-- with `behind` set (the store sets it waiting, in a write transaction); a head whose retry is
-- due comes through its hold, with the pending rows after it. Payloads over ?3 bytes and text columns over their limit (4 KiB,
-- 64 KiB of headers) are not loaded, `unreadable` names the column; the rows claimed are cut
-- to the byte budget ?6 (the first always), `found` counts the rows met before the cut.
-- ?1 partitions, ?2 limit, ?3 max payload bytes, ?4 now (ms), ?5 floor, ?6 byte budget
WITH scanned AS (
    SELECT e.id,
           EXISTS (
               SELECT 1 FROM {holds} h
               WHERE h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
                 AND h.event_id <= e.id) AS behind
    FROM {events} e
    WHERE e.status = 'pending' AND e.next_attempt_at IS NULL
      AND e.partition IN (SELECT value FROM json_each(?1))
      AND e.id >= ?5
      AND NOT EXISTS (
          SELECT 1 FROM {events} w
          WHERE w.aggregate_type = e.aggregate_type AND w.aggregate_id = e.aggregate_id
            AND w.status = 'pending' AND w.next_attempt_at IS NOT NULL AND w.id < e.id)
      AND (?5 = 0 OR NOT EXISTS (
          SELECT 1 FROM {events} b
          WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
            AND b.status = 'pending' AND b.id < ?5))
    ORDER BY e.id
    LIMIT ?2
), due AS (
    -- Driven from the holds (few rows): CROSS JOIN is SQLite's way to fix the join order, and
    -- INDEXED BY its way to fix the index. With planner statistics (ANALYZE, PRAGMA optimize)
    -- and a plain JOIN, SQLite started from the events table and scanned all of it, or built
    -- an automatic index over it, on every claim (1.5 s instead of 11 ms at 60,000 rows).
    SELECT e.id, 0 AS behind
    FROM {holds} h
    CROSS JOIN {events} hd ON hd.id = h.event_id AND hd.status = 'pending'
    CROSS JOIN {events} e INDEXED BY {events}_pending_aggregate
      ON e.aggregate_type = hd.aggregate_type AND e.aggregate_id = hd.aggregate_id
     AND e.status = 'pending' AND e.id >= hd.id
    WHERE h.partition IN (SELECT value FROM json_each(?1))
      AND h.held_until IS NOT NULL AND h.held_until <= ?4
      AND NOT EXISTS (
          SELECT 1 FROM {events} b
          WHERE b.aggregate_type = hd.aggregate_type AND b.aggregate_id = hd.aggregate_id
            AND b.status = 'pending' AND b.id < hd.id)
    ORDER BY e.id
    LIMIT ?2
), picked AS (
    SELECT * FROM scanned UNION ALL SELECT * FROM due
)
SELECT * FROM (
SELECT x.*,
       sum(CASE WHEN x.behind THEN 0 ELSE x.row_bytes END) OVER (ORDER BY x.id) AS running,
       count(*) OVER () AS found
FROM (
SELECT e.id, e.event_id, p.behind,
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
FROM picked p CROSS JOIN {events} e ON e.id = p.id  -- the picked rows first, as in `due`
) x
) WHERE behind OR running - row_bytes < ?6
ORDER BY id;
-- name: flag_behind
-- Sets waiting the rows a claim met behind a held head (while the hold is there).
-- ?1 ids
UPDATE {events} SET next_attempt_at = 'infinity'
WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'
  AND next_attempt_at IS NULL
  AND EXISTS (
      SELECT 1 FROM {holds} h
      WHERE h.aggregate_type = {events}.aggregate_type
        AND h.aggregate_id = {events}.aggregate_id AND h.event_id <= {events}.id);
-- name: wait_behind
-- The rest of a held or parked aggregate waits behind its head. ?1 type, ?2 id, ?3 head id
UPDATE {events} SET next_attempt_at = 'infinity'
WHERE aggregate_type = ?1 AND aggregate_id = ?2 AND status = 'pending'
  AND next_attempt_at IS NULL AND id > ?3;
-- name: resume
-- Sets free the rows waiting behind a released hold. ?1 type, ?2 id
UPDATE {events} SET next_attempt_at = NULL
WHERE aggregate_type = ?1 AND aggregate_id = ?2 AND status = 'pending'
  AND next_attempt_at IS NOT NULL;
-- name: drop_stale_holds
-- A retry hold whose head is no longer pending. ?1 now (ms)
DELETE FROM {holds}
WHERE held_until IS NOT NULL AND held_until <= ?1
  AND NOT EXISTS (
      SELECT 1 FROM {events} e WHERE e.id = {holds}.event_id AND e.status = 'pending');
-- name: release_stale
-- Waiting rows of aggregates without a hold (see PostgreSQL's waiting.sql).
UPDATE {events} SET next_attempt_at = NULL
WHERE status = 'pending' AND next_attempt_at IS NOT NULL
  AND NOT EXISTS (
      SELECT 1 FROM {holds} h
      WHERE h.aggregate_type = {events}.aggregate_type
        AND h.aggregate_id = {events}.aggregate_id);
-- name: mark_published
UPDATE {events}
SET status = 'published', published_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
    attempts = min(attempts, 2147483646) + 1, next_attempt_at = NULL
WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'
RETURNING id, aggregate_type, aggregate_id;
-- name: release_holds
-- The holds whose head event was just published (?1: the ids marked, JSON), as PostgreSQL's
-- mark_published releases them, in one statement for the batch; returns their aggregates,
-- whose waiting rows are then set free.
DELETE FROM {holds}
WHERE event_id IN (SELECT value FROM json_each(?1))
  AND EXISTS (
      SELECT 1 FROM {events} e
      WHERE e.id = {holds}.event_id AND e.aggregate_type = {holds}.aggregate_type
        AND e.aggregate_id = {holds}.aggregate_id)
RETURNING aggregate_type, aggregate_id;
-- name: mark_failed
UPDATE {events}
SET attempts = min(attempts, 2147483646) + 1,
    permanent_failures = min(permanent_failures, 2147483646) + ?5, last_error = ?2,
    status = CASE WHEN ?3 THEN 'dead' ELSE 'pending' END,
    next_attempt_at = CASE WHEN ?3 THEN NULL
                           ELSE strftime('%Y-%m-%dT%H:%M:%fZ', ?4 / 1000.0, 'unixepoch') END
WHERE id = ?1 AND status = 'pending'
RETURNING aggregate_type, aggregate_id, partition;
-- name: parked_elsewhere
-- Whether aggregate (?1, ?2) is parked on a dead event other than row ?3 (see PostgreSQL's
-- mark_failed.sql: that park stays).
SELECT EXISTS (
    SELECT 1 FROM {holds} h JOIN {events} d ON d.id = h.event_id
    WHERE h.aggregate_type = ?1 AND h.aggregate_id = ?2 AND h.held_until IS NULL
      AND h.event_id <> ?3 AND d.status = 'dead');
-- name: hold
INSERT INTO {holds} (aggregate_type, aggregate_id, partition, event_id, held_until, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE
    SET event_id = excluded.event_id, partition = excluded.partition,
        held_until = excluded.held_until, created_at = excluded.created_at;
-- name: unhold
DELETE FROM {holds} WHERE aggregate_type = ?1 AND aggregate_id = ?2;
-- name: backlog
-- The oldest pending row's wait in microseconds, by the database's clock and its arrival
-- (`enqueued_at`, set by the database), whatever the writer put in `occurred_at`.
SELECT (SELECT count(*) FROM {events} WHERE status = 'pending'),
       (SELECT CAST(round((julianday('now') - julianday(min(enqueued_at))) * 86400e6) AS INTEGER)
        FROM {events} WHERE status = 'pending'),
       (SELECT count(*) FROM {events} WHERE status = 'dead');
-- name: partitions
-- The lease of each partition (one on SQLite) with its backlog. ?1 now (ms)
SELECT l.partition, l.owner, l.epoch, l.expires_at > ?1 AS live,
       (SELECT count(*) FROM {events} e
        WHERE e.status = 'pending' AND e.partition = l.partition) AS pending,
       (SELECT CAST(round((julianday('now') - julianday(min(e.enqueued_at))) * 86400e6)
                    AS INTEGER) FROM {events} e
        WHERE e.status = 'pending' AND e.partition = l.partition) AS oldest_wait_us
FROM {leases} l
ORDER BY l.partition;
