-- The operator actions of `postgres/sql/admin.sql` on a SQLite outbox, with the same results. Times in
-- the holds table are unix milliseconds; `published_at` is the relay's RFC 3339 text.
-- name: purgeable
-- ?1 the age as a date modifier ('-3600.000 seconds')
SELECT count(*) FROM {events}
WHERE status = 'published' AND published_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?1)
  AND julianday(published_at) IS NOT NULL;
-- name: purge
-- One batch of published rows older than the retention, oldest first; never pending or dead
-- rows, never a row whose published_at is not a time. ?1 age modifier, ?2 batch size
DELETE FROM {events} WHERE id IN (
    SELECT id FROM {events}
    WHERE status = 'published' AND published_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?1)
      AND julianday(published_at) IS NOT NULL
    ORDER BY published_at
    LIMIT ?2);
-- name: archive_batch
-- The ids `purge` would delete, for the archive's two statements. ?1 age modifier, ?2 batch
SELECT id FROM {events}
WHERE status = 'published' AND published_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?1)
  AND julianday(published_at) IS NOT NULL
ORDER BY published_at
LIMIT ?2;
-- name: archive
-- ?1 ids (JSON array)
INSERT INTO {events}_archive (
    id, event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
    destination, payload, content_type, headers, occurred_at, partition, status, attempts,
    next_attempt_at, last_error, published_at, permanent_failures)
SELECT id, event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
       schema_version, destination, payload, content_type, headers, occurred_at, partition,
       status, attempts, next_attempt_at, last_error, published_at, permanent_failures
