-- The reads of `outbox verify` (verify.rs asks, sqlite/verify.rs answers).
-- name: now
SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now');
-- name: lookup
-- The rows of the event ids listed at {ids}, each with whether it occurred in [?1, ?2).
SELECT CAST(event_id AS TEXT), id, aggregate_type, aggregate_id,
       (?1 IS NULL OR julianday(occurred_at) >= julianday(?1))
       AND (?2 IS NULL OR julianday(occurred_at) < julianday(?2))
FROM {events}
WHERE event_id IN ({ids});
-- name: scan
-- Every row that occurred in [?1, ?2), in id order: whether published, and after ?3.
SELECT id, CAST(event_id AS TEXT),
       status = 'published',
       IFNULL(status = 'published' AND julianday(published_at) > julianday(?3), 0)
FROM {events}
WHERE (?1 IS NULL OR julianday(occurred_at) >= julianday(?1))
  AND (?2 IS NULL OR julianday(occurred_at) < julianday(?2))
ORDER BY id;
