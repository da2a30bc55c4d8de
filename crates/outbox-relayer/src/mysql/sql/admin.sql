-- The operator actions of `postgres/sql/admin.sql` on a MySQL or MariaDB outbox, with the same results.
-- Times in the holds table are unix milliseconds. `{ids}` stands for a list of `?`
-- placeholders (see sql/store.sql).
-- name: purgeable
-- ? the retention in microseconds
SELECT count(*) FROM {events}
WHERE status = 'published' AND published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND;
-- name: purge_batch
-- One batch of published rows older than the retention, oldest first (never pending or dead
-- rows), read without a lock: the statements that archive and delete them lock them by
-- primary key only. A locking read here would take a next-key lock on the first published
-- entry of the `published_at` index, the gap every new pending row's entry goes into, and
-- every application insert would wait for the batch. A `DELETE ... ORDER BY published_at
-- LIMIT` sorted every published row on each batch (MariaDB read them through another index
-- and filesorted): 600 rows/s at 1,000,000 rows. ? retention (µs), ? batch size
SELECT id FROM {events}
WHERE status = 'published' AND published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
ORDER BY published_at
LIMIT ?;
-- name: lock_batch
-- The rows of a batch still published, locked by primary key. {ids}
SELECT id FROM {events} FORCE INDEX (PRIMARY)
WHERE id IN ({ids}) AND status = 'published'
ORDER BY id
FOR UPDATE;
-- name: archive
INSERT INTO {events}_archive (
    id, event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
    destination, payload, content_type, headers, occurred_at, `partition`, status, attempts,
    permanent_failures, next_attempt_at, last_error, published_at)
SELECT id, event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
       schema_version, destination, payload, content_type, headers, occurred_at, `partition`,
       status, attempts, permanent_failures, next_attempt_at, last_error, published_at
FROM {events} FORCE INDEX (PRIMARY)
WHERE id IN ({ids}) AND status = 'published';
-- name: delete_batch
DELETE FROM {events} WHERE id IN ({ids}) AND status = 'published';
-- name: list_dead
-- Every column bounded (the limits are admin/listing.rs's, one character more than it shows
-- so that it can tell a cut): text and the error cut, headers read only when small enough
-- (`headers_size` says how large they are), the payload not read (its size only).
-- ? event type (twice), ? aggregate type (twice), ? aggregate id (twice), ? since (twice),
-- ? until (twice), ? error text (twice), ? ids as a JSON array (twice), ? limit
SELECT e.id, LEFT(e.event_id, {text_read}) AS event_id,
       LEFT(e.aggregate_type, {text_read}) AS aggregate_type,
       LEFT(e.aggregate_id, {text_read}) AS aggregate_id, e.aggregate_version,
       LEFT(e.event_type, {text_read}) AS event_type, e.schema_version,
       LEFT(e.destination, {text_read}) AS destination,
       LEFT(e.content_type, {text_read}) AS content_type,
       CASE WHEN e.headers_bytes <= {headers_read} THEN CAST(e.headers AS CHAR) END AS headers,
       e.headers_bytes AS headers_size,
       e.occurred_at, e.attempts, LEFT(COALESCE(e.last_error, ''), {error_read}) AS last_error,
       e.payload_bytes AS payload_size,
       CAST(EXISTS (SELECT 1 FROM {holds} h
                    WHERE h.event_id = e.id AND h.held_until IS NULL) AS SIGNED) AS parked
FROM {events} e
WHERE e.status = 'dead'
  AND (? IS NULL OR e.event_type = ?)
  AND (? IS NULL OR e.aggregate_type = ?)
  AND (? IS NULL OR e.aggregate_id = ?)
  AND (? IS NULL OR e.occurred_at >= ?)
  AND (? IS NULL OR e.occurred_at < ?)
  AND (? IS NULL OR LOCATE(LOWER(?), LOWER(COALESCE(e.last_error, ''))) > 0)
  AND (? IS NULL OR JSON_CONTAINS(?, CAST(e.id AS CHAR)))
