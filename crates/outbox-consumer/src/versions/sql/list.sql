-- A consumer's aggregates: the version state of each, with what it holds (the held event
-- looked at next first), those holding events first, then the most recently changed.
-- $1 consumer, $2 aggregate type (NULL: any), $3 aggregate id (NULL: any), $4 only those
-- holding events, $5 limit
SELECT v.aggregate_type, v.aggregate_id, v.version, v.first_version, v.seeded, v.held,
       v.updated_at,
       extract(epoch FROM now() - h.oldest)::float8 AS oldest_held_seconds,
       h.reason
FROM {schema}.consumer_versions v
LEFT JOIN LATERAL (
    SELECT min(held_at) AS oldest,
           (array_agg(reason ORDER BY version NULLS LAST, id))[1] AS reason
    FROM {schema}.consumer_held
    WHERE consumer = v.consumer AND aggregate_type = v.aggregate_type
      AND aggregate_id = v.aggregate_id AND NOT dead
) h ON true
WHERE v.consumer = $1
  AND ($2::text IS NULL OR v.aggregate_type = $2)
  AND ($3::text IS NULL OR v.aggregate_id = $3)
  AND (NOT $4 OR v.held > 0)
ORDER BY v.held > 0 DESC, v.updated_at DESC
LIMIT $5
