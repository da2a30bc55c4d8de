-- The reads of `outbox verify` (verify.rs asks, postgres/verify.rs answers).
-- name: now
SELECT now();
-- name: lookup
-- The rows of the event ids $1 (text), each with whether it occurred in [$2, $3).
SELECT event_id::text, id, aggregate_type, aggregate_id,
       ($2::timestamptz IS NULL OR occurred_at >= $2)
       AND ($3::timestamptz IS NULL OR occurred_at < $3)
FROM {schema}.{events}
WHERE event_id = ANY($1::text[]::uuid[]);
-- name: scan
-- Every row that occurred in [$1, $2), in id order: whether published, and after $3.
SELECT id, event_id::text, status = 'published',
       COALESCE(status = 'published' AND published_at > $3, false)
FROM {schema}.{events}
WHERE ($1::timestamptz IS NULL OR occurred_at >= $1)
  AND ($2::timestamptz IS NULL OR occurred_at < $2)
ORDER BY id;
-- name: has_cdc
SELECT EXISTS (SELECT 1 FROM {schema}.cdc_slots);
