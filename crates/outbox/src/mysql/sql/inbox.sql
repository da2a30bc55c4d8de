-- The statements of `MySqlInbox`, rendered with the outbox's table names.
-- name: record
-- IGNORE turns only the duplicate key into "no row": the consumer name, the message id and
-- the event type are checked first (non-empty, at most 255 characters), so no other error
-- can be ignored.
INSERT IGNORE INTO {inbox} (consumer, event_id, event_type) VALUES (?, ?, ?);
-- name: purgeable
-- The keys of a batch of rows older than the retention (µs), read without a lock: a locking
-- range scan on `processed_at` would lock the gap new rows go into (under REPEATABLE READ)
-- and make every consumer's insert wait. ? retention (µs), ? batch size
SELECT consumer, event_id FROM {inbox}
WHERE processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
ORDER BY processed_at LIMIT ?;
-- name: delete
-- One row of a batch, by primary key, if still older than the retention.
DELETE FROM {inbox} WHERE consumer = ? AND event_id = ?
AND processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND;
