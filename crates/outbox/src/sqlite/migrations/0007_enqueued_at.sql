-- How long an event has waited in the outbox, by the database's clock: `enqueued_at` is set by
-- the database when the row is written. It is relay state (writers leave it out): the lag
-- gauge reads it, never the writer's `occurred_at`, which may lie far in the past (a backfill)
-- or ahead (a writer's skewed clock). Rows already written count from this migration.
--
-- SQLite adds a column with a computed default only by rebuilding the table: the rows are
-- copied with their ids, the id sequence is carried over (ids of purged rows are never
-- reused), and the indexes are made again under their names. The migration's transaction
-- makes the rebuild all or nothing.
CREATE TABLE {events}_rebuilt (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id           TEXT    NOT NULL UNIQUE,
    aggregate_type     TEXT    NOT NULL CHECK (aggregate_type <> ''),
    aggregate_id       TEXT    NOT NULL CHECK (aggregate_id <> ''),
    aggregate_version  INTEGER CHECK (aggregate_version >= 0),
    event_type         TEXT    NOT NULL CHECK (event_type <> ''),
    schema_version     INTEGER NOT NULL DEFAULT 1 CHECK (schema_version >= 1),
    destination        TEXT,
    payload            BLOB    NOT NULL,
    content_type       TEXT    NOT NULL DEFAULT 'application/json',
    headers            TEXT    NOT NULL DEFAULT '{}',
    occurred_at        TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    partition          INTEGER NOT NULL DEFAULT 0,
    status             TEXT    NOT NULL DEFAULT 'pending'
                               CHECK (status IN ('pending', 'published', 'dead')),
    attempts           INTEGER NOT NULL DEFAULT 0,
    next_attempt_at    TEXT,
    last_error         TEXT,
    published_at       TEXT,
    permanent_failures INTEGER NOT NULL DEFAULT 0,
    enqueued_at        TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
INSERT INTO {events}_rebuilt (
    id, event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
    destination, payload, content_type, headers, occurred_at, partition, status, attempts,
    next_attempt_at, last_error, published_at, permanent_failures
)
SELECT id, event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
       destination, payload, content_type, headers, occurred_at, partition, status, attempts,
       next_attempt_at, last_error, published_at, permanent_failures
FROM {events} ORDER BY id;
DELETE FROM sqlite_sequence WHERE name = '{events}_rebuilt';
INSERT INTO sqlite_sequence (name, seq)
    SELECT '{events}_rebuilt', seq FROM sqlite_sequence WHERE name = '{events}';
DROP TABLE {events};
ALTER TABLE {events}_rebuilt RENAME TO {events};
CREATE UNIQUE INDEX {events}_aggregate_version_key
    ON {events} (aggregate_type, aggregate_id, aggregate_version)
    WHERE aggregate_version IS NOT NULL;
CREATE INDEX {events}_pending_enqueued ON {events} (enqueued_at) WHERE status = 'pending';
CREATE INDEX {events}_pending_aggregate ON {events} (aggregate_type, aggregate_id, id)
    WHERE status = 'pending';
CREATE INDEX {events}_claimable ON {events} (partition, id)
    WHERE status = 'pending' AND next_attempt_at IS NULL;
CREATE INDEX {events}_waiting ON {events} (aggregate_type, aggregate_id, id)
    WHERE status = 'pending' AND next_attempt_at IS NOT NULL;
CREATE INDEX {events}_published_at ON {events} (published_at) WHERE status = 'published';
