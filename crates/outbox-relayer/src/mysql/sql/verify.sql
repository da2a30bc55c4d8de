-- The reads of `outbox verify` (verify.rs asks, mysql/verify.rs answers).
-- name: now
SELECT UTC_TIMESTAMP(6);
-- name: lookup
-- The rows of the event ids listed at {ids}, each with whether it occurred in the window
-- (its start twice, then its end twice). CHAR(36) in a case-insensitive collation: either case
-- of an id matches. The keys' binary collation reaches the client as bytes: converted to text.
SELECT event_id, id, CONVERT(aggregate_type USING utf8mb4),
       CONVERT(aggregate_id USING utf8mb4),
       CAST((? IS NULL OR occurred_at >= ?) AND (? IS NULL OR occurred_at < ?) AS SIGNED)
FROM {events}
WHERE event_id IN ({ids});
-- name: scan
-- Every row that occurred in the window, in id order: whether published, and after the
-- audit began (bound first; then the window's start twice and its end twice).
SELECT id, event_id,
       CAST(status = 'published' AS SIGNED),
       CAST(IFNULL(status = 'published' AND published_at > ?, 0) AS SIGNED)
FROM {events}
WHERE (? IS NULL OR occurred_at >= ?) AND (? IS NULL OR occurred_at < ?)
ORDER BY id;
