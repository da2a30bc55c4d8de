-- The relay's statements on MySQL 8 / MariaDB 10.6+ (store.rs runs them). The same
-- semantics as PostgreSQL's (claim.sql, mark_published.sql, mark_failed.sql, leases.sql,
-- waiting.sql), in statements MySQL can run: no RETURNING, so a transaction reads the rows it
-- changes with a locking read first. `{ids}` and `{partitions}` stand for a list of `?`
-- placeholders (padded to a power of two, so that a handful of prepared statements serve
-- every batch size). Times in the lease, relay and hold tables are unix milliseconds from the
-- database's clock.
-- name: now_ms
SELECT {now_ms};
-- name: register
INSERT INTO {relays} (relay_id, hostname, started_at, heartbeat_at) VALUES (?, ?, ?, ?)
ON DUPLICATE KEY UPDATE heartbeat_at = VALUES(heartbeat_at);
-- name: live_relays
SELECT relay_id FROM {relays} WHERE heartbeat_at > ? ORDER BY relay_id;
-- name: forget_dead_relays
DELETE FROM {relays} WHERE heartbeat_at < ?;
-- name: deregister
DELETE FROM {relays} WHERE relay_id = ?;
-- name: renew
-- ? expires at, ? partition, ? epoch, ? owner. Rows matched (the connection reports found
-- rows, not changed ones): 1 while the lease is still this relay's.
UPDATE {leases} SET expires_at = ? WHERE `partition` = ? AND epoch = ? AND owner = ?;
-- name: free_leases
-- Free or expired leases, read without a lock (the lease table has no index on owner or
-- expiry: a locking scan would lock every other relay's live lease it passes). ? now
SELECT `partition` FROM {leases} WHERE owner IS NULL OR expires_at < ?
ORDER BY `partition`;
-- name: take_leases
-- The free leases found, locked by primary key for the acquire that follows, still free; a
-- lease another transaction holds a lock on (a takeover in progress, or its owner's fenced
-- write) is skipped, not waited for. {partitions}, ? now, ? how many
-- By primary key whatever the table's size (a scan of a small table would lock every row it
-- passes under REPEATABLE READ).
SELECT `partition` FROM {leases} FORCE INDEX (PRIMARY)
WHERE `partition` IN ({partitions}) AND (owner IS NULL OR expires_at < ?)
ORDER BY `partition` LIMIT ? FOR UPDATE SKIP LOCKED;
-- name: acquire
-- ? owner, ? expires at, ? now, {partitions} the leases locked by free_leases
UPDATE {leases} FORCE INDEX (PRIMARY)
SET owner = ?, epoch = epoch + 1, expires_at = ?, acquired_at = ?
WHERE `partition` IN ({partitions});
-- name: acquired
SELECT `partition`, epoch FROM {leases} WHERE `partition` IN ({partitions}) ORDER BY `partition`;
-- name: release
UPDATE {leases} SET owner = NULL, expires_at = 0 WHERE `partition` = ? AND epoch = ? AND owner = ?;
-- name: held
-- The lease fence, in the transaction of every write of event state: the share lock makes a
-- takeover (which updates the lease row) wait for this transaction, so a relay that lost its
-- lease can never overwrite its successor's work. ? partition, ? epoch, ? owner
SELECT `partition` FROM {leases} WHERE `partition` = ? AND epoch = ? AND owner = ?
LOCK IN SHARE MODE;
-- name: claim_scan
-- As PostgreSQL's claim.sql: pending rows that are not waiting, of each partition given from
-- its floor, in id order; a row behind a hold of its aggregate, behind an earlier waiting row,
-- or (with a floor) behind a pending row of its aggregate below the floor, comes back with
-- `behind` set (the store sets it waiting when a hold is there); a head whose retry is due
-- comes through its hold, with the pending rows after it. Lengths only, no payloads: the store
-- cuts the batch to its byte budget, then reads the rows it keeps (claim_rows).
-- One arm per partition (`claim_arm` once per partition, in place of the arms' placeholder), each a seek in the
-- claimable index (status, next_attempt_at, partition, id) from the partition's floor: a scan
-- in plain id order over all partitions looked up each row to filter its partition, and
-- walked the index entries rows published since left behind (InnoDB purges them later), 500,000
-- of them by the middle of a drain.
-- The checks are in the select list, not the WHERE clause: there MariaDB turns a NOT EXISTS
-- into a materialised anti-join over every pending row below the floor (2.3 s per claim at
-- 700,000 pending rows, instead of one index probe per row met). The floor check reads the
-- aggregate's first pending id (one index entry): as an EXISTS with `id < floor`, MariaDB
-- read every pending entry of the aggregate (85 per row at 100 events per aggregate).
-- the arms, ? limit, ? max payload, the partitions, ? now (ms), ? limit
SELECT x.id, x.behind, x.row_bytes FROM (
    (SELECT s.* FROM ({scan_arms}) s ORDER BY s.id LIMIT ?)
    UNION ALL
    (SELECT e.id, 0 AS behind, {row_bytes} AS row_bytes
     FROM {holds} h
     JOIN {events} hd ON hd.id = h.event_id AND hd.status = 'pending'
     JOIN {events} e
       ON e.aggregate_type = hd.aggregate_type AND e.aggregate_id = hd.aggregate_id
      AND e.status = 'pending' AND e.id >= hd.id
     WHERE h.`partition` IN ({partitions}) AND h.held_until IS NOT NULL AND h.held_until <= ?
       AND NOT EXISTS (
           SELECT 1 FROM {events} b
           WHERE b.aggregate_type = hd.aggregate_type AND b.aggregate_id = hd.aggregate_id
             AND b.status = 'pending' AND b.id < hd.id)
     ORDER BY e.id
     LIMIT ?)
) x
ORDER BY x.id;
-- name: claim_arm
-- One partition's scan in claim_scan. ? floor, ? floor, ? max payload, ? partition, ? floor,
-- ? limit
(SELECT e.id,
        (EXISTS (
             SELECT 1 FROM {holds} h
             WHERE h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
               AND h.event_id <= e.id)
         OR EXISTS (
             SELECT 1 FROM {events} w
             WHERE w.aggregate_type = e.aggregate_type AND w.aggregate_id = e.aggregate_id
               AND w.status = 'pending' AND w.id < e.id
               AND w.next_attempt_at IS NOT NULL)
         OR (? > 0 AND (
             SELECT b.id FROM {events} b
             WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
               AND b.status = 'pending'
             ORDER BY b.id LIMIT 1) < ?)) AS behind,
        {row_bytes} AS row_bytes
 FROM {events} e FORCE INDEX ({events}_claimable)
 WHERE e.status = 'pending' AND e.next_attempt_at IS NULL AND e.`partition` = ? AND e.id >= ?
 ORDER BY e.id
 LIMIT ?)
-- name: claim_rows
-- The rows a claim keeps. A payload over ? bytes is not loaded; headers over 64 KiB are not
-- either, and make the row unreadable (dead-lettered with the reason). Column sizes are
-- bounded by the table's types; an event id that is not a UUID is caught by the store.
SELECT e.id, e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version, e.event_type,
       e.schema_version, e.destination,
       CASE WHEN e.payload_bytes <= ? THEN e.payload END AS payload,
       CAST(e.payload_bytes AS SIGNED) AS payload_size, e.content_type,
       CASE WHEN e.headers_bytes <= 65536 THEN CAST(e.headers AS CHAR) ELSE '{}' END AS headers,
       CASE WHEN e.headers_bytes > 65536
            THEN CONCAT('headers are ', e.headers_bytes, ' bytes, over the limit of 65536')
       END AS unreadable,
       e.occurred_at, e.`partition`, e.attempts, e.permanent_failures
FROM {events} e
WHERE e.id IN ({ids}) AND e.status = 'pending'
ORDER BY e.id;
-- name: behind_held
-- The rows a claim met behind a hold that is still there, locked with the hold (in share
-- mode: a release that deletes the hold either comes first or sees the flag). {ids}
SELECT e.id FROM {events} e
JOIN {holds} h ON h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
WHERE e.id IN ({ids}) AND e.status = 'pending' AND e.next_attempt_at IS NULL
LOCK IN SHARE MODE;
-- name: set_waiting
UPDATE {events} SET next_attempt_at = '9999-12-31 00:00:00'
WHERE id IN ({ids}) AND status = 'pending' AND next_attempt_at IS NULL;
-- name: pending_of
-- The rows of a mark that are still pending in a partition this relay holds, locked.
-- the ids, then the partitions held
SELECT id, aggregate_type, aggregate_id, `partition` FROM {events}
WHERE id IN ({ids}) AND `partition` IN ({partitions}) AND status = 'pending'
ORDER BY id
FOR UPDATE;
-- name: mark_published
UPDATE {events}
SET status = 'published', published_at = UTC_TIMESTAMP(6),
    attempts = LEAST(attempts, 2147483646) + 1, next_attempt_at = NULL
WHERE id IN ({ids});
-- name: holds_on
-- The holds whose head event is among {ids} (just published), locked.
SELECT h.aggregate_type, h.aggregate_id FROM {holds} h
JOIN {events} e
  ON e.id = h.event_id AND e.aggregate_type = h.aggregate_type
 AND e.aggregate_id = h.aggregate_id
WHERE h.event_id IN ({ids})
FOR UPDATE;
-- name: unhold
DELETE FROM {holds} WHERE aggregate_type = ? AND aggregate_id = ?;
-- name: resume
-- Sets free the rows waiting behind a released hold. ? type, ? id
UPDATE {events} SET next_attempt_at = NULL
WHERE aggregate_type = ? AND aggregate_id = ? AND status = 'pending'
  AND next_attempt_at IS NOT NULL;
-- name: mark_failed
-- ? permanent (0/1), ? error, ? dead (0/1), ? dead (0/1), ? retry at (unix ms), ? id
UPDATE {events}
SET attempts = LEAST(attempts, 2147483646) + 1,
    permanent_failures = LEAST(permanent_failures, 2147483646) + ?,
    last_error = ?,
    status = CASE WHEN ? THEN 'dead' ELSE 'pending' END,
    next_attempt_at = CASE WHEN ? THEN NULL
                           ELSE {datetime_of_ms} END
WHERE id = ?;
-- name: parked_elsewhere
-- Whether aggregate (?, ?) is parked on a dead event other than row ? (see PostgreSQL's
-- mark_failed.sql: that park stays).
SELECT EXISTS (
    SELECT 1 FROM {holds} h JOIN {events} d ON d.id = h.event_id
    WHERE h.aggregate_type = ? AND h.aggregate_id = ? AND h.held_until IS NULL
      AND h.event_id <> ? AND d.status = 'dead');
-- name: wait_behind
-- The rest of a held or parked aggregate waits behind its head. ? type, ? id, ? head id
UPDATE {events} SET next_attempt_at = '9999-12-31 00:00:00'
WHERE aggregate_type = ? AND aggregate_id = ? AND status = 'pending'
  AND next_attempt_at IS NULL AND id > ?;
-- name: hold
INSERT INTO {holds} (aggregate_type, aggregate_id, `partition`, event_id, held_until, created_at)
VALUES (?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE event_id = VALUES(event_id), `partition` = VALUES(`partition`),
    held_until = VALUES(held_until), created_at = VALUES(created_at);
-- name: drop_stale_holds
-- A retry hold whose head is no longer pending. ? now (ms)
DELETE FROM {holds}
WHERE held_until IS NOT NULL AND held_until <= ?
  AND NOT EXISTS (
      SELECT 1 FROM {events} e WHERE e.id = {holds}.event_id AND e.status = 'pending');
-- name: release_stale
-- Waiting rows of aggregates without a hold (see PostgreSQL's waiting.sql).
UPDATE {events} e SET e.next_attempt_at = NULL
WHERE e.status = 'pending' AND e.next_attempt_at IS NOT NULL
  AND NOT EXISTS (
      SELECT 1 FROM {holds} h
      WHERE h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id);
-- name: backlog
-- The oldest pending row's wait in microseconds, by the database's clock and its arrival
-- (`enqueued_at`, set by the database), whatever the writer put in `occurred_at`. The column
-- takes NULL here (added without a table copy): a row a writer gave an explicit NULL counts
-- from its `occurred_at`, the only time it has, rather than not at all.
SELECT (SELECT count(*) FROM {events} WHERE status = 'pending'),
       TIMESTAMPDIFF(MICROSECOND,
                     CASE WHEN o.arrived IS NULL THEN o.undated
                          WHEN o.undated IS NULL THEN o.arrived
                          ELSE LEAST(o.arrived, o.undated) END,
                     UTC_TIMESTAMP(6)),
       (SELECT count(*) FROM {events} WHERE status = 'dead')
FROM (SELECT (SELECT min(enqueued_at) FROM {events} WHERE status = 'pending') AS arrived,
             (SELECT min(occurred_at) FROM {events}
              WHERE status = 'pending' AND enqueued_at IS NULL) AS undated) o;
-- name: partitions
-- Each partition's lease with its backlog. ? now (ms)
SELECT l.`partition`, l.owner, l.epoch, CAST(l.expires_at > ? AS SIGNED) AS live,
       CAST(COALESCE(c.pending, 0) AS SIGNED) AS pending,
       TIMESTAMPDIFF(MICROSECOND, c.oldest, UTC_TIMESTAMP(6)) AS oldest_wait_us
FROM {leases} l
LEFT JOIN (
    SELECT `partition`, count(*) AS pending, min(COALESCE(enqueued_at, occurred_at)) AS oldest
    FROM {events} WHERE status = 'pending' GROUP BY `partition`
) c ON c.`partition` = l.`partition`
ORDER BY l.`partition`;
