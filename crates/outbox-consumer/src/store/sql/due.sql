-- Aggregates (and events without one: `lone`) with a held event due now, and given-up events
-- whose dead letter is still to be stored (`dead`), the longest due first.
-- $1 consumer, $2 limit
SELECT aggregate_type, aggregate_id,
       CASE WHEN aggregate_type IS NULL OR dead THEN id END AS lone,
       dead
FROM {schema}.consumer_held
WHERE consumer = $1 AND next_attempt_at <= now()
GROUP BY 1, 2, 3, 4
ORDER BY min(next_attempt_at)
LIMIT $2
