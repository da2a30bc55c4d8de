-- The aggregates of a consumer that hold events and have applied none (a consumer that
-- started late: their first versions are no longer delivered), with their lowest held
-- version.
-- $1 consumer, $2 aggregate type (NULL: any), $3 limit, $4 aggregate id (NULL: any)
SELECT v.aggregate_type, v.aggregate_id,
       (SELECT min(version) FROM {schema}.consumer_held h
        WHERE h.consumer = v.consumer AND h.aggregate_type = v.aggregate_type
          AND h.aggregate_id = v.aggregate_id AND NOT h.dead) AS lowest_held
FROM {schema}.consumer_versions v
WHERE v.consumer = $1 AND v.version IS NULL AND v.held > 0
  AND ($2::text IS NULL OR v.aggregate_type = $2)
  AND ($4::text IS NULL OR v.aggregate_id = $4)
ORDER BY v.aggregate_type, v.aggregate_id
LIMIT $3