FROM {events}
WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'published';
-- name: delete_archived
-- ?1 ids (JSON array)
DELETE FROM {events} WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'published';
-- name: list_dead
-- SQLite keeps whatever a writer gives, in any type: the text columns are read as bytes (the
-- relay shows invalid UTF-8 replaced) and the numbers cast, so that the list never fails on
-- the very rows it must show. Every column bounded (the limits are admin/listing.rs's): text
-- cut to as many bytes as its characters can take, and a byte more; the time to 64 bytes
-- (a longer one is no time); headers read only when small enough (`headers_size` says how
-- large they are); the payload not read (its size only).
-- ?1 event type, ?2 aggregate type, ?3 aggregate id, ?4 since,
-- ?5 until (RFC 3339), ?6 error text, ?7 limit, ?8 ids (JSON array)
SELECT e.id, substr(CAST(e.event_id AS BLOB), 1, {text_read_bytes}) AS event_id,
       substr(CAST(e.aggregate_type AS BLOB), 1, {text_read_bytes}) AS aggregate_type,
       substr(CAST(e.aggregate_id AS BLOB), 1, {text_read_bytes}) AS aggregate_id,
       CAST(e.aggregate_version AS INTEGER) AS aggregate_version,
       substr(CAST(e.event_type AS BLOB), 1, {text_read_bytes}) AS event_type,
       CAST(e.schema_version AS INTEGER) AS schema_version,
       substr(CAST(e.destination AS BLOB), 1, {text_read_bytes}) AS destination,
       substr(CAST(e.content_type AS BLOB), 1, {text_read_bytes}) AS content_type,
       CASE WHEN length(CAST(coalesce(e.headers, '') AS BLOB)) <= {headers_read}
            THEN CAST(coalesce(e.headers, '') AS BLOB) END AS headers,
       length(CAST(coalesce(e.headers, '') AS BLOB)) AS headers_size,
       substr(CAST(e.occurred_at AS BLOB), 1, 64) AS occurred_at,
       CAST(e.attempts AS INTEGER) AS attempts,
       substr(CAST(coalesce(e.last_error, '') AS BLOB), 1, 4 * {error_read}) AS last_error,
       length(CAST(e.payload AS BLOB)) AS payload_size,
       EXISTS (SELECT 1 FROM {holds} h
               WHERE h.event_id = e.id AND h.held_until IS NULL) AS parked
FROM {events} e
WHERE e.status = 'dead'
  AND (?1 IS NULL OR e.event_type = ?1)
  AND (?2 IS NULL OR e.aggregate_type = ?2)
  AND (?3 IS NULL OR e.aggregate_id = ?3)
  AND (?4 IS NULL OR julianday(e.occurred_at) >= julianday(?4))
  AND (?5 IS NULL OR julianday(e.occurred_at) < julianday(?5))
  AND (?6 IS NULL OR instr(lower(e.last_error), lower(?6)) > 0)
  AND (?8 IS NULL OR e.id IN (SELECT value FROM json_each(?8)))
ORDER BY e.id
LIMIT ?7;
-- name: payload
SELECT CAST(payload AS BLOB) FROM {events} WHERE id = ?1;
-- name: replay
-- Dead events become pending again, attempts and permanent failures reset, their wait
-- (the lag gauge's) counted from now, all but those
-- before the dead event their aggregate is parked on, when the replay leaves that one dead
-- (see `replay` in postgres/sql/admin.sql: the park records one dead event per aggregate). ?1 ids (JSON)
UPDATE {events}
SET status = 'pending', attempts = 0, permanent_failures = 0, next_attempt_at = NULL,
    enqueued_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'dead'
  AND NOT EXISTS (
      SELECT 1 FROM {holds} h
      JOIN {events} d ON d.id = h.event_id
      WHERE h.aggregate_type = {events}.aggregate_type
        AND h.aggregate_id = {events}.aggregate_id
        AND h.held_until IS NULL AND d.status = 'dead' AND h.event_id > {events}.id
        AND d.aggregate_type = h.aggregate_type AND d.aggregate_id = h.aggregate_id
        AND h.event_id NOT IN (SELECT value FROM json_each(?1))
  )
RETURNING id;
-- name: still_dead
-- The dead rows among ?1 (JSON ids; after a replay: those it left dead).
SELECT id FROM {events} WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'dead'
ORDER BY id;
-- name: hold_heads
-- Each aggregate of the replayed rows ?1 gets its hold on its first pending row (a replayed
-- one, or one pending before), due at once: it resumes with that row, in id order, through
-- the claim's due path. As on PostgreSQL, a hold moves rather than goes: it is the record
-- that the aggregate has events waiting in the table. An aggregate parked on a dead event
-- the replay left dead stays parked.
INSERT INTO {holds} (aggregate_type, aggregate_id, partition, event_id, held_until, created_at)
SELECT head.aggregate_type, head.aggregate_id, head.partition, head.id,
       CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
       CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
FROM (SELECT DISTINCT aggregate_type, aggregate_id FROM {events}
      WHERE id IN (SELECT value FROM json_each(?1))) r
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
ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE
    SET event_id = excluded.event_id, partition = excluded.partition,
        held_until = excluded.held_until, created_at = excluded.created_at;
-- name: skip_targets
-- The holds of dead rows among ?1 (JSON ids): those rows park their aggregates.
SELECT h.aggregate_type, h.aggregate_id, h.event_id
FROM {holds} h
JOIN {events} e ON e.id = h.event_id
WHERE h.event_id IN (SELECT value FROM json_each(?1)) AND e.status = 'dead'
  AND e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id
ORDER BY h.event_id;
-- name: move_hold
-- The hold of aggregate (?1, ?2) moves to its first pending row, due at once; nothing when
-- none of its rows is pending (the caller then drops the hold).
UPDATE {holds}
SET (event_id, partition) = (
        SELECT f.id, f.partition FROM {events} f
        WHERE f.aggregate_type = ?1 AND f.aggregate_id = ?2 AND f.status = 'pending'
        ORDER BY f.id LIMIT 1),
    held_until = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
    created_at = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
WHERE aggregate_type = ?1 AND aggregate_id = ?2
  AND EXISTS (SELECT 1 FROM {events} f
              WHERE f.aggregate_type = ?1 AND f.aggregate_id = ?2 AND f.status = 'pending')
RETURNING event_id;
-- name: drop_hold
DELETE FROM {holds} WHERE aggregate_type = ?1 AND aggregate_id = ?2;
-- name: record
-- ?1 actor, ?2 action, ?3 row ids (JSON array), ?4 reason
INSERT INTO {audit} (actor, action, event_ids, reason) VALUES (?1, ?2, ?3, ?4);
-- name: audit
SELECT id, at, actor, action, event_ids, reason FROM {audit} ORDER BY id DESC LIMIT ?1;