ORDER BY e.id
LIMIT ?;
-- name: payload
SELECT payload FROM {events} WHERE id = ?;
-- name: dead_of
-- The dead rows among {ids} to replay, locked: all but those before the dead event their
-- aggregate is parked on, when the replay leaves that one dead (see `replay` in
-- postgres/sql/admin.sql: the park records one dead event per aggregate).
SELECT e.id FROM {events} e
WHERE e.id IN ({ids}) AND e.status = 'dead'
  AND NOT EXISTS (
      SELECT 1 FROM {holds} h
      JOIN {events} d ON d.id = h.event_id
      WHERE h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
        AND h.held_until IS NULL AND d.status = 'dead' AND h.event_id > e.id
        AND d.aggregate_type = h.aggregate_type AND d.aggregate_id = h.aggregate_id
        AND h.event_id NOT IN ({ids})
  )
ORDER BY e.id FOR UPDATE;
-- name: replay
-- Dead events become pending again, attempts and permanent failures reset, their wait
-- (the lag gauge's) counted from now. {ids}
UPDATE {events}
SET status = 'pending', attempts = 0, permanent_failures = 0, next_attempt_at = NULL,
    enqueued_at = UTC_TIMESTAMP(6)
WHERE id IN ({ids}) AND status = 'dead';
-- name: still_dead
-- The dead rows among {ids} (after a replay: those it left dead).
SELECT id FROM {events} WHERE id IN ({ids}) AND status = 'dead' ORDER BY id;
-- name: hold_heads
-- Each aggregate of the replayed rows {ids} gets its hold on its first pending row (a
-- replayed one, or one pending before), due at once: it resumes with that row, in id order,
-- through the claim's due path. As on PostgreSQL, a hold moves rather than goes: it is the
-- record that the aggregate has events waiting in the table. An aggregate parked on a dead
-- event the replay left dead stays parked.
INSERT INTO {holds} (aggregate_type, aggregate_id, `partition`, event_id, held_until, created_at)
SELECT head.aggregate_type, head.aggregate_id, head.`partition`, head.id,
       {now_ms}, {now_ms}
FROM (SELECT DISTINCT aggregate_type, aggregate_id FROM {events} WHERE id IN ({ids})) r
JOIN {events} head ON head.id = (
    SELECT min(f.id) FROM {events} f
    WHERE f.aggregate_type = r.aggregate_type AND f.aggregate_id = r.aggregate_id
      AND f.status = 'pending')
WHERE NOT EXISTS (
    SELECT 1 FROM {holds} h
    JOIN {events} d ON d.id = h.event_id
    WHERE h.aggregate_type = r.aggregate_type AND h.aggregate_id = r.aggregate_id
      AND h.held_until IS NULL AND d.status = 'dead'
      AND d.aggregate_type = h.aggregate_type AND d.aggregate_id = h.aggregate_id
)
ON DUPLICATE KEY UPDATE event_id = VALUES(event_id), `partition` = VALUES(`partition`),
    held_until = VALUES(held_until), created_at = VALUES(created_at);
-- name: skip_targets
-- The holds of dead rows among {ids}: those rows park their aggregates. Locked.
SELECT h.aggregate_type, h.aggregate_id, h.event_id
FROM {holds} h
JOIN {events} e ON e.id = h.event_id
WHERE h.event_id IN ({ids}) AND e.status = 'dead'
  AND e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id
ORDER BY h.event_id
FOR UPDATE;
-- name: first_pending
-- The first pending row of aggregate (?, ?), if any.
SELECT id, `partition` FROM {events}
WHERE aggregate_type = ? AND aggregate_id = ? AND status = 'pending'
ORDER BY id LIMIT 1;
-- name: move_hold
-- The hold of aggregate (?, ?) moves to row ? of partition ?, due at once.
UPDATE {holds}
SET event_id = ?, `partition` = ?,
    held_until = {now_ms},
    created_at = {now_ms}
WHERE aggregate_type = ? AND aggregate_id = ?;
-- name: drop_hold
DELETE FROM {holds} WHERE aggregate_type = ? AND aggregate_id = ?;
-- name: record
-- ? actor, ? action, ? row ids (JSON array), ? reason
INSERT INTO {audit} (actor, action, event_ids, reason) VALUES (?, ?, ?, ?);
-- name: audit
SELECT id, at, actor, action, CAST(event_ids AS CHAR) AS event_ids, reason
FROM {audit} ORDER BY id DESC LIMIT ?;
