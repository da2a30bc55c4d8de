-- The statement of `SqliteOutbox`, rendered with the outbox's table names.
-- name: insert
-- One event; an event without its own time takes the database's clock, in UTC.
INSERT INTO {events} (event_id, aggregate_type, aggregate_id, aggregate_version,
    event_type, schema_version, destination, payload, content_type, headers, occurred_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, COALESCE(?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')));
