-- The lowest version the aggregate holds (read after its state row is locked, in a statement
-- of its own: it sees every event held before the lock was taken).
-- $1 consumer, $2 aggregate type, $3 aggregate id
SELECT min(version) FROM {schema}.consumer_held
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND NOT dead
