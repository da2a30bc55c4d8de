-- The statements of `SqliteInbox`, rendered with the outbox's table names.
-- name: record
INSERT INTO {inbox} (consumer, event_id, event_type) VALUES (?, ?, ?)
ON CONFLICT (consumer, event_id) DO NOTHING;
-- name: purge
-- At most ? rows older than the modifier ? ('-N seconds').
DELETE FROM {inbox} WHERE rowid IN (SELECT rowid FROM {inbox}
    WHERE processed_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?1) LIMIT ?2);
